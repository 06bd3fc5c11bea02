"""LLaMA-style decoders at every size of modules/llama.py's table, one training recipe per size.

    axtrain --config=configs/llama.py:size=test                  # 0.11M, trains on CPU in seconds
    axtrain --config=configs/llama.py:size=125m --print_config
    axtrain --config=configs/llama.py:size=8b --mesh=gpu-h100-8x4

`test` and `tiny` (byte vocabulary) train the demo's recipe (configs/tiny.py) on the
embedded corpus; the others train on synthetic tokens, packed into documents as a corpus
would be, until a real tokenizer and corpus are set (README "Your own data"). Sizes: test, tiny, 125m, 1b, 3b, 7b, 8b, 70b.
"""

from __future__ import annotations

import dataclasses

from configs import tiny
from configs.base import lm_config
from core.config_args import Needed, choice, parse_arg
from modules import llama


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
  batch_size: int  # sequences per step
  seq_len: int  # tokens per sequence
  learning_rate: float  # peak, after warm-up
  warmup_steps: int  # optimizer steps
  remat: str = "none"  # model.remat: what the backward pass recomputes
  state_dtype: str = "float32"  # optimizer.state_dtype
  # mesh.rules: per-mesh settings that fit the global batch (`axtrain plan`, docs/plan.md),
  # matched by hardware facts (trainer/mesh_match.py:MATCH_FACTS), so a new entry of the same
  # hardware takes them with no edit here
  mesh_rules: tuple = ()


_FULL = "full"  # recompute each layer


def _gpu_hosts(hosts: int) -> dict:
  """A rule's match: `hosts` hosts of 8 GPUs with at least 80 GB each (A100-80GB, H100, H200,
  B200, or any later entry of that shape)."""
  return {"platform": "gpu", "devices_per_host": 8, "num_hosts": hosts, "min_hbm_gb": 80}


def _fit(chunk: int, **changes) -> dict:
  """A mesh rule's changes: full remat, cross-entropy over `chunk`-position chunks, `changes`."""
  return {"model.remat": _FULL, "trainer.loss_chunk_size": chunk, **changes}


def _rows(n: int) -> dict:
  """Each device computes `n` rows of a train or eval batch at a time (the accumulation follows
  from the device count: trainer.microbatch_rows, eval.microbatch_rows)."""
  return {"trainer.microbatch_rows": n, "eval.microbatch_rows": n}


# A TPU chip of 16 GiB (v5e, and any later entry of that size) ...
_TPU_16GB = {"platform": "tpu", "max_hbm_gb": 20}
# ... and one alone: the whole model, its gradients and optimizer state on it.
_ONE_TPU_16GB = {**_TPU_16GB, "num_devices": 1}
# What trains fastest on a TPU chip (measured on one v5e, benchmarks/chip.py): layers unrolled (a
# scanned stack spends ~10% of 125m's step stacking and slicing per-layer buffers) and a Pallas
# attention kernel: our own for head_dim 64 (125m as shipped: 3.28 s a step, MFU 0.717, against
# splash's 3.93 s, 0.598; docs/chip.md).
_TPU_FAST = {"model.block.attention.implementation": "pallas_hd64", "model.scan_layers": False}


# 125m: GPT-3 Small's 0.5M-token batches and peak rate (Brown et al. 2020, Table 2.1).
# 1b, 3b: LLaMA-3.2's 2k pre-training context at our 1b rate; 7b: LLaMA-2's 4k context;
# 8b, 70b: LLaMA-3's 8k context, 70b at half the rate with bfloat16 optimizer state.
RECIPES: dict[str, Recipe] = {
    "125m": Recipe(batch_size=256, seq_len=2048, learning_rate=6e-4, warmup_steps=700,
                   mesh_rules=(
        # 4 sequences per chip at a time, nothing recomputed: 9.8 GiB on one v5e chip.
        (_TPU_16GB, {**_rows(4), **_TPU_FAST}),
    )),
    "1b": Recipe(batch_size=256, seq_len=2048, learning_rate=3e-4, warmup_steps=1000, mesh_rules=(
        # One 16 GiB chip cannot hold float32 parameters, AdamW's two moments and the float32
        # gradient sum (18.4 GiB): the parameters and AdamW state live in host memory, the
        # microbatches run on bfloat16 weights (docs/offload.md), 2 rows at a time keeping the
        # matmuls' outputs for the backward (the best of `axtrain plan --sweep`, docs/plan.md:
        # 36.5 s a step on one v5e, MFU 0.60, against 47.0 s and 0.47 with 8 rows, full remat and
        # splash). Evaluation, with nothing kept for a backward, takes 8 rows at a time.
        (_ONE_TPU_16GB, {"trainer.state_memory": "host", **_fit(256), **_TPU_FAST,
                          "model.remat": "dots_with_no_batch_dims_saveable",
                          "trainer.microbatch_rows": 2, "eval.microbatch_rows": 8}),
        ({"platform": "tpu"}, _fit(256, **_rows(4))),
        (_gpu_hosts(1), _fit(256, **{"trainer.grad_accum_steps": 8})),
        # Several such hosts (the launch examples' gpu-h100-8x2 and 8x4): the same recipe, 4 rows
        # per GPU at a time, as one host's 8 microbatches are (7.8 GiB per GPU on gpu-h100-8x2).
        ({"platform": "gpu", "devices_per_host": 8, "min_num_hosts": 2, "min_hbm_gb": 80},
         _fit(256, **_rows(4))),
        ({"platform": "neuron", "devices_per_host": 32}, _fit(256, **_rows(2))),
    )),
    "3b": Recipe(batch_size=256, seq_len=2048, learning_rate=3e-4, warmup_steps=1000,
                 remat="dots_with_no_batch_dims_saveable"),
    "7b": Recipe(batch_size=256, seq_len=4096, learning_rate=3e-4, warmup_steps=2000,
                 remat="dots_with_no_batch_dims_saveable", mesh_rules=(
        ({"platform": "tpu", "min_num_devices": 64}, _fit(1024, **_rows(1))),
        # Fewer 16 GiB chips (one v5e host of 8): the float32 parameters and AdamW state (10.1
        # GiB per chip under FSDP) live in host memory (48 GB per chip), each chip's
        # microbatches run on its bfloat16 shard of the weights (docs/offload.md).
        ({"platform": "tpu", "max_hbm_gb": 20, "min_host_memory_gb": 40},
         {"trainer.state_memory": "host", **_fit(1024, **_rows(1))}),
        # Two H100 hosts: the best layout of `axtrain plan --sweep` with XLA's GPU compiler
        # (docs/plan.md): data parallel across the hosts, FSDP over 4 and tensor parallel over
        # 2 inside each; matmul outputs kept (little recompute), 8 microbatches.
        (_gpu_hosts(2), {"mesh.data": 2, "mesh.fsdp": 4, "mesh.model": 2,
                         "model.remat": "dots_with_no_batch_dims_saveable",
                         "trainer.grad_accum_steps": 8, "trainer.loss_chunk_size": 1024}),
        ({"platform": "neuron", "devices_per_host": 64, "num_hosts": 1},
         _fit(1024, **_rows(1))),
    )),
    "8b": Recipe(batch_size=256, seq_len=8192, learning_rate=3e-4, warmup_steps=2000,
                 remat="dots_with_no_batch_dims_saveable"),
    "70b": Recipe(batch_size=1024, seq_len=8192, learning_rate=1.5e-4, warmup_steps=2000,
                  remat="full", state_dtype="bfloat16", mesh_rules=(
        # FSDP over every host, tensor parallel (model=8) within one, one sequence per device
        # at a time; cross-entropy over 512-position chunks.
        ({"platform": "tpu", "min_num_devices": 256},
         {"mesh.data": 1, "mesh.fsdp": -1, "mesh.model": 8, **_rows(1),
          "trainer.loss_chunk_size": 512}),
        # 16 H100 hosts: the best layout of `axtrain plan --sweep` with XLA's GPU compiler
        # (docs/plan.md): tensor parallel over 4 GPUs of a host, FSDP over 32 across the
        # hosts, 16 microbatches of 2 sequences per fsdp group; q/k/v and attention outputs
        # kept. HSDP (FSDP inside a host) does not fit: a host's share of the float32
        # parameters and bfloat16 Adam state is 70.6 GB per GPU before any gradient.
        (_gpu_hosts(16), {"mesh.data": 1, "mesh.fsdp": 32, "mesh.model": 4,
                          "model.remat": "save_attn_out", "trainer.grad_accum_steps": 16,
                          "trainer.loss_chunk_size": 512}),
        ({"platform": "neuron", "min_num_devices": 512},
         {"mesh.data": 1, "mesh.fsdp": -1, "mesh.model": 8, **_rows(1),
          "trainer.loss_chunk_size": 512}),
    )),
}
DEMO_SIZES = ("test", "tiny")  # byte vocabulary: configs/tiny.py's recipe
# The values of each argument (tests/test_golden_configs.py keeps a golden file for each).
CHOICES = {"size": llama.SIZES}


def get_config(arg=None):
  args = parse_arg(arg, size=Needed(f"one of {', '.join(CHOICES['size'])}"))
  size = choice("size", args["size"], CHOICES["size"])
  if size in DEMO_SIZES:
    cfg = tiny.get_config()
    cfg.model = llama.model_node(size)
    cfg.model.scan_layers = False  # a few layers: unrolled runs faster on CPU
    return cfg
  r = RECIPES[size]
  cfg = lm_config(llama.model_node(size), max_steps=10_000, learning_rate=r.learning_rate,
                  batch_size=r.batch_size, seq_len=r.seq_len, warmup_steps=r.warmup_steps,
                  data_kind="synthetic")
  # Packed like a corpus (positions, segment ids): `axtrain plan` compiles the step of a real run.
  cfg.data.mean_doc_len = 1024  # tokens per synthetic document, on average
  cfg.model.remat = r.remat
  cfg.optimizer.state_dtype = r.state_dtype
  cfg.trainer.log_every = 10
  cfg.eval.every_steps = 1000
  cfg.checkpoint.every_steps = 1000  # a crash loses at most this many steps
  cfg.eval.batch_size = 64
  cfg.mesh.rules = r.mesh_rules
  return cfg
