"""The sweep's analytic screen, without compiling: which candidates (planner/sweep_space.py) are
worth a compile and in what order (`screen`, by the analytic memory model and `screen_estimate`,
an analytic step time), and `fixes`, the same search for a step that does not fit
(planner/step_memory.py): the changes the analytic model says would fit.
"""

from __future__ import annotations

import numpy as np

from core.registry import ConfigError
from planner import memory_model, plan_report
from planner.sweep_space import (ACCUM, RECIPE, ROWS, SCAN, Candidate, effective_chunk,
                                 get_path, hosts_spanned, knob_candidates, knob_values,
                                 normalized, with_run)
from trainer import experiment as experiment_lib, flops as flops_lib, sharding
from trainer.config import RunConfig
from trainer.meshes import Entry

# The screen's compute (`screen_estimate`): forward + backward = 3 forward passes; full remat
# recomputes the forward once more.
RECOMPUTE = {"none": 1.0, "dots_saveable": 1.0, "dots_with_no_batch_dims_saveable": 1.05}


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
             * RECOMPUTE.get(remat, 4 / 3) / hw.peak_bf16_flops)
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


def screen(run: RunConfig, entry: Entry, devices, cands: list[Candidate], *, usable: float
           ) -> tuple[list, list]:
  """([(Candidate, analytic bytes)] in compile order, [(Candidate, reason)] rejected).

  Those the analytic model puts within 1.5x of `usable` compile: those within `usable` first,
  each group fastest first by `screen_estimate`, then (where it ties: a step bound by compute)
  fewest microbatches, fewest changes, the longest loss chunk."""
  dtype = experiment_lib.compute_dtype(run.trainer.compute_dtype, entry.hardware.platform)
  c = np.dtype(dtype).itemsize
  screened, rejected, built = [], [], {}
  for cand in cands:
    recipe = tuple((p, v) for p, v in cand.knobs if p in RECIPE)
    key = (tuple((cand.axes or {}).items()), recipe)
    if key not in built:  # shapes and shardings depend on the mesh and the optimizer only
      base = Candidate(axes=cand.axes, knobs=((ROWS, 0), (ACCUM, 1)) + recipe)
      try:
        built[key] = experiment_lib.build(base.apply(run), entry, devices)
      except ConfigError as e:
        built[key] = str(e)
    if isinstance(built[key], str):
      rejected.append((cand, built[key]))
      continue
    try:
      exp = with_run(built[key], cand.apply(run))
    except ConfigError as e:
      rejected.append((cand, str(e)))
      continue
    total = memory_model.analytic_memory(exp, compute_bytes=c).total
    if total > 1.5 * usable:
      rejected.append((cand, f"analytic model: {plan_report.gib(total)} per device"))
    else:
      order = (total > usable, *screen_estimate(exp, entry, compute_bytes=c),
               exp.run.trainer.grad_accum_steps, len(cand.knobs), -effective_chunk(cand, run))
      screened.append((order, cand, total))
  screened.sort(key=lambda s: s[0])
  return [(cand, total) for _, cand, total in screened], rejected


def with_scan_twins(run: RunConfig, order: list[Candidate]) -> list[Candidate]:
  """`order`, then each candidate again with the other model.scan_layers (the analytic screen
  does not tell them apart; the compiler's memory and the compiled estimate may): compiled
  last, where budget is left, or next after their twin fits (`twin_next`)."""
  scan = get_path(run, SCAN)
  if scan is None:
    return order
  stages = run.mesh.stage not in (None, 1)
  twins = [] if stages and scan else [c.with_knob(SCAN, not scan) for c in order]
  return order + twins


def model_bytes(exp: experiment_lib.Experiment, *, eval_step: bool) -> int:
  """The analytic model's bytes per device for `exp`'s train step (or eval step)."""
  c = np.dtype(exp.compute_dtype).itemsize
  if eval_step:
    return memory_model.eval_memory(exp, compute_bytes=c)
  return memory_model.analytic_memory(exp, compute_bytes=c).total


def state_bytes(exp: experiment_lib.Experiment, *, eval_step: bool) -> int:
  """Bytes per device of what the step takes as arguments (exact): parameters, and for the
  train step the optimizer state."""
  a = memory_model.analytic_memory(exp, compute_bytes=np.dtype(exp.compute_dtype).itemsize)
  return a.params + (0 if eval_step else a.opt_state)


def fixes(exp: experiment_lib.Experiment, *, eval_step: bool, within: float,
          entry: Entry | None = None, limit: int = 3) -> list[tuple[Candidate, int]]:
  """For a step of `exp` that does not fit: [(Candidate, model bytes)], the changes that keep
  the run's math and mesh which the analytic model (`model_bytes`) puts within `within` bytes;
  fewest changes first, then the fastest by `screen_estimate` (the eval step, or an entry
  without figures: the most memory used); at most `limit`. Instant: nothing compiles."""
  run, shards = normalized(exp.run), sharding.num_shards(exp.batch_sharding, dim=0)
  values = knob_values(run, platform=exp.mesh.devices.flat[0].platform, eval_step=eval_step,
                       shards=shards)
  c = np.dtype(exp.compute_dtype).itemsize
  found = []
  for cand in knob_candidates(run, values, shards=shards):
    changed = cand.apply(run)
    try:
      experiment_lib.check_parallel(changed, exp.source, exp.mesh, exp.rules)
      e = with_run(exp, changed)
    except ConfigError:
      continue
    total = model_bytes(e, eval_step=eval_step)
    if cand.knobs and total <= within:
      speed = (screen_estimate(e, entry, compute_bytes=c)[0]
               if entry is not None and not eval_step else 0.0)
      found.append(((len(cand.knobs), speed or -total), cand, total))
  found.sort(key=lambda f: f[0])
  return [(cand, total) for _, cand, total in found[:limit]]
