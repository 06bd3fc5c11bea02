"""Mistral-style decoders: LLaMA's layers (modules/llama.py) with sliding-window attention in
every layer (`attention.sliding_window`), sizes as named rows.

  7b    mistralai/Mistral-7B-v0.1 config.json: hidden_size 4096, 32 layers, 32 query and 8
        key/value heads, intermediate_size 14336, vocab_size 32000 (untied), rope_theta 1e4,
        rms_norm_eps 1e-5, sliding_window 4096 (7,241,732,096 parameters). The paper (Jiang et
        al. 2023, "Mistral 7B", Table 1) gives window 4096 and context 8192.
  test, tiny  ours: LLaMA's `test` and `tiny` rows (byte vocabulary, for tests and the demo
        recipe) with a window of 32, a quarter of the demo's 128-token sequences.
Later Mistral-7B versions (v0.2, v0.3) dropped the window (`sliding_window: null`): LLaMA's
layers, which `axtrain convert --from_hf` reads as such.
"""

from __future__ import annotations

import dataclasses

from core.config_args import row
from modules import llama


@dataclasses.dataclass(frozen=True)
class Size:
  shape: llama.Size
  sliding_window: int  # positions a query sees: itself and the window - 1 before it


SIZES: dict[str, Size] = {
    "test": Size(llama.SIZES["test"], 32),
    "tiny": Size(llama.SIZES["tiny"], 32),
    "7b": Size(llama.Size(4096, 32, 32, 8, 14_336, 32_000, 10_000.0, False, 1e-5), 4096),
}


def size(name: str) -> Size:
  return row(SIZES, name, "Mistral")


def model_node(name: str):
  """The `model` config node of Mistral size `name`: LLaMA's with a sliding window."""
  return node(size(name))


def node(s: Size):
  model = llama.node(s.shape)
  model.block.attention.sliding_window = s.sliding_window
  return model
