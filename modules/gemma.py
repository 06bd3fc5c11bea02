"""Gemma 2 and Gemma 3 decoders: sizes as named rows, and the config node they make.

Every layer is a pre-norm block with post-norms (`pre_norm.post_norms`), RMSNorm of (1 + w)
(`rmsnorm.scale_offset` 1.0), a GeGLU MLP (`gelu_tanh`, gated), grouped-query attention with
its own head_dim and logits scaled by query_pre_attn_scalar**-0.5; embeddings are scaled by
sqrt(dim) and tied to the LM head. The layers are a block group (modules/block_group.py) of a
`sliding` block (local, sliding-window attention) and a `full` one (global attention), Hugging
Face's names for them:

  Gemma 2   ('sliding', 'full'), both RoPE theta 10k; attention logits soft-capped at 50 and
            the final logits at 30
  Gemma 3   ('sliding',) * 5 + ('full',); QK-norm; sliding RoPE theta 10k, full 1M, the full
            layers' positions linearly scaled by 8 from 4b up; no soft-caps

Shapes of the published models are copied from their Hugging Face `config.json`:
  2-2b  google/gemma-2-2b    2-9b  google/gemma-2-9b    2-27b  google/gemma-2-27b
  3-1b  google/gemma-3-1b-pt (Gemma3ForCausalLM)
  3-4b, 3-12b, 3-27b  google/gemma-3-{4b,12b,27b}-pt (their `text_config`: the language model
        of Gemma3ForConditionalGeneration)
`2-test` and `3-test` are ours (byte vocabulary, for tests). Gemma 3's 1b, 4b and 27b have 26,
34 and 62 layers, no whole number of groups of six: as Hugging Face lays them out (layer i full
where (i + 1) % 6 == 0), their group of six is scanned over its 4, 5 and 10 whole repeats and
followed by its first 2, 4 and 2 layers, all sliding (the group's `remainder`, `first`:
modules/block_group.py), so the compiled step stays the size of one group and a remainder;
12b's 48 are the group repeated eight times.
"""

from __future__ import annotations

import dataclasses

from core.config_args import row
from core.registry import registry

GEMMA2 = ("sliding", "full")  # Gemma 2: sliding-window layers alternate with full ones
GEMMA3 = ("sliding",) * 5 + ("full",)  # Gemma 3: five sliding-window layers to one full


def remainder(num_layers: int, pattern: tuple[str, ...]) -> str:
  """The block group's `remainder` for a depth: `first` (HF's layout, layer i is the pattern's
  i % len(pattern)) where it is no multiple of the pattern, else `none` (the default)."""
  return "first" if num_layers % len(pattern) else "none"


@dataclasses.dataclass(frozen=True)
class Size:
  dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  hidden_dim: int
  vocab_size: int
  sliding_window: int  # the sliding layers' window (tokens)
  # The group of layers, repeated; a depth that is no multiple of it ends with its first layers
  pattern: tuple[str, ...] = GEMMA2
  query_pre_attn_scalar: float = 256.0  # the logits scaled by its inverse square root
  attn_softcap: float | None = None  # Gemma 2: 50
  final_softcap: float | None = None  # Gemma 2: 30
  qk_norm: bool = False  # Gemma 3
  sliding_theta: float = 10_000.0
  full_theta: float = 10_000.0  # Gemma 3: 1M
  full_linear_factor: float = 1.0  # Gemma 3 from 4b up: 8 (HF rope_scaling, linear)
  norm_eps: float = 1e-6


_G2 = dict(pattern=GEMMA2, attn_softcap=50.0, final_softcap=30.0)
_G3 = dict(pattern=GEMMA3, qk_norm=True, full_theta=1_000_000.0)

SIZES: dict[str, Size] = {
    "2-test": Size(64, 4, 4, 2, 32, 128, 256, 16, query_pre_attn_scalar=32.0, **_G2),
    "2-2b": Size(2304, 26, 8, 4, 256, 9216, 256_000, 4096, **_G2),
    "2-9b": Size(3584, 42, 16, 8, 256, 14_336, 256_000, 4096, **_G2),
    "2-27b": Size(4608, 46, 32, 16, 128, 36_864, 256_000, 4096, query_pre_attn_scalar=144.0, **_G2),
    "3-test": Size(64, 6, 4, 2, 32, 128, 256, 16, query_pre_attn_scalar=32.0, **_G3),
    "3-1b": Size(1152, 26, 4, 1, 256, 6912, 262_144, 512, **_G3),
    "3-4b": Size(2560, 34, 8, 4, 256, 10_240, 262_208, 1024, full_linear_factor=8.0, **_G3),
    "3-12b": Size(3840, 48, 16, 8, 256, 15_360, 262_208, 1024, full_linear_factor=8.0, **_G3),
    "3-27b": Size(5376, 62, 32, 16, 128, 21_504, 262_208, 1024, query_pre_attn_scalar=168.0,
                  full_linear_factor=8.0, **_G3),
}


def size(name: str) -> Size:
  return row(SIZES, name, "Gemma")


def model_node(name: str):
  """The `model` config node of Gemma size `name`."""
  return node(size(name))


def block_node(s: Size, *, window: int | None, theta: float, linear_factor: float):
  """One Gemma layer: pre- and post-norms, GeGLU, GQA attention with RoPE (and a window)."""
  r = registry
  norm = lambda: r("norm").node("rmsnorm", eps=s.norm_eps, scale_offset=1.0)  # a node each
  attention = r("attention").node(
      "attention", num_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
      query_pre_attn_scalar=s.query_pre_attn_scalar, logit_softcap=s.attn_softcap,
      sliding_window=window, norm=norm() if s.qk_norm else None,
      position=r("position").node("rope", theta=theta, linear_factor=linear_factor))
  ffn = r("ffn").node("mlp", hidden_dim=s.hidden_dim, activation="gelu_tanh", gated=True)
  return r("block").node("pre_norm", attention=attention, ffn=ffn, norm=norm(), post_norms=True)


def node(s: Size):
  """The `model` config node of any Gemma shape (a table row, or one read from a checkpoint)."""
  r = registry
  blocks = {"sliding": lambda: block_node(s, window=s.sliding_window, theta=s.sliding_theta,
                                          linear_factor=1.0),
            "full": lambda: block_node(s, window=None, theta=s.full_theta,
                                       linear_factor=s.full_linear_factor)}
  blocks = {name: make() for name, make in blocks.items() if name in s.pattern}
  return r("model").node(
      "decoder_lm", vocab_size=s.vocab_size, dim=s.dim, num_layers=s.num_layers,
      tie_embeddings=True, final_logit_softcap=s.final_softcap,
      embedding=r("embedding").node("token", scale_by_sqrt_dim=True),
      position_embedding=r("position_embedding").node("none"),
      block=r("block").node("group", pattern=s.pattern, blocks=blocks,
                            remainder=remainder(s.num_layers, s.pattern)),
      final_norm=r("norm").node("rmsnorm", eps=s.norm_eps, scale_offset=1.0))
