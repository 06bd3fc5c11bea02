"""`axtrain plan --sweep`: try mesh axes, remat policies and gradient accumulation that keep the
global batch; screen them with the analytic memory model, compile the likeliest (planner/plan.py)
and rank those that fit by estimated step time.

The layouts of multi-host GPU and Trainium entries keep tensor parallelism (`model`) inside a
host; `data` spans hosts first, then `fsdp` (trainer/sharding.py:device_grid), so that
data=HOSTS, fsdp=DEVICES_PER_HOST is hybrid sharding (HSDP: FSDP inside a host, data parallel
across hosts) and a larger fsdp spans hosts. Accumulation runs from one microbatch up to one
sequence per batch shard: fewer, larger microbatches gather the FSDP-sharded weights fewer times.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from core.registry import ConfigError
from planner import memory_model, plan as plan_lib, plan_report
from trainer import experiment as experiment_lib, flops as flops_lib, sharding
from trainer.config import RunConfig
from trainer.meshes import AXES, Entry

# Most recompute last: none, only the matmul outputs recomputed never, the q/k/v projections
# and attention output kept, every layer recomputed.
REMAT_SWEEP = ("none", "dots_with_no_batch_dims_saveable", "save_attn_out", "full")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
  axes: dict  # data / fsdp / expert / model sizes
  remat: str
  grad_accum_steps: int

  def flags(self) -> str:
    return " ".join([*(f"--config.mesh.{a}={n}" for a, n in self.axes.items()),
                     f"--config.model.remat={self.remat}",
                     f"--config.trainer.grad_accum_steps={self.grad_accum_steps}"])

  def apply(self, run: RunConfig) -> RunConfig:
    mesh = dataclasses.replace(run.mesh, **self.axes)
    model = dataclasses.replace(run.model, remat=self.remat)
    trainer = dataclasses.replace(run.trainer, grad_accum_steps=self.grad_accum_steps)
    return dataclasses.replace(run, mesh=mesh, model=model, trainer=trainer)


def hosts_spanned(axes: dict, entry: Entry) -> int:
  """How many hosts one fsdp group spans (1: HSDP, FSDP inside a host)."""
  if entry.topology is not None or entry.num_hosts <= 1:
    return 1
  outer = sharding.split_outer(tuple(axes.get(a, 1) for a in AXES), entry.num_hosts)
  return outer[AXES.index("fsdp")] if outer else entry.num_hosts


def candidates(run: RunConfig, num_devices: int, entry: Entry | None = None) -> list[Candidate]:
  """Every data x fsdp x expert x model factorisation (expert: divisors of the MoE layers'
  num_experts, 1 for a dense model; with several GPU/Trainium hosts: model inside one), remat
  policy and power-of-two accumulation that keeps the global batch: each microbatch divides
  over the data, fsdp and expert axes."""
  out = []
  divisors = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
  multi_host = entry is not None and entry.topology is None and entry.num_hosts > 1
  experts = flops_lib.find_field(run.model, "num_experts") or 1
  batch = run.data.batch_size
  accums = [a for a in (2 ** k for k in range(batch.bit_length())) if batch % a == 0]
  for model in divisors:
    if multi_host and entry.hardware.devices_per_host % model:
      continue  # tensor parallel across hosts: its per-layer collectives on the network
    for expert in (d for d in divisors if (num_devices // model) % d == 0 and experts % d == 0):
      for fsdp in (d for d in divisors if (num_devices // model // expert) % d == 0):
        data = num_devices // model // expert // fsdp
        for accum in accums:
          if (batch // accum) % (data * fsdp * expert):
            continue
          for remat in REMAT_SWEEP:
            out.append(Candidate(axes={"data": data, "fsdp": fsdp, "expert": expert,
                                       "model": model}, remat=remat, grad_accum_steps=accum))
  return out


def screen_estimate(exp: experiment_lib.Experiment, entry: Entry, *, compute_bytes: int
                    ) -> tuple[float, float]:
  """(overlapped, serial) seconds of a step by an analytic model, without compiling: the order
  in which the sweep compiles (its ranking reads the compiled HLO). Collectives per microbatch:
  each pass (forward, backward) all-gathers the fsdp-sharded matmul weights and the backward
  reduce-scatters their gradient; per layer and pass, tensor parallelism all-reduces the
  activations twice (attention and MLP outputs), a third pass under remat; data parallelism
  all-reduces the gradient shards. Groups that span hosts go at the network bandwidth."""
  hw, run = entry.hardware, exp.run
  if not (hw.peak_bf16_flops and hw.hbm_bandwidth and hw.link_bandwidth):
    return 0.0, 0.0
  mesh = dict(exp.mesh.shape)
  data, fsdp, model = mesh["data"], mesh["fsdp"], mesh["model"]
  n, accum, seq = int(np.prod(list(mesh.values()))), run.trainer.grad_accum_steps, exp.source.seq_len
  params = exp.abstract_state.params
  top_k = flops_lib.find_field(run.model, "top_k")
  shape = memory_model.model_shape(params, top_k=top_k)
  weights = flops_lib.count(params, seq_len=seq, top_k=top_k).matmul_params * compute_bytes
  remat = getattr(run.model, "remat", "none")
  passes = 2 if remat == "none" else 3
  tokens = exp.source.batch_size * seq
  compute = (flops_lib.model_flops_per_token(run, params) * tokens / n
             * plan_lib.RECOMPUTE.get(remat, 4 / 3) / hw.peak_bf16_flops)
  analytic = memory_model.analytic_memory(exp, compute_bytes=compute_bytes)
  hbm = memory_model.hbm_traffic(exp, analytic, compute_bytes=compute_bytes) / hw.hbm_bandwidth
  share = lambda g: (g - 1) / g
  fsdp_bytes = accum * 3 * weights / model * share(fsdp)
  tp_bytes = (2 * passes * shape.layers * 2 * share(model) * tokens / (n // model)
              * shape.dim * compute_bytes)
  dp_bytes = accum * 2 * share(data) * weights / (model * fsdp)
  spans = hosts_spanned(mesh, entry) > 1
  host_bw = hw.host_bandwidth or hw.link_bandwidth
  network = (fsdp_bytes if spans else 0.0) + (dp_bytes if entry.num_hosts > 1 else 0.0)
  links = fsdp_bytes + tp_bytes + dp_bytes - network
  collectives = links / hw.link_bandwidth + network / host_bw
  return max(compute, hbm, collectives), max(compute, hbm) + collectives


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepResult:
  ranked: list  # [(Candidate, Plan)] that fit, fastest estimate first
  rejected: list  # [(Candidate, reason)]
  skipped: int  # candidates left when the time budget ran out


def sweep(run: RunConfig, entry: Entry, *, config_name: str, devices=None,
          budget_s: float = 1800.0, limit: int = 12, margin: float = 0.05,
          progress=None) -> SweepResult:
  """Ranks the candidates that fit by estimated step time (overlapped, then serial).

  The analytic model screens every candidate first (no compile); those it puts within 1.5x
  of the usable memory compile, those it puts within the usable memory first, each group
  fastest first by `screen_estimate`; at most `limit` of them and until `budget_s` seconds
  have passed.
  """
  if devices is None:
    devices, _ = plan_lib.target_devices(entry)
  usable = (entry.hardware.hbm_bytes or 0) * (1 - margin)
  dtype = experiment_lib.compute_dtype(run.trainer.compute_dtype, entry.hardware.platform)
  screened, rejected, built = [], [], {}
  for cand in candidates(run, len(devices), entry):
    key = tuple(cand.axes.items())
    if key not in built:  # shapes and shardings depend on the mesh only
      try:
        built[key] = experiment_lib.build(cand.apply(run), entry, devices)
      except ConfigError as e:
        built[key] = str(e)
    if isinstance(built[key], str):
      rejected.append((cand, built[key]))
      continue
    exp = dataclasses.replace(built[key], run=cand.apply(run))
    c = np.dtype(dtype).itemsize
    total = memory_model.analytic_memory(exp, compute_bytes=c).total
    if total > 1.5 * usable:
      rejected.append((cand, f"analytic model: {plan_report.gib(total)} per device"))
    else:
      screened.append(((total > usable, *screen_estimate(exp, entry, compute_bytes=c)), cand))
  screened.sort(key=lambda kc: kc[0])
  start, fitting, compiled = time.perf_counter(), [], 0
  for _, cand in screened:
    if compiled >= limit or time.perf_counter() - start > budget_s:
      break
    p = plan_lib.plan(cand.apply(run), entry, config_name=config_name, devices=devices,
                      margin=margin, with_eval=False)
    compiled += 1
    if progress:
      progress(cand, p)
    if p.fits:
      fitting.append((cand, p))
    else:
      rejected.append((cand, f"short by {plan_report.gib(-p.headroom)}"))
  fitting.sort(key=lambda cp: (cp[1].estimate.step_s, cp[1].estimate.serial_s)
               if cp[1].estimate else (float("inf"),) * 2)
  return SweepResult(ranked=fitting, rejected=rejected, skipped=len(screened) - compiled)


def sweep_text(result: SweepResult) -> str:
  lines = [f"sweep: {len(result.ranked)} fitting, {len(result.rejected)} rejected, "
           f"{result.skipped} not compiled (budget)"]
  for i, (cand, p) in enumerate(result.ranked):
    e = p.estimate
    step = (f"step {plan_report.secs(e.step_s)} overlapped, {plan_report.secs(e.serial_s)} "
            f"serial, MFU {e.mfu:.2f} / {e.mfu_serial:.2f}" if e else "no estimate")
    lines.append(f"  {i + 1}. {step} (estimate), needs {plan_report.gib(p.needed)}: "
                 f"{cand.flags()}")
  if result.ranked:
    lines.append(f"best: {result.ranked[0][0].flags()}")
  return "\n".join(lines) + "\n"
