"""`axtrain plan --sweep`: the settings that keep the run's math (planner/sweep_space.py),
screened with the analytic memory model and compiled in the order of an analytic step estimate
(planner/sweep_screen.py), ranked, those that fit, by the plan's estimate (planner/plan.py).
What one compile implies about others (`implied`) is left out; the best setting's eval step gets
the fewest passes that fit (`eval_fit`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

from core.registry import ConfigError
from planner import memory_model, plan as plan_lib, plan_report
from planner.sweep_screen import screen, with_scan_twins
from planner.sweep_space import (ACCUM, ATTENTION_ORDER, EVAL_ROWS, KIND, REMAT, REMAT_ORDER,
                                 SCAN, STATE_DTYPE, STATE_MEMORY, Candidate, attention_path,
                                 candidates, effective_chunk, memory_candidates, normalized,
                                 replace_path, with_run)
from trainer import experiment as experiment_lib, metrics as metrics_lib, sharding
from trainer.config import RunConfig
from trainer.meshes import Entry

# --- what a compiled result implies -------------------------------------------------------

def _lean(cand: Candidate, run: RunConfig, path: str | None) -> tuple | None:
  """How far each knob of `cand` goes toward less memory: (accumulation, remat rank, chunks per
  sequence, attention rank, bfloat16 state, state in host memory); None for a remat policy
  outside REMAT_ORDER."""
  remat = cand.get(REMAT, run)
  if remat not in REMAT_ORDER:
    return None
  seq = run.data.seq_len
  return (cand.grad_accum_steps or cand.get(ACCUM, run), REMAT_ORDER.index(remat),
          seq // effective_chunk(cand, run),
          ATTENTION_ORDER.get(cand.get(path, run) if path else None, 0),
          int(cand.get(STATE_DTYPE, run) == "bfloat16"),
          int(cand.get(STATE_MEMORY, run) == "host"))


def implied(cand: Candidate, *, missed: list, fitted: list, run: RunConfig) -> str:
  """Why `cand` need not compile ("" when it must): a compiled setting of the same layout,
  model.scan_layers and optimizer that did not fit holds at least as little memory on every
  knob; or one that fit, with the same attention too, holds no less on any (more accumulation,
  recompute or loss chunks only slow a step down). Assumes that each knob's leaner value never
  needs more memory."""
  path = attention_path(run)
  lean = _lean(cand, run, path)
  if lean is None:
    return ""
  same = lambda o, *ps: o.axes == cand.axes and all(o.get(p, run) == cand.get(p, run)
                                                     for p in ps if p)
  for other in missed:
    o = _lean(other, run, path)
    if o is not None and same(other, SCAN, KIND) and all(a <= b for a, b in zip(lean, o)):
      return f"no leaner than {other.flags() or 'the config as given'}, which does not fit"
  for other in fitted:
    o = _lean(other, run, path)
    if o is not None and same(other, path, SCAN, STATE_DTYPE, KIND) and all(
        a >= b for a, b in zip(lean, o)):
      return f"no faster than {other.flags() or 'the config as given'}, which fits"
  return ""


# --- compiling ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalFit:
  """The eval step of the best setting: the fewest passes (eval.microbatch_rows) that fit."""
  rows: int  # eval.microbatch_rows: rows per device and pass (0: the whole batch at once)
  passes: int  # device passes per eval batch
  needed: int | None  # bytes per device: the compiler's peak or the analytic model's
  # (`source`); None where the compiler refused the step for memory
  fits: bool
  source: str  # "TPU compiler", "GPU compiler" or "model"
  compiles: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepResult:
  ranked: list  # [(Candidate, Plan)] that fit, fastest estimate first
  rejected: list  # [(Candidate, reason)]
  skipped: int  # candidates left when the time budget or the compile limit ran out
  mode: str = "layout"  # "layout" or "memory: <why>"
  implied: list = dataclasses.field(default_factory=list)  # [(Candidate, why)] not compiled
  eval: EvalFit | None = None  # the best setting's eval step (None: not checked)
  best: Candidate | None = None  # ranked[0]'s, with the eval rows its eval step needs


def _compile_plan(cand: Candidate, run: RunConfig, entry: Entry, devices, *, config_name: str,
                  margin: float):
  """The candidate's plan (train step), or the reason it cannot compile."""
  try:
    return plan_lib.plan(cand.apply(run), entry, config_name=config_name, devices=devices,
                         margin=margin, with_eval=False)
  except ConfigError as e:
    return str(e)
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return "the compiler ran out of device memory"


def twin_next(queue: list[Candidate], cand: Candidate, run: RunConfig) -> list[Candidate]:
  """`queue` with the scan_layers twin of `cand` (which fits) first: the compiled estimate can
  rank them apart (a scanned stack stacks and slices per-layer buffers; unrolled layers do
  not)."""
  scan = cand.get(SCAN, run)
  twin = cand.with_knob(SCAN, not scan) if scan is not None else None
  return [twin] + [c for c in queue if c != twin] if twin in queue else queue


def compile_in_order(order: list[Candidate], run: RunConfig, entry: Entry, devices, *,
                     config_name: str, budget_s: float, limit: int, margin: float,
                     progress=None, say: Callable[[str], None] = lambda _: None
                     ) -> tuple[list, list, list, int]:
  """(fitting [(Candidate, Plan)], rejected, implied, skipped): compiles `order` until `limit`
  compiles or `budget_s` seconds, leaving out what earlier compiles imply (`implied`), the
  twin of each that fits next (`twin_next`)."""
  start, fitting, rejected, missed, left_out, compiled = time.perf_counter(), [], [], [], [], 0
  queue = list(order)
  while queue:
    if compiled >= limit or time.perf_counter() - start > budget_s:
      return fitting, rejected, left_out, len(queue)
    cand = queue.pop(0)
    why = implied(cand, missed=missed, fitted=[c for c, _ in fitting], run=run)
    if why:
      left_out.append((cand, why))
      continue
    say(f"compiling {label(cand)} ({compiled + 1} of at most {limit})")
    p = _compile_plan(cand, run, entry, devices, config_name=config_name, margin=margin)
    compiled += 1
    if isinstance(p, str):
      say(f"{label(cand)} did not compile: {p}")
      rejected.append((cand, p))
      missed.append(cand)
      continue
    if progress:
      progress(cand, p)
    if p.fits:
      fitting.append((cand, p))
      queue = twin_next(queue, cand, run)
    elif p.headroom < 0:
      rejected.append((cand, f"short by {plan_report.gib(-p.headroom)}"))
      missed.append(cand)
    else:  # its host's RAM: no lesson for the device memory of the settings left
      rejected.append((cand, f"host RAM short by {plan_report.gib(p.host_needed - p.host_ram)}"
                             f" (at {p.host.peak})"))
  return fitting, rejected, left_out, 0


def _eval_peak(exp: experiment_lib.Experiment) -> int | None:
  """The compiled eval step's bytes per device; None when the compiler refuses it for memory."""
  state, batch = plan_lib.abstract_inputs(exp, exp.run.eval.batch_size)
  with exp.context():
    try:
      compiled = exp.eval_fn.lower(state.params, batch).compile()
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      return None
  return metrics_lib.compiled_stats(compiled).get("total_bytes")


def eval_fit(run: RunConfig, entry: Entry, devices, *, usable: float) -> EvalFit:
  """The fewest passes (eval.microbatch_rows) whose eval step fits `usable` bytes: the analytic
  model picks where to start, the compiler decides (TPU and GPU entries; elsewhere the model
  does)."""
  exp = experiment_lib.build(run, entry, devices)
  share = run.eval.batch_size // sharding.num_shards(exp.batch_sharding, dim=0)
  options = [0] + [r for r in range(share - 1, 0, -1) if share % r == 0]  # fewest passes first
  at = [with_run(exp, replace_path(run, EVAL_ROWS, r)) for r in options]
  c = np.dtype(exp.compute_dtype).itemsize
  model = [memory_model.eval_memory(e, compute_bytes=c) for e in at]
  i = next((k for k, b in enumerate(model) if b <= usable), len(options) - 1)
  platform = devices[0].platform
  result = lambda k, needed, fits, source, compiles: EvalFit(
      rows=options[k], passes=at[k].eval_microbatches, needed=needed, fits=fits, source=source,
      compiles=compiles)
  if platform not in ("tpu", "gpu"):
    return result(i, model[i], model[i] <= usable, "model", 0)
  peaks = {}
  peak = lambda k: peaks[k] if k in peaks else peaks.setdefault(k, _eval_peak(at[k]))
  fits = lambda k: peak(k) is not None and peak(k) <= usable
  if fits(i):  # fewer passes while they fit
    while i > 0 and fits(i - 1):
      i -= 1
  else:  # more until they fit
    while i + 1 < len(options) and not fits(i):
      i += 1
  return result(i, peak(i), fits(i), f"{platform.upper()} compiler", len(peaks))


# --- the sweep ----------------------------------------------------------------------------

def search(run: RunConfig, entry: Entry, devices, *, usable: float, recipe: bool = False
           ) -> tuple[str, list[Candidate], list]:
  """(mode, compile order, rejected): the layout sweep where some layout fits by the analytic
  model, else (and on one device) the memory sweep, its scan_layers twins last."""
  n = len(devices)
  if n > 1:
    screened, rejected = screen(run, entry, devices, candidates(run, n, entry, recipe=recipe),
                                usable=usable)
    if any(total <= usable for _, total in screened):
      return "layout", [c for c, _ in screened], rejected
    why = "no layout fits by the analytic model"
  else:
    why = "one device"
  cands = memory_candidates(run, n, entry, platform=entry.hardware.platform, recipe=recipe)
  screened, rejected = screen(run, entry, devices, cands, usable=usable)
  return f"memory: {why}", with_scan_twins(run, [c for c, _ in screened]), rejected


def sweep(run: RunConfig, entry: Entry, *, config_name: str, devices=None,
          budget_s: float = 1800.0, limit: int = 12, margin: float = 0.05, progress=None,
          with_eval: bool = True, recipe: bool = False,
          say: Callable[[str], None] = lambda _: None) -> SweepResult:
  """Ranks the settings that fit by the plan's estimate (overlapped, then serial, then fewest
  changes): `search` orders them, at most `limit` compile within `budget_s` seconds (what
  earlier compiles imply is left out), and with `with_eval` the best gets the fewest
  eval passes that its eval step fits in (`eval_fit`; after the budget). `say` is told each
  stage and candidate as it starts; `progress(candidate, plan)` each compile that ends."""
  if devices is None:
    devices, _ = plan_lib.target_devices(entry)
  run = normalized(run)
  usable = (entry.hardware.hbm_bytes or 0) * (1 - margin)
  say(f"{config_name} on {entry.name}: screening the settings by the analytic model")
  mode, order, rejected = search(run, entry, devices, usable=usable, recipe=recipe)
  say(f"sweep ({mode}): {len(order)} candidate(s) to compile, likeliest first; at most {limit} "
      f"compiles within {budget_s:.0f} s")
  fitting, failed, left_out, skipped = compile_in_order(
      order, run, entry, devices, config_name=config_name, budget_s=budget_s, limit=limit,
      margin=margin, progress=progress, say=say)
  inf = float("inf")
  fitting.sort(key=lambda cp: ((cp[1].estimate.step_s, cp[1].estimate.serial_s)
                               if cp[1].estimate else (inf, inf)) + (len(cp[0].knobs),))
  evaluated = best = None
  if fitting:
    best = fitting[0][0]
    if with_eval:
      say(f"fitting the eval step of the best, {label(best)}")
      evaluated = eval_fit(best.apply(run), entry, devices, usable=usable)
      if evaluated.rows != run.eval.microbatch_rows:
        best = best.with_knob(EVAL_ROWS, evaluated.rows)
  return SweepResult(ranked=fitting, rejected=rejected + failed, skipped=skipped, mode=mode,
                     implied=left_out, eval=evaluated, best=best)


def label(cand: Candidate) -> str:
  """The candidate's flags, and what it changes of the training recipe."""
  recipe = cand.recipe_changes()
  return (cand.flags() or "the config as given") + (
      f" [changes the training recipe: {', '.join(recipe)}]" if recipe else "")


def sweep_text(result: SweepResult) -> str:
  lines = [f"sweep ({result.mode}): {len(result.ranked)} fitting, {len(result.rejected)} "
           f"rejected, {len(result.implied)} left out (implied by compiled ones), "
           f"{result.skipped} not compiled (budget)"]
  for i, (cand, p) in enumerate(result.ranked):
    e = p.estimate
    step = (f"step {plan_report.secs(e.step_s)} overlapped, {plan_report.secs(e.serial_s)} "
            f"serial, MFU {e.mfu:.2f} / {e.mfu_serial:.2f}" if e else "no estimate")
    lines.append(f"  {i + 1}. {step} (estimate), needs {plan_report.gib(p.needed)}: "
                 f"{label(cand)}")
  ev = result.eval
  if ev is not None:
    needs = (f"needs {plan_report.gib(ev.needed)} [{ev.source}]" if ev.needed is not None
             else f"the {ev.source} ran out of memory")
    lines.append(f"  eval step of 1.: {'fits' if ev.fits else 'does NOT fit'} with "
                 f"eval.microbatch_rows={ev.rows} ({ev.passes} passes): {needs} ({ev.compiles} "
                 f"compiles)")
  if result.best is not None:
    lines.append(f"best: {label(result.best)}")
  return "\n".join(lines) + "\n"
