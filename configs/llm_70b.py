"""LLaMA-3-70B shape (70.55B parameters), synthetic tokens until a real tokenizer is set.

    axtrain --config=configs/llm_70b.py --print_config
    axtrain --config=configs/llm_70b.py --mesh=tpu-v5p-1024
    axtrain plan --config=configs/llm_70b.py --mesh=gpu-h100-8x16
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
  # Per-mesh settings that fit the global batch of 1024 x 8192 (`axtrain plan`, docs/plan.md):
  # FSDP over every host, tensor parallel (model=8) within one, one or two sequences per
  # device per microbatch.
  chunk = 512  # cross-entropy over 512-position chunks
  cfg.mesh.rules = (
      (r"tpu-v5p-512", {"mesh.data": 1, "mesh.fsdp": 32, "mesh.model": 8,
                        "trainer.grad_accum_steps": 32, "trainer.loss_chunk_size": chunk}),
      (r"tpu-v5p-1024", {"mesh.data": 1, "mesh.fsdp": 64, "mesh.model": 8,
                         "trainer.grad_accum_steps": 16, "trainer.loss_chunk_size": chunk}),
      (r"gpu-h100-8x16", {"mesh.data": 1, "mesh.fsdp": 16, "mesh.model": 8,
                          "trainer.grad_accum_steps": 32, "trainer.loss_chunk_size": chunk}),
      (r"neuron-trn2-64x8", {"mesh.data": 1, "mesh.fsdp": 64, "mesh.model": 8,
                             "trainer.grad_accum_steps": 16, "trainer.loss_chunk_size": chunk}),
  )
  return cfg
