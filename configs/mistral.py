"""Mistral-style decoders (modules/mistral.py): LLaMA's layers with a sliding window in every
layer, at every size of the table.

    axtrain --config=configs/mistral.py:size=test                 # window 32 of 128 tokens, CPU
    axtrain --config=configs/mistral.py:size=7b --print_config    # Mistral-7B-v0.1, window 4096
    axtrain plan --config=configs/mistral.py:size=7b --mesh=tpu-v5p-128

`test` and `tiny` (byte vocabulary) train the demo's recipe (configs/tiny.py) on the embedded
corpus, their window a quarter of its 128-token sequences. `7b` trains on synthetic tokens
(until a real tokenizer and corpus are set, README "Your own data") at Mistral 7B's context of
8192, twice its window (Jiang et al. 2023, Table 1); the batch, rate and warm-up are ours
(LLaMA-3-8B's recipe in configs/llama.py), as Mistral AI published none. Sizes: test, tiny, 7b.
"""

from __future__ import annotations

from configs import tiny
from configs.base import lm_config
from core.config_args import choice, parse_arg
from modules import mistral

DEMO_SIZES = ("test", "tiny")  # byte vocabulary: configs/tiny.py's recipe
# The values of each argument (tests/test_golden_configs.py keeps a golden file for each).
CHOICES = {"size": mistral.SIZES}


def get_config(arg=None):
  args = parse_arg(arg, size="tiny")
  size = choice("size", args["size"], CHOICES["size"])
  if size in DEMO_SIZES:
    cfg = tiny.get_config()
    cfg.model = mistral.model_node(size)
    cfg.model.scan_layers = False  # a few layers: unrolled runs faster on CPU
    return cfg
  cfg = lm_config(mistral.model_node(size), max_steps=10_000, learning_rate=3e-4,
                  batch_size=256, seq_len=8192, warmup_steps=2000, data_kind="synthetic")
  # Packed like a corpus (positions, segment ids), documents as long as the window on average.
  cfg.data.mean_doc_len = 4096  # tokens per synthetic document, on average
  cfg.model.remat = "dots_with_no_batch_dims_saveable"  # keep the matmul outputs, redo the rest
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 1000
  cfg.checkpoint.every_steps = 1000  # a crash loses at most this many steps
  cfg.eval.batch_size = 64
  return cfg
