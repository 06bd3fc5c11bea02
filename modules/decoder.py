"""Decoder-only language models: embeddings, a stack of blocks (scanned or unrolled), LM head.

Vocabulary padding: the embedding table and the LM head hold `padded_vocab_size` rows, the
vocabulary rounded up to a multiple of `vocab_multiple` (128 by default: the TPU's lanes, and
a multiple of every power-of-two tensor-parallel axis up to 128, so GPT-2's 50,257 ids split
over `model` as 50,304). The pad ids' logits are set to the lowest float, out of the softmax:
no loss, no gradient and no sample reaches them. The multiple is a model field, not the mesh's:
parameter shapes, and so checkpoints, stay the same on every mesh; a mesh rule can raise it
(128 x the model axis gives lane-aligned shards). HF conversion drops the pad rows
(modules/hf_maps.py).
"""

import dataclasses
import math
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from modules import block_group, context, pipeline
from modules.block import BLOCKS
from modules.embedding import EMBEDDINGS, POSITION_EMBEDDINGS
from modules.norms import NORMS
from modules.quantization import QUANTIZATION
from core.registry import REQUIRED, ConfigError, Registry, child, suggest

MODELS = Registry("model")
# The scope of the layers after a block group's whole repeats (modules/block_group.py), beside
# the stack's `layers` (scanned) or `layers_<i>` (unrolled)
REMAINDER = "layers_remainder"

# Rematerialisation policies by name. Names other than these are taken as the
# names of tagged activations to save (`jax.ad_checkpoint.checkpoint_name`).
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names("qkv_proj"),
    "save_attn_out": jax.checkpoint_policies.save_only_these_names("qkv_proj", "attn_out"),
    # Saved to host memory (memory kind pinned_host) instead of kept on the device, and brought
    # back for the backward pass: MaxText's offloading remat policies.
    "offload_dots_with_no_batch_dims": jax.checkpoint_policies.offload_dot_with_no_batch_dims(
        "device", "pinned_host"),
    "offload_attn_out": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["qkv_proj", "attn_out"],
        offload_src="device", offload_dst="pinned_host"),
}
REMAT_NAMES = ("none", *REMAT_POLICIES)
# Activations tagged with checkpoint_name in the layer library (modules/attention.py);
# `remat` may also be a comma-separated list of these, saved and the rest recomputed.
CHECKPOINT_NAMES = ("qkv_proj", "attn_out")


def remat_policy(name: str):
  return REMAT_POLICIES.get(name) or jax.checkpoint_policies.save_only_these_names(
      *name.split(","))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderLMConfig:
  kind: str = "decoder_lm"
  vocab_size: int = REQUIRED  # tokens in the vocabulary
  # Embedding rows and LM head columns are padded up to a multiple of this (pad ids masked out
  # of the softmax), so the vocabulary splits over a tensor-parallel axis; 1 = no padding.
  vocab_multiple: int = 128
  dim: int = REQUIRED  # model width (residual stream)
  num_layers: int = REQUIRED  # decoder layers (a block group's whole repeats, then any remainder)
  scan_layers: bool = True  # one compiled block (or group) scanned over layers, or unrolled
  # Microbatches per (accumulation) batch through the pipeline stages when the mesh splits the
  # layer stack (mesh.stage > 1; modules/pipeline.py); the idle fraction of a step is
  # (stages - 1) / (microbatches + stages - 1). 0 = as many as stages.
  pipeline_microbatches: int = 0
  remat: str = "none"  # none | full | dots_saveable | dots_with_no_batch_dims_saveable | save_qkv_proj | save_attn_out | offload_dots_with_no_batch_dims | offload_attn_out (saved to host memory) | tagged names, e.g. "qkv_proj,attn_out"
  tie_embeddings: bool = False  # LM head reuses the token embedding matrix
  # Gemma-2's final logit soft-capping: each logit becomes cap * tanh(logit / cap), bounding it
  # to (-cap, cap) (Gemma-2: 30.0); None = off
  final_logit_softcap: float | None = None
  embedding: Any = child("embedding")
  position_embedding: Any = child("position_embedding")  # none (RoPE lives in attention) / learned
  block: Any = child("block")  # every layer's block, or a group of them (modules/block_group.py)
  final_norm: Any = child("norm")
  # Quantized training of the layers' dense projections (modules/quantization.py): none, int8
  # (TPU, GPU), fp8 (GPU); applied to the whole model where it is built, no layer sees it.
  quantization: Any = child("quantization", kind="none")

  def check(self):
    for name in ("vocab_size", "vocab_multiple", "dim", "num_layers"):
      if getattr(self, name) <= 0:
        raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
    if self.final_logit_softcap is not None and not 0 < self.final_logit_softcap < math.inf:
      raise ConfigError(f"model.final_logit_softcap must be a positive number (None = off), got "
                        f"{self.final_logit_softcap}")
    if self.pipeline_microbatches < 0:
      raise ConfigError(f"model.pipeline_microbatches must be >= 0 (0 = as many as stages), got "
                        f"{self.pipeline_microbatches}")
    self.remainder  # pylint: disable=pointless-statement  (refuses a depth the block can't fill)
    if self.remat not in REMAT_NAMES and not set(self.remat.split(",")) <= set(CHECKPOINT_NAMES):
      # a name cut short ('offload_dots') is the one it starts, else the closest spelling
      starts = [n for n in REMAT_NAMES if n.startswith(self.remat)]
      hint = (f" (did you mean '{starts[0]}'?)" if len(starts) == 1
              else suggest(self.remat, REMAT_NAMES))
      raise ConfigError(f"model.remat: unknown policy '{self.remat}'{hint}; known: "
                        f"{', '.join(REMAT_NAMES)}"
                        f", or tagged activations to save (comma-separated): "
                        f"{', '.join(CHECKPOINT_NAMES)}")

  @property
  def repeats(self) -> int:
    """Blocks in the scanned stack: the layers, or the whole repeats of a block group."""
    return self.num_layers // block_group.depth(self.block)

  @property
  def remainder(self) -> Any:
    """The block group of the layers after the stack's whole repeats, run once after them
    (modules/block_group.py:remainder); None where the repeats are all the layers."""
    return block_group.remainder(self.block, self.num_layers)

  @property
  def padded_vocab_size(self) -> int:
    """Rows of the embedding table and columns of the LM head."""
    return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple


def softcap(logits_BxLxV, cap: float | None):
  """cap * tanh(logits / cap), computed in float32 (None: the logits as they are)."""
  if cap is None:
    return logits_BxLxV
  return (cap * jnp.tanh(logits_BxLxV.astype(jnp.float32) / cap)).astype(logits_BxLxV.dtype)


def mask_padding(logits_BxLxV, vocab_size: int):
  """Logits with the pad ids (`vocab_size` and up) at the lowest float: out of the softmax."""
  if logits_BxLxV.shape[-1] == vocab_size:
    return logits_BxLxV
  real = jnp.arange(logits_BxLxV.shape[-1]) < vocab_size
  return jnp.where(real, logits_BxLxV, jnp.finfo(logits_BxLxV.dtype).min)


@dataclasses.dataclass(frozen=True)
class LmHead:
  """The LM head for a loss that computes logits chunk by chunk (`DecoderLM(head=False)`)."""
  weight_DxV: jax.Array  # [dim, padded_vocab_size]
  vocab_size: int  # ids from here up are padding
  softcap: float | None = None  # model.final_logit_softcap

  def logits(self, x_BxLxD):
    """x @ head, soft-capped, the pad ids masked."""
    return mask_padding(softcap(jnp.einsum("bld,dv->blv", x_BxLxD, self.weight_DxV),
                                self.softcap), self.vocab_size)


class _Layer(nn.Module):
  """Adapts a block to nn.scan's (carry, x) -> (carry, y) signature."""
  cfg: Any
  dim: int
  decode: bool = False  # an attribute, not a call input: nn.scan broadcasts arrays only

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL):
    block = BLOCKS.build(self.cfg, dim=self.dim, name="block")
    return block(x_BxLxD, positions_BxL, segment_ids_BxL, decode=self.decode), None


def _layer_class(cfg: DecoderLMConfig, *, decode: bool, scanned: bool):
  """_Layer, rematerialised by `cfg.remat` while training (CSE prevented outside a scan)."""
  if cfg.remat == "none" or decode:
    return _Layer
  return nn.remat(_Layer, policy=remat_policy(cfg.remat), prevent_cse=not scanned)


class DecoderLM(nn.Module):
  """tokens [B, L] -> logits [B, L, V] (in the parameters' dtype).

  The logits span `padded_vocab_size` ids, the pad ids masked (`mask_padding`).
  With `head=False`: (final hidden states [B, L, D], `LmHead`) instead, for a loss that
  computes the logits chunk by chunk (trainer.step, trainer.loss_chunk_size).
  decode=True: attention reads and writes its KV cache (the mutable "cache"
  collection) at `positions_BxL`; see trainer/generate.py.
  """
  cfg: DecoderLMConfig

  @nn.compact
  def __call__(self, tokens_BxL, positions_BxL=None, segment_ids_BxL=None, *, head: bool = True,
               decode: bool = False):
    cfg = self.cfg
    if positions_BxL is None:
      positions_BxL = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1]), tokens_BxL.shape)
    # Context parallelism: the sequence in the load-balanced layout until the final hidden
    # states, which go back to the natural order (modules/context.py).
    shards = 1 if decode else context.shards()[1]
    if shards > 1:
      tokens_BxL, positions_BxL = (context.zigzag(a, shards) for a in (tokens_BxL, positions_BxL))
      if segment_ids_BxL is not None:
        segment_ids_BxL = context.zigzag(segment_ids_BxL, shards)
    vocab = cfg.padded_vocab_size
    embed = EMBEDDINGS.build(cfg.embedding, vocab_size=vocab, dim=cfg.dim, name="embedding")
    x = embed(tokens_BxL)
    pos = POSITION_EMBEDDINGS.build(cfg.position_embedding, dim=cfg.dim,
                                    name="position_embedding")(positions_BxL)
    if pos is not None:
      x = x + pos
    x = nn.with_logical_constraint(x, ("act_batch", "act_length", "act_embed"))

    layer = _layer_class(cfg, decode=decode, scanned=cfg.scan_layers)
    stage_axes, stages = pipeline.stages()
    if stages > 1 and not decode and not self.is_initializing():
      x = self._pipelined(x, positions_BxL, segment_ids_BxL, axes=stage_axes, stages=stages)
    elif cfg.scan_layers:
      stack = nn.scan(layer, variable_axes={"params": 0, "losses": 0, "metrics": 0, "cache": 0},
                      split_rngs={"params": True}, in_axes=(nn.broadcast, nn.broadcast),
                      length=cfg.repeats, metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = stack(cfg=cfg.block, dim=cfg.dim, decode=decode, name="layers")(
          x, positions_BxL, segment_ids_BxL)
    else:
      for i in range(cfg.repeats):
        x, _ = layer(cfg=cfg.block, dim=cfg.dim, decode=decode, name=f"layers_{i}")(
            x, positions_BxL, segment_ids_BxL)
    if (rest := cfg.remainder) is not None:  # the group's first layers after its repeats, once
      x, _ = _layer_class(cfg, decode=decode, scanned=False)(
          cfg=rest, dim=cfg.dim, decode=decode, name=REMAINDER)(
              x, positions_BxL, segment_ids_BxL)

    if shards > 1:
      x = nn.with_logical_constraint(context.unzigzag(x, shards),
                                     ("act_batch", "act_length", "act_embed"))
    x = NORMS.build(cfg.final_norm, dim=cfg.dim, name="final_norm")(x)
    if cfg.tie_embeddings:
      if not head:
        return x, LmHead(embed.embedding.T.astype(x.dtype), cfg.vocab_size,
                         cfg.final_logit_softcap)
      with jax.named_scope("head"):  # names its ops in profiles and `axtrain plan --ops`
        logits = mask_padding(softcap(embed.attend(x), cfg.final_logit_softcap), cfg.vocab_size)
    else:
      w = self.param("head", nn.with_logical_partitioning(
          nn.initializers.normal(cfg.embedding.init_std), ("embed", "vocab")),
          (cfg.dim, vocab))
      if not head:
        return x, LmHead(w.astype(x.dtype), cfg.vocab_size, cfg.final_logit_softcap)
      with jax.named_scope("head"):
        logits = LmHead(w.astype(x.dtype), cfg.vocab_size, cfg.final_logit_softcap).logits(x)
    return nn.with_logical_constraint(logits, ("act_batch", "act_length", "act_vocab"))

  def _pipelined(self, x_BxLxD, positions_BxL, segment_ids_BxL, *, axes, stages: int):
    """The scanned stack's layers as pipeline stages (modules/pipeline.py), on the parameters
    that `nn.scan` made for it ("layers", [repeats, ...]: a block group's repeats stay whole).
    A group's remainder runs after them, outside the stages, where the stage axes split the
    batch as they do for the LM head."""
    cfg = self.cfg
    microbatches = cfg.pipeline_microbatches or stages
    pipeline.check(num_layers=cfg.num_layers, repeats=cfg.repeats, scan_layers=cfg.scan_layers,
                   stage_count=stages, batch=x_BxLxD.shape[0], microbatches=microbatches)
    block = _Layer(cfg=cfg.block, dim=cfg.dim, parent=None)
    sows, names = [], {}

    def layer_fn(params, x, extras):
      (y, _), state = block.apply({"params": params}, x, *extras, mutable=["losses", "metrics"])
      losses = jax.tree.leaves(state.get("losses", {}))
      sows.append(bool(losses))
      # The layer's sown metrics (MoE router statistics), by their path in the block.
      metrics = {}
      for path, v in jax.tree_util.tree_leaves_with_path(state.get("metrics", {})):
        key = jax.tree_util.keystr(path)
        names[key] = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)][-1]
        metrics[key] = jnp.sum(v)
      return y, (sum((jnp.sum(v) for v in losses), jnp.float32(0)), metrics)

    if cfg.remat != "none":
      layer_fn = jax.checkpoint(layer_fn, policy=remat_policy(cfg.remat), prevent_cse=False)
    x, (aux, metrics) = pipeline.gpipe(layer_fn, self.variables["params"]["layers"], x_BxLxD,
                                       (positions_BxL, segment_ids_BxL), axes=axes,
                                       stage_count=stages, microbatches=microbatches)
    if any(sows):  # the layers' own losses (MoE load balancing), summed over layers
      self.sow("losses", "pipeline_layers", aux)
    for key, total in metrics.items():  # means over layers, as the scanned stack reports them
      mean = total / cfg.repeats
      if cfg.remainder is not None:  # once per repeat, beside the remainder's layers' own
        mean = jnp.full((cfg.repeats,), mean)
      self.sow("metrics", names[key], mean)
    return x


@MODELS.register("decoder_lm", DecoderLMConfig)
def decoder_lm(cfg: DecoderLMConfig) -> DecoderLM:
  """The model of `cfg`, under its quantization (modules/quantization.py) when it has one."""
  return QUANTIZATION.build(cfg.quantization)(DecoderLM(cfg=cfg))
