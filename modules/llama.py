"""LLaMA-style decoders: sizes as named rows, and the config node they make.

Shapes of the published models are copied from their Hugging Face `config.json`:
  1b  meta-llama/Llama-3.2-1B   3b  meta-llama/Llama-3.2-3B
  7b  meta-llama/Llama-2-7b-hf  8b  meta-llama/Meta-Llama-3-8B   70b meta-llama/Meta-Llama-3-70B
`rope_scaling` is the published `rope_scaling` (LLaMA-3.2: factor 32, low 1, high 4, original
8192; LLaMA-3-8B/70B and LLaMA-2 have none).
`test` and `tiny` are ours (byte vocabulary, for tests and the demo); `125m` is the
GPT-3 Small shape (Brown et al. 2020, Table 2.1) with LLaMA parts and a 32k vocabulary.
"""

from __future__ import annotations

import dataclasses

from core.config_args import row
from core.registry import registry


@dataclasses.dataclass(frozen=True)
class Size:
  dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  hidden_dim: int
  vocab_size: int
  rope_theta: float = 10_000.0
  tie_embeddings: bool = False
  norm_eps: float = 1e-5
  head_dim: int | None = None  # None = dim // num_heads
  # (factor, low_freq_factor, high_freq_factor, original_max_position) of LLaMA-3 RoPE scaling
  rope_scaling: tuple[float, float, float, int] | None = None


_LLAMA32_ROPE = (32.0, 1.0, 4.0, 8192)


SIZES: dict[str, Size] = {
    "test": Size(64, 2, 4, 2, 128, 256),
    "tiny": Size(192, 4, 6, 6, 512, 256),
    "125m": Size(768, 12, 12, 12, 2048, 32_000),
    "1b": Size(2048, 16, 32, 8, 8192, 128_256, 500_000.0, True, rope_scaling=_LLAMA32_ROPE),
    "3b": Size(3072, 28, 24, 8, 8192, 128_256, 500_000.0, True, rope_scaling=_LLAMA32_ROPE),
    "7b": Size(4096, 32, 32, 32, 11_008, 32_000, 10_000.0, False),
    "8b": Size(4096, 32, 32, 8, 14_336, 128_256, 500_000.0, False),
    "70b": Size(8192, 80, 64, 8, 28_672, 128_256, 500_000.0, False),
}


def size(name: str) -> Size:
  return row(SIZES, name, "LLaMA")


def rope_node(s: Size):
  if s.rope_scaling is None:
    return registry("position").node("rope", theta=s.rope_theta)
  factor, low, high, original = s.rope_scaling
  return registry("position").node("rope_llama3", theta=s.rope_theta, factor=factor,
                                   low_freq_factor=low, high_freq_factor=high,
                                   original_max_position=original)


def model_node(name: str):
  """The `model` config node of LLaMA size `name`: RMSNorm, RoPE, SwiGLU, GQA."""
  return node(size(name))


def node(s: Size):
  """The `model` config node of any LLaMA shape (a table row, or one read from a checkpoint)."""
  r = registry
  norm = r("norm").node("rmsnorm", eps=s.norm_eps)
  head_dim = {} if s.head_dim is None else {"head_dim": s.head_dim}
  attention = r("attention").node(
      "attention", num_heads=s.num_heads, num_kv_heads=s.num_kv_heads, position=rope_node(s),
      **head_dim)
  block = r("block").node("pre_norm", attention=attention,
                          ffn=r("ffn").node("mlp", hidden_dim=s.hidden_dim, activation="silu",
                                            gated=True),
                          norm=norm)
  return r("model").node(
      "decoder_lm", vocab_size=s.vocab_size, dim=s.dim, num_layers=s.num_layers,
      tie_embeddings=s.tie_embeddings, embedding=r("embedding").node("token"),
      position_embedding=r("position_embedding").node("none"), block=block,
      final_norm=r("norm").node("rmsnorm", eps=s.norm_eps))
