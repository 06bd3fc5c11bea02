"""Mixtral-8x7B shape (46.7B parameters, 12.9B active per token), synthetic tokens until a real
tokenizer is set.

    axtrain --config=configs/mixtral_8x7b.py --print_config
    axtrain plan --config=configs/mixtral_8x7b.py --mesh=tpu-v5p-128                  # expert=8
    axtrain plan --config=configs/mixtral_8x7b.py --mesh=tpu-v5p-128 --config.mesh.expert=1

The shape is mistralai/Mixtral-8x7B-v0.1's config.json: hidden_size 4096, 32 layers, 32 query
and 8 key/value heads, 8 SwiGLU experts of intermediate_size 14336 (num_local_experts),
num_experts_per_tok 2, vocab_size 32000 (untied), rope_theta 1e6, rms_norm_eps 1e-5,
router_aux_loss_coef 0.02. Mistral AI states 46.7B parameters in total and 12.9B used per
token ("Mixtral of experts", 11 Dec 2023; tests/test_families.py checks both). Mixtral itself
was trained dropless; here each expert takes 1.25 x its even share of a sequence's tokens
(modules/moe.py). The training recipe (batch, rate, context) is ours: Mistral published none.
On a v5p slice the experts go one per device group of `expert`=8 (expert parallelism, docs/
parallelism.md); the rest of the mesh is FSDP.
"""

from configs.base import lm_config
from core.config_args import parse_arg
from core.registry import registry
from modules import llama

SHAPE = llama.Size(dim=4096, num_layers=32, num_heads=32, num_kv_heads=8, hidden_dim=14_336,
                   vocab_size=32_000, rope_theta=1_000_000.0, tie_embeddings=False,
                   norm_eps=1e-5)
NUM_EXPERTS, TOP_K = 8, 2


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  model = llama.node(SHAPE)
  model.block.ffn = registry("ffn").node(
      "moe", num_experts=NUM_EXPERTS, top_k=TOP_K, hidden_dim=SHAPE.hidden_dim, activation="silu",
      gated=True, capacity_factor=1.25, renormalize=True, aux_loss_coef=0.02)
  model.remat = "full"  # recompute each layer in the backward pass
  cfg = lm_config(model, max_steps=10_000, learning_rate=3e-4, batch_size=256, seq_len=4096,
                  warmup_steps=2000, data_kind="synthetic")
  cfg.trainer.log_every = 10
  cfg.trainer.loss_chunk_size = 1024  # cross-entropy over 1024-position chunks
  cfg.eval.every_steps = 1000
  cfg.eval.batch_size = 64
  cfg.checkpoint.every_steps = 1000  # a crash loses at most this many steps
  cfg.mesh.rules = (
      # Whole experts on groups of 8 chips (one expert each), FSDP over the rest of the slice.
      (r"tpu-v5p-.*", {"mesh.expert": NUM_EXPERTS}),
  )
  return cfg
