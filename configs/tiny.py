"""A ~1.9M-parameter LLaMA-style byte-level LM on the embedded stdlib corpus (the demo).

    axtrain --config=configs/tiny.py

300 steps of 8 x 128 bytes: about 2 minutes on 2 CPU cores, final validation loss about
2.2 nats/byte. At this budget more, smaller steps train better than fewer, larger ones
(measured: 150 steps of 16 x 256 took 5 min for 2.38; 200 of 16 x 128 reached 2.46).
"""

from configs.base import lm_config
from core.config_args import parse_arg
from modules import llama


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  cfg = lm_config(llama.model_node("tiny"), max_steps=300, learning_rate=3e-3,
                  batch_size=8, seq_len=128, warmup_steps=20)
  cfg.model.scan_layers = False  # 4 layers: unrolled runs faster on CPU and compiles quickly
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 100
  cfg.eval.batch_size = 32
  cfg.eval.num_batches = 8
  return cfg
