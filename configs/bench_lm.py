"""The benchmark model of `make bench`: a small LLaMA-style LM on synthetic tokens.

vocab 8192, dim 256, 4 layers, 4 heads (4 KV heads), SwiGLU hidden 1024, RMSNorm,
RoPE, untied embeddings; sequence 256, global batch 8; AdamW in float32.

    axtrain --config=configs/bench_lm.py
"""

from configs.base import lm_config
from core.config_args import parse_arg
from modules import llama

# LLaMA parts (RMSNorm eps 1e-5, RoPE theta 10k, SwiGLU, untied) at the benchmark's shape.
SHAPE = llama.Size(dim=256, num_layers=4, num_heads=4, num_kv_heads=4, hidden_dim=1024,
                   vocab_size=8192)


def model_node():
  return llama.node(SHAPE)


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  cfg = lm_config(model_node(), max_steps=100, learning_rate=3e-4, batch_size=8, seq_len=256,
                  warmup_steps=10, data_kind="synthetic")
  cfg.model.scan_layers = False  # 4 layers: unrolled, like tiny.py and like the plain-JAX loop
  cfg.optimizer.state_dtype = "float32"
  cfg.trainer.compute_dtype = "float32"
  cfg.trainer.log_every = 10
  cfg.eval.batch_size = 8
  cfg.eval.num_batches = 1
  return cfg
