"""`axtrain plan --sweep`: try mesh axes, remat policies and gradient accumulation that keep the
global batch; screen them with the analytic memory model, compile the likeliest (trainer/plan.py)
and rank those that fit by estimated step time.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from core.registry import ConfigError
from trainer import experiment as experiment_lib, flops as flops_lib, memory_model
from trainer import plan as plan_lib, plan_report
from trainer.config import RunConfig
from trainer.meshes import Entry

REMAT_SWEEP = ("none", "save_attn_out", "full")


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


def candidates(run: RunConfig, num_devices: int) -> list[Candidate]:
  """Every data x fsdp x expert x model factorisation (expert: divisors of the MoE layers'
  num_experts, 1 for a dense model), remat policy and accumulation that keeps the global
  batch: microbatches divide over the data, fsdp and expert axes."""
  out = []
  divisors = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
  experts = flops_lib.find_field(run.model, "num_experts") or 1
  batch = run.data.batch_size
  for model in divisors:
    for expert in (d for d in divisors if (num_devices // model) % d == 0 and experts % d == 0):
      for fsdp in (d for d in divisors if (num_devices // model // expert) % d == 0):
        data = num_devices // model // expert // fsdp
        for accum in (a for a in (1, 2, 4, 8, 16) if batch % a == 0):
          if (batch // accum) % (data * fsdp * expert):
            continue
          for remat in REMAT_SWEEP:
            out.append(Candidate(axes={"data": data, "fsdp": fsdp, "expert": expert,
                                       "model": model}, remat=remat, grad_accum_steps=accum))
  return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepResult:
  ranked: list  # [(Candidate, Plan)] that fit, fastest estimate first
  rejected: list  # [(Candidate, reason)]
  skipped: int  # candidates left when the time budget ran out


def sweep(run: RunConfig, entry: Entry, *, config_name: str, devices=None,
          budget_s: float = 1800.0, limit: int = 12, margin: float = 0.05,
          progress=None) -> SweepResult:
  """Ranks the candidates that fit by estimated step time.

  The analytic model screens every candidate first (no compile); those it puts within 1.5x
  of the usable memory compile in order of fewest recomputed FLOPs and accumulation steps,
  at most `limit` of them and until `budget_s` seconds have passed.
  """
  if devices is None:
    devices, _ = plan_lib.target_devices(entry)
  usable = (entry.hardware.hbm_bytes or 0) * (1 - margin)
  screened, rejected = [], []
  for cand in candidates(run, len(devices)):
    try:
      exp = experiment_lib.build(cand.apply(run), entry, devices)
    except ConfigError as e:
      rejected.append((cand, str(e)))
      continue
    dtype = experiment_lib.compute_dtype(run.trainer.compute_dtype, entry.hardware.platform)
    total = memory_model.analytic_memory(exp, compute_bytes=np.dtype(dtype).itemsize).total
    if total > 1.5 * usable:
      rejected.append((cand, f"analytic model: {plan_report.gib(total)} per device"))
    else:
      screened.append(cand)
  order = {name: i for i, name in enumerate(REMAT_SWEEP)}
  screened.sort(key=lambda c: (order[c.remat], c.grad_accum_steps, c.axes["model"],
                               -c.axes["fsdp"]))
  start, fitting, compiled = time.perf_counter(), [], 0
  for cand in screened:
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
  fitting.sort(key=lambda cp: cp[1].estimate.step_s if cp[1].estimate else float("inf"))
  return SweepResult(ranked=fitting, rejected=rejected, skipped=len(screened) - compiled)


def sweep_text(result: SweepResult) -> str:
  lines = [f"sweep: {len(result.ranked)} fitting, {len(result.rejected)} rejected, "
           f"{result.skipped} not compiled (budget)"]
  for i, (cand, p) in enumerate(result.ranked):
    step = plan_report.secs(p.estimate.step_s) if p.estimate else "no estimate"
    lines.append(f"  {i + 1}. step {step} (estimate), needs {plan_report.gib(p.needed)}: "
                 f"{cand.flags()}")
  if result.ranked:
    lines.append(f"best: {result.ranked[0][0].flags()}")
  return "\n".join(lines) + "\n"
