"""The tiny demo model with a mixture-of-experts ffn (8 experts, top-2) on the stdlib corpus.

    axtrain --config=configs/moe_tiny.py
    axtrain --config=configs/moe_tiny.py --config.model.block.ffn.capacity_factor=0   # dropless
"""

from configs.base import lm_config
from core.config_args import parse_arg
from modules import llama
from core.registry import registry


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  model = llama.model_node("tiny")
  model.block.ffn = registry("ffn").node("moe", num_experts=8, top_k=2, hidden_dim=256,
                                         capacity_factor=1.25, aux_loss_coef=0.01)
  cfg = lm_config(model, max_steps=600, learning_rate=3e-3, batch_size=16, seq_len=256,
                  warmup_steps=50)
  cfg.trainer.log_every = 20
  cfg.eval.every_steps = 200
  cfg.eval.batch_size = 16
  cfg.eval.num_batches = 8
  return cfg
