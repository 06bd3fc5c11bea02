"""What a device achieves, as fractions of its datasheet peaks: the plan's step-time estimate.

The estimate (planner/plan.py:estimate) walks the compiled step's ops (planner/hlo_ops.py) and
times each at the rate the device reaches on ops of its kind:

    matmul     max(FLOPs / (matmul x peak FLOP/s), its bytes' time); a quantized matmul (int8
               or fp8 operands: model.quantization) at `matmul_quantized` x the chip's int8 /
               fp8 peak (trainer/meshes.py)
    attention  a Pallas / cuDNN attention kernel, whose FLOPs the HLO does not show: its
               FLOPs over the pairs its mask admits (causal, within a sliding window:
               planner/plan.py:attention_call_flops) at `attention` x peak for a forward
               pass; a backward pass takes
               `attention_backward` forward passes. A row's attention figures are one
               kernel's (`attention_kernel`); `kernels` holds those of the other kernels
               timed on that hardware, and the run's implementation picks its own
    the rest   its bytes' time
    bytes      bytes / (memory x HBM bandwidth); where the row times the compiler's alternate
               memory (`alternate_memory`: a TPU's on-chip vector memory, S(1) in the HLO's
               layouts), max(its HBM bytes / (memory x HBM bandwidth), all its bytes /
               (alternate_memory x HBM bandwidth)): bytes in on-chip memory move faster than
               HBM's, though not for free

and adds them (one device runs one op at a time), collectives beside them.

A row is measured on the hardware (what, how, when) or, where no device of that kind has been
lent, assumed from published figures and labelled so. One table serves every planner path:
TPU, GPU and Trainium plans read the row of their hardware.
"""

from __future__ import annotations

import dataclasses
import re

from trainer.meshes import Hardware


# An attention kernel's ops in the compiled HLO (Pallas splash or ours on TPU, cuDNN's fused
# attention on GPU) and which of them run a backward pass.
ATTENTION_KERNEL = re.compile(r"splash|flash|fmha|attention", re.IGNORECASE)
_BACKWARD = re.compile(r"dkv|bwd|backward", re.IGNORECASE)
_FORWARD_ONLY = re.compile(r"dq", re.IGNORECASE)


def kernel_pass(name: str) -> str:
  """An attention kernel op's pass, by its name: "backward", "forward", or "" for a dq kernel
  (its dkv kernel times the pair as one backward pass)."""
  return ("backward" if _BACKWARD.search(name) else "" if _FORWARD_ONLY.search(name)
          else "forward")


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One attention kernel's figures on a row's hardware (Calibration.attention's meaning)."""
  attention: float  # achieved / peak on its forward pass (causal FLOPs)
  attention_backward: float  # its backward pass, in forward passes
  note: str  # how they were measured


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
  matmul: float  # achieved / peak bf16 FLOP/s on the step's matmuls
  attention: float  # achieved / peak on an attention kernel's forward pass (causal FLOPs)
  attention_backward: float  # an attention kernel's backward pass, in forward passes
  memory: float  # achieved / peak HBM bandwidth on memory-bound ops
  source: str  # measured (what, how, when) or assumed (from what)
  measured: bool
  # Bytes/s one device moves between host memory and its own memory inside a compiled program
  # (trainer.state_memory="host": each step reads the state from host memory and writes it
  # back); measured by benchmarks/host_transfer.py where a device was lent. device_to_host 0:
  # the step's writes run beside its update and cost it no time that was measured.
  host_to_device: float = 0.0
  device_to_host: float = 0.0
  transfer_source: str = ""
  # Achieved / peak int8 (TPU) or fp8 (GPU) OP/s on quantized matmuls. None: assumed equal to
  # `matmul` (bf16's share) until a quantized step is measured; `quantized_source` says which.
  matmul_quantized_measured: float | None = None
  quantized_source: str = ""
  # The attention implementation whose kernel `attention` and `attention_backward` were timed
  # on; "" where they are assumed. `attention_note`: what the plan says of them.
  attention_kernel: str = ""
  attention_note: str = ""
  # The kernel's figures come from timing the attention implementation as a whole, the ops
  # around the kernel (its layout's reshapes and copies) included: the plan does not count
  # those ops again (planner/plan.py:estimate).
  attention_wrapper_timed: bool = False
  # Other attention implementations timed on this hardware: name -> their kernel's figures.
  kernels: tuple[tuple[str, Kernel], ...] = ()
  # The rate of an op's bytes in HBM and the alternate memory space together
  # (hlo_ops.Op.alt_bytes), as a multiple of the HBM bandwidth, fitted to ops with operands on
  # chip. 0: the memories are not told apart, every byte moves at `memory` x the HBM bandwidth.
  alternate_memory: float = 0.0
  alternate_source: str = ""

  def bytes_seconds(self, op, hbm_bandwidth: float) -> float:
    """The time of an op's (hlo_ops.Op) memory traffic: its HBM bytes at `memory` x the
    bandwidth; where the row times the alternate memory (on chip, S(1)), all its bytes at no
    more than `alternate_memory` x it."""
    return self.bytes_bound(op, hbm_bandwidth)[0]

  def bytes_bound(self, op, hbm_bandwidth: float) -> tuple[float, str]:
    """(bytes_seconds, what bounds it: "hbm" or "alternate")."""
    if not self.alternate_memory:
      return op.bytes / (self.memory * hbm_bandwidth), "hbm"
    hbm = (op.bytes - op.alt_bytes) / (self.memory * hbm_bandwidth)
    both = op.bytes / (self.alternate_memory * hbm_bandwidth)
    return (hbm, "hbm") if hbm >= both else (both, "alternate")

  def kernel_seconds(self, op, call_flops: float, peak_flops: float) -> float | None:
    """An attention kernel op's (hlo_ops.Op) time: its forward passes of `call_flops` each at
    `attention` x `peak_flops`, a backward pass `attention_backward` of them (dq pairs with
    dkv: one pass); None for an op that is no attention kernel."""
    if op.category != "kernel" or not ATTENTION_KERNEL.search(op.name):
      return None
    pass_ = kernel_pass(op.name)
    passes = self.attention_backward if pass_ == "backward" else float(pass_ == "forward")
    return op.count * passes * call_flops / (self.attention * peak_flops)

  @property
  def matmul_quantized(self) -> float:
    return self.matmul_quantized_measured or self.matmul

  @property
  def quantized_note(self) -> str:
    return self.quantized_source or (f"assumed: the bf16 matmul share ({self.matmul:.2f}) of the "
                                     "int8 / fp8 peak; no quantized step measured")


# One TPU v5e chip (the device tool, 2026-12-05; benchmarks/chip.py, profiles joined op by op
# with the compiled HLO). matmul: 125m at 4 rows (splash, layers unrolled) spent 34.1 ms on 5.42
# TFLOP of matmuls (159 TFLOP/s, 0.81 of 197; some of its matmuls bound by bytes), 0.83 with
# those timed by their bytes. attention: the splash kernel as modules/attn_splash.py sets it up
# (blocks of 1024, keys 512 at a time, fused backward) took 21.2 ms for 12 layers' forward and
# backward of 25.8 GFLOP of causal forward work each (0.22 of peak for a forward pass, the
# backward 1.95 forward passes as timed alone: 2.23 / 0.74 ms and 11.5 / 4.02 ms for 125m's and
# 1b's attention). memory: the memory-bound ops against their bytes in the compiled HLO. Checked
# on the steps measured beside it: 125m at 4 rows 71.3 ms estimated / 68.2 measured, llm_1b at 8
# rows (full remat, Adafactor) 1.262 / 1.244 s, 125m as shipped (64 microbatches) 4.11 / 3.93 s.
# Host transfers: benchmarks/host_transfer.py on the lent chip, 2026-12-06, 2 GiB in 4 arrays
# per direction inside one jitted program (benchmarks/host_transfer_v5e.json): host to device
# 13.9 GB/s. Device to pinned host memory measured 0.56-0.92 GB/s there at every piece size
# (--by_piece_size), but a train step's write-back is not that slow: configs/llm_1b.py cut to 4
# layers (`benchmarks.chip run 1b:--config.model.num_layers=4`, state in host memory, 6.07 GB
# written back a step) measured 16.60 s a step where this row's compute, kernels and
# memory-bound ops give 15.88 s and its 8.10 GB of reads 0.58 s: the writes cost at most the
# 0.13 s left, so they are not counted (device_to_host 0). At 0.66 GB/s they would have been
# 9.2 s, a 25.7 s estimate (+55%). The 16.60 s came from records that each held the next
# step's time (issue 45); timed truly (trainer/step_clock.py, 2026-12-06, steps 2-4 of 4) the
# same setting took 16.59 s, and llm_1b as shipped 46.97 s against this row's 45.83 s (-2%), so
# the row stands.
# pallas_hd64 (modules/attn_pallas_hd64.py, blocks of 512 queries and 512 keys, products
# transposed: the layer's default) against splash as modules/attn_splash.py sets it up, timed side
# by side in one run on the chip (2026-12-06, `bash .chip/on_chip.sh bash
# benchmarks/attention_on_chip.sh --out=$OUT`: 125m's attention, 4 rows, 12 heads, 2048
# positions, 4 documents a row; docs/chip.md): forward 0.6469 / 0.7393 ms, forward and backward
# 1.4382 / 2.316 ms. Its figures are splash's row scaled by those ratios (the row's splash
# figures were timed inside a step, which runs the kernels faster than alone). The ratios time
# each implementation as a whole, the ops around its kernel included, so a run with it does not
# count those ops again (attention_wrapper_timed): 125m as shipped plans at 3.61 s (3.91 s
# with them) against 3.28 s on the chip, llm_1b at 39.4 s (41.1 s) against 36.53-37.46 s.
# alternate_memory: libtpu places many buffers in the chip's on-chip vector memory (S(1) in the
# compiled HLO's layouts: 63% of the bytes of 125m's step at 4 rows); an op whose operands are
# there passes the HBM bandwidth (`python -m benchmarks.chip_ops
# benchmarks/profiles/125m-b4.jsonl`: the 60 longest ops of 125m at 4 rows, bf16 and int8,
# b4d961c, 2026-12-07, profiled through the CLI). The quantizing fusions of int8 moved 134 MB in
# 0.099 ms (1.36 TB/s, 1.66x the HBM's 819 GB/s) and the ops bounded by their HBM bytes ran at
# 0.84 of it; the least-squares fit over the joined ops, memory held at 0.85, gives 1.59x. With
# it (and a gather counted for what it takes, not its whole operand: the loss's take_along_axis
# had counted 1.05 GB of logits), the plan against the chip, bf16 / int8: 125m at 4 rows 57.0 /
# 49.7 ms against 57.68 / 51.46 (63.4 / 61.5 before), 125m as shipped 3.24 / 2.76 s against
# 3.28 / 2.85, llm_1b cut to 4 layers 15.0 / 13.5 s against 14.82 / 13.80 (15.67 before). In
# the same profiles pallas_hd64's kernels took 0.537-0.549 ms forward and 0.720-0.723 ms
# backward a layer (0.24 of peak, 1.33 forward passes), the ops around them are too short to be
# among the 60: whether they cost what the plan leaves out (2.6 ms in 43.9 at 4 rows) waits for
# a profile of every op (benchmarks/chip.py now keeps them).
# matmul_quantized: the int8 matmuls of 125m at 4 rows with int8 (`python -m benchmarks.chip_ops
# benchmarks/profiles/125m-b4-int8.jsonl`: every op of the step, profiled through the CLI at
# c0a1b56, 2026-12-07): the 228 that the plan bounds by their operations did 3.75 T int8 OPs in
# 11.03 ms, 0.86 of the 394 TOP/s peak (time-weighted; the median op 0.92). With bf16's 0.83
# assumed they planned at 11.47 ms, with 0.86 at 11.07 ms.
_SPLASH_V5E = (0.22, 1.95)
_HD64_FORWARD, _HD64_BOTH = 0.6469 / 0.7393, 1.4382 / 2.316


def _scaled(splash: tuple[float, float], forward: float, both: float) -> tuple[float, float]:
  """A kernel's (attention, attention_backward) from splash's and its time ratios to splash's
  forward pass (`forward`) and forward and backward (`both`)."""
  share, backward = splash
  ours = share / forward
  return ours, both * (1 + backward) / share * ours - 1


_V5E = Calibration(
    matmul=0.83, attention=_SPLASH_V5E[0], attention_backward=_SPLASH_V5E[1], memory=0.85,
    measured=True, attention_kernel="splash",
    kernels=(("pallas_hd64", Kernel(*_scaled(_SPLASH_V5E, _HD64_FORWARD, _HD64_BOTH),
                                    note="pallas_hd64's kernel: splash's figures scaled by "
                                         "their times side by side on the chip, 2026-12-06")),),
    matmul_quantized_measured=0.86,
    quantized_source="measured on one TPU v5e chip, 2026-12-07 (125m at 4 rows with int8: every "
                     "op of a profiled step joined with the compiled HLO, benchmarks/chip_ops.py)",
    alternate_memory=1.59,
    alternate_source="measured on one TPU v5e chip, 2026-12-07 (125m at 4 rows, bf16 and int8: "
                     "the profiles' 60 longest ops joined with the compiled HLO)",
    source="measured on one TPU v5e chip, 2026-12-05 (benchmarks/chip.py profiles, "
           "splash kernel timings)",
    host_to_device=13.9e9, device_to_host=0.0,
    transfer_source="measured on one TPU v5e chip, 2026-12-06 (benchmarks/host_transfer.py; "
                    "writes back beside the update, uncounted: llm_1b at 4 layers, chip.py)")

# No GPU has been lent to this project: assumed. matmul: cuBLAS bf16 GEMMs of LLM shapes on
# H100 SXM reach 650-750 of 989 TFLOP/s; attention: cuDNN / FlashAttention-2 forward on
# head_dim 128, 350-450 TFLOP/s (FlashAttention-3 paper, Shah et al. 2024, Fig. 5), backward
# 2.5 forward passes; memory: 80% of HBM bandwidth on fused elementwise ops.
_GPU = Calibration(
    matmul=0.70, attention=0.40, attention_backward=2.5, memory=0.80, measured=False,
    source="assumed for NVIDIA GPUs from published kernel throughput (no GPU measured here)",
    host_to_device=25e9, device_to_host=25e9,
    transfer_source="assumed: 25 GB/s each way, a PCIe 4.0 x16 link's practical rate")

# Trainium: assumed like a GPU's matmul share, no attention kernel in our plans.
_NEURON = Calibration(
    matmul=0.65, attention=0.30, attention_backward=2.5, memory=0.75, measured=False,
    source="assumed for Trainium (no Trainium measured here)",
    host_to_device=25e9, device_to_host=25e9,
    transfer_source="assumed: 25 GB/s each way (no Trainium measured here)")

_V5E_KIND = r"TPU v5 ?lite|TPU v5e"

# (platform, the registry's device_kind of that hardware or None for any, row): first match.
ROWS: tuple[tuple[str, str | None, Calibration], ...] = (
    ("tpu", _V5E_KIND, _V5E),
    ("gpu", None, _GPU),
    ("neuron", None, _NEURON),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostRam:
  """What a training process holds in its host's RAM besides the train state, measured where a
  device was lent: the machine's RAM in use (`free`'s used column, MemTotal - MemAvailable). A
  process's VmRSS counts mappings that `free` does not (31.4 GB in llm_1b's steps on v5e where
  the machine had 20.7 GB in use), so the figures are the machine's. planner/host_ram.py counts
  a run's phases with them (trainer.state_memory=host)."""
  process: float  # bytes in steps beside the state: runtime, imports, programs, data pipeline
  save_over_batch: float  # bytes a save adds over the steps' beyond what it holds at once
  restore_over_batch: float  # bytes a restore adds beyond the state and what it reads at once
  heap_per_code_byte: float  # the compiler's freed heap after an uncached compile, per byte of
  # the train program's generated code (kept until a save's malloc_trim)
  source: str  # where, when, what


# One TPU v5e chip on a host of 40 GiB (the device tool; docs/offload.md), the RAM in use
# (MemTotal - MemAvailable, every second) while configs/llm_1b.py as shipped ran (1.24B
# parameters, AdamW, state in host memory: 14.83 GB of float32 parameters and two moments; its
# largest arrays 1.05-1.07 GB), as a user runs it: benchmarks/whole_run.py at 65dbafe on
# 2026-12-07 (a run stopped after step 2's save, then resumed to step 3), with the save that
# empties each batch's copies once written and the restore that reads a group at a time:
# - process: 22.52 GB in the steps of the resumed run, whose programs came from the
#   compilation cache, less the state: 7.69 GB (f9cb278's cached runs: 21.74 GB);
# - save: 24.82 GB at the peak of the stopped run's save, 2.09 GB over its steps (22.73): its
#   batch (a 1.05 GB array) + 1.04 GB (the resumed run's save: +1.52 GB over its 22.52);
# - restore: 22.26 GB at the peak of the resumed run's restore, below the 22.52 GB its steps
#   then held (f9cb278's restore, whose reads ran ahead of the copies: 29.66 GB): counted as
#   its batch alone, none beyond (the plan's restore phase errs by about 1.3 GB towards
#   refusing);
# - compiler heap: the stopped run compiled its programs itself (the launcher trims the heap
#   after compiling: launcher/session.py:_compile) and held 22.73 GB in steps, 0.21 GB more
#   than the cached run, over its train program's 82.8 MB of code (tests/testdata/plans): 2.5
#   bytes of heap per byte of code (f9cb278: 0.81 GB, 9.8; 46.1 before that trim). The compile
#   itself peaked at 11.5 GB, before the state existed (not counted: below the steps').
# Again at 2b5f0ef (2026-12-07, the copies written in blocks of rows): steps 22.0-22.74 GB,
# saves +1.66 to +2.55 GB over them (the stopped run's 24.81 GB), the early restore's peak
# 22.45 GB: the figures stand. A host-memory save now streams large arrays without a whole
# copy (trainer/checkpoint_blocks.py): at f2e5e1d (2026-12-07, 64 MiB blocks) llm_1b's saves
# rose +1.27 and +1.22 GB over steps of 22.81 and 22.20 GB (peaks 24.08 and 23.42 GB), and its
# early restore peaked at 22.14 GB, under its steps. At 359c6ef (2026-12-07, 32 MiB blocks;
# its layers unrolled on one chip, configs/llama.py's TPU rule, so every array over a block is
# streamed: a save holds three blocks, 0.10 GB) its saves rose +0.18 and +0.26 GB (peaks 22.94
# and 22.45 GB over steps of 22.76 and 22.19 GB): 0.16 GB beyond the blocks. Its restore,
# reading 0.26 GB at once (blocks of 64 MiB, four at a time), peaked at 22.73 GB beside its
# compile: none beyond what it reads, over the steps' 22.52 GB.
_V5E_HOST = HostRam(
    process=22.52e9 - 14.83e9, save_over_batch=0.26e9 - 3 * 32 * 2**20,
    restore_over_batch=0.0, heap_per_code_byte=(22.73e9 - 22.52e9) / 82.8e6,
    source="one TPU v5e chip's host of 40 GiB, 2026-12-07: llm_1b as shipped, stopped and "
           "resumed (benchmarks/whole_run.py; planner/calibration.py)")


def host_ram_for(hw: Hardware) -> HostRam | None:
  """The host RAM figures for `hw`'s platform; None where no device of it was lent (GPU,
  Trainium). Every TPU takes those measured on v5e's host, labelled so on other generations."""
  if hw.platform != "tpu":
    return None
  if hw.device_kind == _V5E_KIND:
    return _V5E_HOST
  return dataclasses.replace(_V5E_HOST, source=f"v5e's ({_V5E_HOST.source}); not measured on "
                                               f"this TPU generation")


def for_hardware(hw: Hardware, *, attention: str | None = None) -> Calibration:
  """The row for `hw`: its own where measured; another TPU generation takes v5e's fractions,
  labelled as such. `attention`: the run's attention implementation; one that the row timed
  among its `kernels` is planned at its own figures, and `attention_note` says so."""
  row = _row(hw)
  kernel = dict(row.kernels).get(attention or "")
  if kernel is not None:
    row = dataclasses.replace(row, attention=kernel.attention,
                              attention_backward=kernel.attention_backward,
                              attention_kernel=attention, attention_note=kernel.note,
                              attention_wrapper_timed=True)
  return row


def _row(hw: Hardware) -> Calibration:
  for platform, kind, row in ROWS:
    if platform == hw.platform and kind in (None, hw.device_kind):
      return row
  if hw.platform == "tpu":
    return dataclasses.replace(_V5E, source=f"v5e's fractions ({_V5E.source}); not measured "
                                            f"on this TPU generation", measured=False)
  return dataclasses.replace(_GPU, source=f"assumed ({hw.platform}: no row of its own)",
                             measured=False)
