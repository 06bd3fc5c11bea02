"""LLaMA-3.2-1B shape (1.24B parameters), synthetic tokens until a real tokenizer is set.

    axtrain --config=configs/llm_1b.py --print_config
    axtrain --config=configs/llm_1b.py --mesh=gpu-h100-8
    axtrain plan --config=configs/llm_1b.py --mesh=tpu-v5e-16
"""

from configs.base import lm_config
from core.config_args import parse_arg
from modules import llama


def get_config(arg=None):
  parse_arg(arg)
  cfg = lm_config(llama.model_node("1b"), max_steps=10_000, learning_rate=3e-4,
                  batch_size=256, seq_len=2048, warmup_steps=1000, data_kind="synthetic")
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 1000
  cfg.checkpoint.every_steps = 1000  # a crash loses at most this many steps
  cfg.eval.batch_size = 64
  # Per-mesh settings that fit the global batch of 256 x 2048 (`axtrain plan`, docs/plan.md).
  full, chunk = "full", 256  # recompute each layer; cross-entropy over 256-position chunks
  cfg.mesh.rules = (
      (r"tpu-v5e-16", {"model.remat": full, "trainer.grad_accum_steps": 4,
                       "trainer.loss_chunk_size": chunk}),
      (r"tpu-v5p-128", {"model.remat": full, "trainer.loss_chunk_size": chunk}),
      (r"gpu-(h100|h200|b200)-8", {"model.remat": full, "trainer.grad_accum_steps": 8,
                                   "trainer.loss_chunk_size": chunk}),
      (r"neuron-trn1-32", {"model.remat": full, "trainer.grad_accum_steps": 4,
                           "trainer.loss_chunk_size": chunk}),
  )
  return cfg
