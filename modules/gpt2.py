"""GPT-2 decoders: sizes as named rows, and the config node they make.

Shapes are copied from the Hugging Face `config.json` of each published model
(n_embd, n_layer, n_head; vocab_size 50257, n_positions 1024, layer_norm_epsilon
1e-5, activation_function gelu_new, tied LM head):
  small  openai-community/gpt2          (124,439,808 parameters)
  medium openai-community/gpt2-medium   (354,823,168)
  large  openai-community/gpt2-large    (774,030,080)
  xl     openai-community/gpt2-xl       (1,557,611,200)
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
  vocab_size: int = 50_257
  max_length: int = 1024  # learned positions
  hidden_dim: int | None = None  # None = 4 * dim (n_inner)
  norm_eps: float = 1e-5


SIZES: dict[str, Size] = {
    "small": Size(768, 12, 12),
    "medium": Size(1024, 24, 16),
    "large": Size(1280, 36, 20),
    "xl": Size(1600, 48, 25),
}


def size(name: str) -> Size:
  return row(SIZES, name, "GPT-2")


def model_node(name: str):
  """The `model` config node of GPT-2 size `name`."""
  return node(size(name))


def node(s: Size):
  """LayerNorm with bias, learned positions, gelu_tanh MLP and attention with biases, tied head."""
  r = registry
  norm = r("norm").node("layernorm", eps=s.norm_eps, use_bias=True)
  attention = r("attention").node("attention", num_heads=s.num_heads, qkv_bias=True,
                                  out_bias=True, position=r("position").node("none"))
  ffn = r("ffn").node("mlp", hidden_dim=s.hidden_dim or 4 * s.dim, activation="gelu_tanh",
                      gated=False, use_bias=True)
  block = r("block").node("pre_norm", attention=attention, ffn=ffn, norm=norm)
  return r("model").node(
      "decoder_lm", vocab_size=s.vocab_size, dim=s.dim, num_layers=s.num_layers,
      tie_embeddings=True, embedding=r("embedding").node("token"),
      position_embedding=r("position_embedding").node("learned", max_length=s.max_length),
      block=block, final_norm=norm)
