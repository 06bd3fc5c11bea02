"""LLaMA-3-70B shape (70.55B parameters), synthetic tokens until a real tokenizer is set.

    axtrain --config=configs/llm_70b.py --print_config
    axtrain --config=configs/llm_70b.py --mesh=tpu-v5p-1024
"""

from configs.base import lm_config
from core.config_args import parse_arg
from modules import llama


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  cfg = lm_config(llama.model_node("70b"), max_steps=10_000, learning_rate=1.5e-4,
                  batch_size=1024, seq_len=8192, warmup_steps=2000, data_kind="synthetic")
  cfg.model.remat = "full"
  cfg.optimizer.state_dtype = "bfloat16"
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 1000
  cfg.checkpoint.every_steps = 1000  # a crash loses at most this many steps
  cfg.eval.batch_size = 64
  return cfg
