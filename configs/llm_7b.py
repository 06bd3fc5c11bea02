"""LLaMA-2-7B shape (6.74B parameters), synthetic tokens until a real tokenizer is set.

    axtrain --config=configs/llm_7b.py --print_config
    axtrain --config=configs/llm_7b.py --mesh=gpu-h100-8
"""

from configs.base import lm_config
from core.config_args import parse_arg
from modules import llama


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  cfg = lm_config(llama.model_node("7b"), max_steps=10_000, learning_rate=3e-4,
                  batch_size=256, seq_len=4096, warmup_steps=2000, data_kind="synthetic")
  cfg.model.remat = "dots_with_no_batch_dims_saveable"
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 1000
  cfg.checkpoint.every_steps = 1000  # a crash loses at most this many steps
  cfg.eval.batch_size = 64
  # Per-mesh settings that fit the global batch of 256 x 4096 (`axtrain plan`, docs/plan.md).
  full, chunk = "full", 1024  # recompute each layer; cross-entropy over 1024-position chunks
  cfg.mesh.rules = (
      (r"tpu-v5p-128|tpu-v6e-64", {"model.remat": full, "trainer.grad_accum_steps": 4,
                                   "trainer.loss_chunk_size": chunk}),
      # FSDP within a host, data parallel across the two (the entry's axes): the gradient
      # all-reduce is the only traffic over the network.
      (r"gpu-h100-8x2", {"model.remat": full, "trainer.grad_accum_steps": 4,
                         "trainer.loss_chunk_size": chunk}),
      (r"neuron-trn2-64", {"model.remat": full, "trainer.grad_accum_steps": 4,
                           "trainer.loss_chunk_size": chunk}),
  )
  return cfg
