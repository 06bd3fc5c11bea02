"""Mistral-style decoders (modules/mistral.py): LLaMA's layers with a sliding window in every
layer, at every size of the table, each trained with a recipe of configs/llama.py.

    axtrain --config=configs/mistral.py:size=test                 # window 32 of 128 tokens, CPU
    axtrain --config=configs/mistral.py:size=7b --print_config    # Mistral-7B-v0.1, window 4096
    axtrain plan --config=configs/mistral.py:size=7b --mesh=tpu-v5p-128

`test` and `tiny` (byte vocabulary) train the demo's recipe (configs/tiny.py) on the embedded
corpus, their window a quarter of its 128-token sequences. `7b` trains LLaMA-3-8B's recipe on
synthetic tokens (until a real tokenizer and corpus are set, README "Your own data"): its
context of 8192 is Mistral 7B's, twice the window (Jiang et al. 2023, Table 1); the batch, rate
and warm-up are LLaMA's, as Mistral AI published none. Sizes: test, tiny, 7b.
"""

from __future__ import annotations

from configs import llama as llama_config
from core.config_args import Needed, choice, parse_arg
from modules import mistral

# The configs/llama.py size whose recipe (data, optimizer, schedule, remat, layout) each trains.
LLAMA_RECIPE = {"test": "test", "tiny": "tiny", "7b": "8b"}
# The values of each argument (tests/test_golden_configs.py keeps a golden file for each).
CHOICES = {"size": mistral.SIZES}


def get_config(arg=None):
  args = parse_arg(arg, size=Needed(f"one of {', '.join(CHOICES['size'])}"))
  size = choice("size", args["size"], CHOICES["size"])
  cfg = llama_config.get_config(f"size={LLAMA_RECIPE[size]}")
  model = mistral.model_node(size)
  model.scan_layers, model.remat = cfg.model.scan_layers, cfg.model.remat  # the recipe's
  cfg.model = model
  if size not in llama_config.DEMO_SIZES:
    cfg.data.mean_doc_len = 4096  # synthetic documents as long as the window, on average
  return cfg
