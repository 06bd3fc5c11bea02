"""The `test` model on the embedded corpus, for checkpoint and fault-tolerance tests.

30 steps of batch 8 x 32 tokens, a checkpoint every 10 steps, every step logged.
"""

from configs.base import lm_config
from core.config_args import parse_arg
from modules import llama


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  cfg = lm_config(llama.model_node("test"), max_steps=30, learning_rate=3e-3,
                  batch_size=8, seq_len=32, warmup_steps=5)
  cfg.trainer.log_every = 1
  cfg.checkpoint.every_steps = 10
  cfg.eval.batch_size = 8
  cfg.eval.num_batches = 1
  return cfg
