"""GPT-2 (small 124M, medium 355M, large 774M, xl 1.56B) on synthetic tokens.

    axtrain --config=configs/gpt2.py:size=small --print_config
    axtrain --config=configs/gpt2.py:size=medium --mesh=gpu-h100-8
"""

from configs.base import lm_config
from core.config_args import choice, parse_arg
from modules import gpt2

# The values of each argument (tests/test_golden_configs.py keeps a golden file for each).
CHOICES = {"size": gpt2.SIZES}


def get_config(arg=None):
  args = parse_arg(arg, size="small")
  size = choice("size", args["size"], CHOICES["size"])
  cfg = lm_config(gpt2.model_node(size), max_steps=20_000, learning_rate=6e-4,
                  batch_size=512, seq_len=1024, warmup_steps=700, data_kind="synthetic")
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 1000
  cfg.checkpoint.every_steps = 1000  # a crash loses at most this many steps
  cfg.eval.batch_size = 64
  return cfg
