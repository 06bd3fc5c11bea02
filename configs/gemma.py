"""Gemma 2 and Gemma 3 decoders at every size of modules/gemma.py's table: a block group of
sliding-window (`sliding`) and full-attention (`full`) layers, scanned over its repeats.

    axtrain --config=configs/gemma.py:size=2-test                # Gemma-2 style, trains on CPU
    axtrain --config=configs/gemma.py:size=3-test                # Gemma-3 style, trains on CPU
    axtrain --config=configs/gemma.py:size=2-9b --print_config
    axtrain --config=configs/gemma.py:size=3-12b --print_config
    axtrain --config=configs/gemma.py:size=2-2b --print_config \
        --config.model.block.blocks.sliding.attention.sliding_window=2048    # one kind of layer

`2-test` and `3-test` (byte vocabulary) train the demo's recipe (configs/tiny.py) on the
embedded corpus, scanned over their groups' repeats; the others train LLaMA-3-8B's recipe of
configs/llama.py (256 sequences of 8192 tokens, Gemma 2's context; AdamW at 3e-4), as Google
published none, on synthetic tokens until a real tokenizer and corpus are set (README "Your own
data"), their cross-entropy over 1024-position chunks (a 256k vocabulary). Sizes: 2-test, 2-2b,
2-9b, 2-27b, 3-test, 3-1b, 3-4b, 3-12b, 3-27b.
"""

from __future__ import annotations

from configs import llama as llama_config
from core.config_args import Needed, choice, parse_arg
from modules import gemma

DEMO_SIZES = ("2-test", "3-test")  # byte vocabulary: configs/tiny.py's recipe (llama's tiny)
# The values of each argument (tests/test_golden_configs.py keeps a golden file for each).
CHOICES = {"size": gemma.SIZES}


def get_config(arg=None):
  args = parse_arg(arg, size=Needed(f"one of {', '.join(CHOICES['size'])}"))
  size = choice("size", args["size"], CHOICES["size"])
  cfg = llama_config.get_config("size=tiny" if size in DEMO_SIZES else "size=8b")
  model = gemma.model_node(size)
  if size not in DEMO_SIZES:
    model.remat = cfg.model.remat  # the recipe's
    cfg.trainer.loss_chunk_size = 1024  # a 256k vocabulary: logits never whole
  cfg.model = model
  return cfg
