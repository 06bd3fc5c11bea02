"""Decoder blocks: pre-norm residual, and the parallel-residual variant.

`decode` is passed through to attention, which owns the KV cache.
"""

import dataclasses
from typing import Any

import flax.linen as nn

from modules.attention import ATTENTION
from modules.mlp import FFN
from modules.norms import NORMS
from core.registry import Registry, child

BLOCKS = Registry("block")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreNormBlockConfig:
  kind: str = "pre_norm"
  attention: Any = child("attention")
  ffn: Any = child("ffn")  # mlp or moe
  norm: Any = child("norm")  # one config, two instances (before attention, before ffn)
  # Also normalise each branch's output before it joins the residual (Gemma 2/3's post-attention
  # and post-feedforward norms: x += norm(attn(norm x)); x += norm(ffn(norm x))), with `norm`
  post_norms: bool = False


@BLOCKS.register("pre_norm", PreNormBlockConfig)
class PreNormBlock(nn.Module):
  """x += attn(norm(x)); x += ffn(norm(x)) (GPT-2, LLaMA); with `post_norms`,
  x += norm(attn(norm(x))); x += norm(ffn(norm(x))) (Gemma 2/3)."""
  cfg: PreNormBlockConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL, *, decode: bool = False):
    cfg = self.cfg

    def post(name, y):
      return NORMS.build(cfg.norm, dim=self.dim, name=name)(y) if cfg.post_norms else y

    h = NORMS.build(cfg.norm, dim=self.dim, name="attention_norm")(x_BxLxD)
    x_BxLxD = x_BxLxD + post("attention_post_norm", ATTENTION.build(
        cfg.attention, dim=self.dim, name="attention")(h, positions_BxL, segment_ids_BxL,
                                                       decode=decode))
    h = NORMS.build(cfg.norm, dim=self.dim, name="ffn_norm")(x_BxLxD)
    x_BxLxD = x_BxLxD + post("ffn_post_norm", FFN.build(cfg.ffn, dim=self.dim, name="ffn")(h))
    return nn.with_logical_constraint(x_BxLxD, ("act_batch", "act_length", "act_embed"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelBlockConfig:
  kind: str = "parallel"
  attention: Any = child("attention")
  ffn: Any = child("ffn")  # mlp or moe
  norm: Any = child("norm")
  # False: one norm feeds both branches (GPT-J, PaLM); True: one norm each (GPT-NeoX).
  separate_norms: bool = False


@BLOCKS.register("parallel", ParallelBlockConfig)
class ParallelBlock(nn.Module):
  """x += attn(norm(x)) + ffn(norm(x)): both branches read the same input (GPT-J, PaLM)."""
  cfg: ParallelBlockConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL, *, decode: bool = False):
    cfg = self.cfg
    h_attn = NORMS.build(cfg.norm, dim=self.dim, name="attention_norm")(x_BxLxD)
    h_ffn = (NORMS.build(cfg.norm, dim=self.dim, name="ffn_norm")(x_BxLxD)
             if cfg.separate_norms else h_attn)
    attn = ATTENTION.build(cfg.attention, dim=self.dim, name="attention")(
        h_attn, positions_BxL, segment_ids_BxL, decode=decode)
    x_BxLxD = x_BxLxD + attn + FFN.build(cfg.ffn, dim=self.dim, name="ffn")(h_ffn)
    return nn.with_logical_constraint(x_BxLxD, ("act_batch", "act_length", "act_embed"))
