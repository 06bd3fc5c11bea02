"""A ~1.9M-parameter LLaMA-style byte-level LM on the embedded stdlib corpus (the demo).

    axtrain --config=configs/tiny.py
"""

from configs.base import lm_config
from launcher.config_args import parse_arg
from modules import llama


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  cfg = lm_config(llama.model_node("tiny"), max_steps=150, learning_rate=3e-3,
                  batch_size=16, seq_len=256, warmup_steps=20)
  cfg.model.scan_layers = False  # 4 layers: unrolled runs faster on CPU and compiles quickly
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 50
  cfg.eval.batch_size = 16
  cfg.eval.num_batches = 8
  return cfg
