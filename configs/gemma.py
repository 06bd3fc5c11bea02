"""Gemma 2 and Gemma 3 decoders at every size of modules/gemma.py's table: a block group of
sliding-window (`sliding`) and full-attention (`full`) layers, scanned over its repeats.

    axtrain --config=configs/gemma.py:size=2-test                # Gemma-2 style, trains on CPU
    axtrain --config=configs/gemma.py:size=3-test                # Gemma-3 style, trains on CPU
    axtrain --config=configs/gemma.py:size=2-9b --print_config
    axtrain --config=configs/gemma.py:size=3-12b --print_config
    axtrain --config=configs/gemma.py:size=2-2b --print_config \
        --config.model.block.blocks.sliding.attention.sliding_window=2048    # one kind of layer

`2-test` and `3-test` (byte vocabulary) train the demo's recipe (configs/tiny.py) on the
embedded corpus; the others train on synthetic tokens, packed into documents as a corpus would
be, until a real tokenizer and corpus are set (README "Your own data"), with our recipe (Gemma's
training recipe is not published): 256 sequences of 8192 tokens (Gemma 2's context), AdamW at
3e-4. Sizes: 2-test, 2-2b, 2-9b, 2-27b, 3-test, 3-1b, 3-4b, 3-12b, 3-27b.
"""

from __future__ import annotations

from configs import tiny
from configs.base import lm_config
from core.config_args import choice, parse_arg
from modules import gemma

DEMO_SIZES = ("2-test", "3-test")  # byte vocabulary: configs/tiny.py's recipe
# The values of each argument (tests/test_golden_configs.py keeps a golden file for each).
CHOICES = {"size": gemma.SIZES}


def get_config(arg=None):
  args = parse_arg(arg, size="2-test")
  size = choice("size", args["size"], CHOICES["size"])
  if size in DEMO_SIZES:
    cfg = tiny.get_config()
    cfg.model = gemma.model_node(size)
    return cfg
  cfg = lm_config(gemma.model_node(size), max_steps=10_000, learning_rate=3e-4, batch_size=256,
                  seq_len=8192, warmup_steps=2000, data_kind="synthetic")
  # Packed like a corpus (positions, segment ids): `axtrain plan` compiles the step of a real run.
  cfg.data.mean_doc_len = 1024  # tokens per synthetic document, on average
  cfg.model.remat = "full"  # recompute each layer: 8k-token sequences
  cfg.trainer.loss_chunk_size = 1024  # cross-entropy over 1024-position chunks (a 256k vocabulary)
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 1000
  cfg.checkpoint.every_steps = 1000  # a crash loses at most this many steps
  cfg.eval.batch_size = 64
  return cfg
