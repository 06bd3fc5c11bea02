"""The `axtrain plan` report: a Plan (planner/plan.py) as text, every figure labelled with its
source, or as JSON; and the byte, time and count formats it and the sweep's ranking share.
"""

from __future__ import annotations

import dataclasses

from planner.plan import GiB, Plan
from trainer import meshes


def gib(n: float) -> str:
  """Bytes in GiB (MiB, KiB for small figures), three significant digits."""
  for unit, scale in (("GiB", GiB), ("MiB", 1024 ** 2), ("KiB", 1024)):
    if abs(n) >= scale / 10 or unit == "KiB":
      return f"{n / scale:.3g} {unit}"
  return f"{n} B"


def secs(x: float) -> str:
  """Seconds in s, ms or us, three significant digits."""
  return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.3g} ms" if x >= 1e-3 else f"{x * 1e6:.3g} us"


def num(x: float) -> str:
  """A count with a K, M, G, T or P suffix and two decimals."""
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.2f}{unit}"
  return f"{x:.0f}"


def text(p: Plan, *, timings: bool = True) -> str:
  """The human report; every figure names its source: [compiler], [model], [exact] or [estimate]."""
  lines = _head(p) + _memory(p) + parallel_lines(p) + _verdict(p) + _time(p)
  if timings:
    lines.append(f"  compile: train {p.train.seconds:.0f} s"
                 + (f", eval {p.eval.seconds:.0f} s" if p.eval else ""))
  return "\n".join(lines) + "\n"


def _head(p: Plan) -> list[str]:
  # data, fsdp and model always; stage, expert and context where they split something
  axes = " ".join(f"{k}={v}" for k, v in p.axes.items() if v > 1 or k in ("data", "fsdp", "model"))
  return [
      f"plan: {p.config} on {p.mesh} ({p.devices} devices, {axes}), compiled by {p.compiler}",
      f"  run: batch {p.batch} x {p.seq_len} tokens, grad_accum_steps {p.grad_accum_steps}, "
      f"remat {p.remat}, loss_chunk_size {p.loss_chunk_size}, {num(p.num_params)} parameters",
      f"  batch (data {p.data}, "
      + ("packed documents" if "segment_ids" in p.batch_arrays else "no document boundaries")
      + "): " + ", ".join(f"{k} {v}" for k, v in p.batch_arrays.items()),
  ]


# With the state in host memory the compiler's temporaries count the host transfers' buffers
# over again (trainer/metrics.py:device_bytes), so they may exceed the peak: said on the lines.
_OVER_COUNTED = (" (as the compiler counts them: host transfers' buffers over again, not all "
                 "live at once; the peak is what device memory holds)")
_PEAK_LESS_HOST = " (the compiler's peak less its host-memory bytes)"


def _memory(p: Plan) -> list[str]:
  src, a, t = p.source, p.analytic, p.train
  offloaded = (" (compute dtype; float32 in host memory)", " (one piece in flight)") if (
      a.host) else ("", "")
  lines = [
      "  per device                       bytes",
      f"    parameters         [exact]     {gib(a.params)}{offloaded[0]}",
      f"    optimizer state    [{'model' if a.host else 'exact'}]     {gib(a.opt_state)}"
      f"{offloaded[1]}",
      f"    gradients          [model]     {gib(a.grads)}",
      f"    activations        [model]     {gib(a.activations)}",
      f"    logits + loss      [model]     {gib(a.logits)}",
      f"    total              [model]     {gib(a.total)}",
      f"    train arguments    [{src}]  {gib(t.argument)}",
      f"    train outputs      [{src}]  {gib(t.output)} (aliased to arguments: "
      f"{gib(t.alias)})",
      f"    train temporaries  [{src}]  {gib(t.temp)}{_OVER_COUNTED if t.device_peak else ''}",
      f"    train code         [{src}]  {gib(t.code)}",
      f"    train peak         [{src}]  {gib(t.peak)}{_PEAK_LESS_HOST if t.device_peak else ''}",
  ]
  if t.refused:
    lines.append(f"    the {src} refused: {t.refused}")
  lines += [f"    note [{src}]: {n}" for n in t.notes]
  if p.eval is not None:
    lines.append(f"    eval peak          [{src}]  {gib(p.eval.peak)} (temporaries "
                 f"{gib(p.eval.temp)})")
  lines += _host(p)
  if p.fit_source == "model":
    lines.append(f"    (no {p.compiler.split()[-1]} compiler runs without the hardware: the CPU "
                 f"compiler stands in, and the fit comes from the analytic model)")
  return lines


def _host(p: Plan) -> list[str]:
  """One host's RAM in each phase of the run (planner/host_ram.py), each part with its source."""
  h = p.host
  if h is None:
    return []
  unmeasured = f"not counted: unmeasured on {h.platform}"
  own = lambda n: f"{gib(n)} [measured]" if h.measured else f"({unmeasured})"
  heap = (f"{gib(h.compile_heap)} ({h.compile_heap / h.code:.3g} bytes per byte of the train "
          f"program's {gib(h.code)} of code)" if h.measured and h.code else f"({unmeasured})")
  lines = [
      f"  host RAM per host ({h.devices} device(s); trainer.state_memory=host)",
      f"    process            "
      + (f"[measured]  {gib(h.process)}: runtime, imports, compiled programs, data pipeline"
         if h.measured else f"{unmeasured} (planner/calibration.py:host_ram_for)"),
      f"    state              [exact]     {gib(h.state)}: parameters and optimizer state, "
      f"{gib(h.state / h.devices)} per device",
  ]
  if h.step:
    lines.append(f"    train step         [{p.source}]  {gib(h.step)} of host bytes, the state "
                 f"included ({gib(h.step - h.state)} beyond it)")
  lines += [
      f"    in steps           [model]     {gib(h.steps)}: the process and the "
      + ("train step" if h.step else "state"),
      f"    a save's peak      [model]     {gib(h.save)}: the process and the state + what it "
      f"holds at once {gib(h.save_batch)} [exact] + the save's buffers {own(h.save_over)}",
      f"    a restore's peak   [model]     {gib(h.restore)}: the process and the state + what "
      f"it reads at once {gib(h.restore_batch)} [exact] + the restore's buffers "
      f"{own(h.restore_over)}",
      f"    a first run        [model]     {gib(h.first_run)}: in steps + the compiler's freed "
      f"heap {heap}, until its first save trims it",
  ]
  if h.measured:
    lines.append(f"    [measured]: {h.source}; a run whose programs come from the compilation "
                 f"cache holds no compiler heap")
  return lines


def host_verdict(p: Plan) -> str:
  """The host RAM verdict: one host's peak phase against its RAM."""
  h = p.host
  ram = (f"of {gib(h.ram)} RAM (the entry's hosts): " + ("fits" if h.fits else "does NOT fit")
         if h.ram else "(the entry names no host RAM: unchecked)")
  over = [f"{name} {gib(n)}" for name, n in h.phases().items() if h.ram and n > h.ram]
  return (f"  host memory: each host of {h.devices} device(s) needs {gib(h.needed)} "
          + ("" if h.measured else "or more ") + f"at its peak ({h.peak}) {ram}"
          + (f" ({', '.join(over)})" if over else ""))


def _verdict(p: Plan) -> list[str]:
  src, t = p.source, p.train
  device_fits = p.needed <= p.usable
  verdict = "fits" if device_fits else "does NOT fit"
  how = (f"{gib(p.headroom)} to spare" if device_fits else f"short by {gib(-p.headroom)}")
  basis = f"{src} peak" if p.fit_source == "compiler" else "analytic model total"
  host = [host_verdict(p)] if p.host else []
  return [
      f"  memory: {verdict}: needs {gib(p.needed)} ({basis}) of {gib(p.usable)} usable "
      f"({gib(p.hbm_bytes)} HBM less a {p.margin:.0%} margin); {how}", *host,
      f"  FLOPs per step: model {num(p.model_flops)} (6N + attention, all devices) = "
      f"{num(p.model_flops / p.devices)} per device; "
      + (f"compiler {num(t.flops)} per device (while-loop bodies counted once)" if t.flops
         else f"the {src} reports none")
      + (f"; executed {num(p.executed_flops)} per device [compiled HLO] (matmuls, loops "
         f"unrolled: remat recompute included)" if p.executed_flops else ""),
      f"  collectives per device per step [compiled HLO]: "
      + (", ".join(f"{k} {gib(v)}" for k, v in sorted(t.collectives.bytes_by_kind.items()))
         or "none")
      + (f"; {gib(t.collectives.cross_host_bytes)} between hosts (or TPU slices)"
         if t.collectives.cross_host_bytes else ""),
  ]


def _time(p: Plan) -> list[str]:
  e, t = p.estimate, p.train
  if e is None:
    lines = ["  estimate: none (" + ("the compiler refused the program" if t.refused else
                                   "the entry lists no peak FLOP/s or bandwidths") + ")"]
  else:
    c = e.calibration
    lines = [
        f"  ESTIMATE (calibrated, not a measurement): step {secs(e.step_s)} overlapped, "
        f"{secs(e.serial_s)} serial = matmuls {secs(e.compute_s)} + attention kernel "
        f"{secs(e.kernel_s)} + memory-bound ops {secs(e.hbm_s)}, collectives "
        f"{secs(e.collective_s)}",
        f"    {num(e.tokens_per_s)} tokens/s, MFU {e.mfu:.2f} overlapped, "
        f"{e.mfu_serial:.2f} serial",
        *([f"    both include host transfers {secs(e.transfer_s)}: " + "; ".join(
            ([f"{gib(e.to_device)} from host memory at {c.host_to_device / 1e9:.3g} GB/s, "
              f"{gib(e.to_host)} back "
              + (f"at {c.device_to_host / 1e9:.3g} GB/s" if c.device_to_host
                 else "beside the update (not counted)")] if e.to_device or e.to_host else [])
            + ([f"offloaded activations {gib(e.offloaded)} to host memory and back at "
                f"{c.host_to_device / 1e9:.3g} GB/s each way"
                + ("" if c.device_to_host else " (the rate of their writes not measured)")]
               if e.offloaded else []))
           + f" per device ({c.transfer_source})"]
          if e.transfer_s else []),
        f"    at {c.matmul:.0%} of peak FLOP/s on matmuls, {c.attention:.1%} on attention "
        f"kernels, {c.memory:.0%} of HBM bandwidth"
        + (f" ({c.alternate_memory:.0%} of it with on-chip memory)" if c.alternate_memory else "")
        + f": {c.source} (planner/calibration.py)"
        + (f"; {c.attention_note}" if c.attention_note else ""),
        *_quantized(p),
    ]
  if t.cost_model_s is not None:
    # libtpu's cost model returns a negative time for some programs (seen with all-to-alls).
    step = (f"step {secs(t.cost_model_s)}" if t.cost_model_s >= 0
            else "no step time (libtpu's cost model returned a negative one)")
    lines.append(f"  TPU cost model [TPU compiler]: {step} per device, "
                 f"{gib(t.bytes_accessed)} accessed (libtpu's per-op roofline; compare "
                 f"programs with layers unrolled and windowed einsum off)")
  return lines


def quantized_flops(p: Plan) -> dict[str, tuple[int, float]]:
  """"int8" / "fp8" -> (ops per step, FLOPs per device) of the train step's quantized matmuls
  (model.quantization) in the compiled HLO."""
  out: dict[str, tuple[int, float]] = {}
  for op in (p.train.ops.ops if p.train.ops else ()):
    if op.category == "matmul" and op.narrow:
      n, f = out.get(op.narrow, (0, 0.0))
      out[op.narrow] = (n + op.count, f + op.flops)
  return out


def _quantized(p: Plan) -> list[str]:
  hw, c = meshes.lookup(p.mesh).hardware, p.estimate.calibration
  return [f"    {kind} matmuls [compiled HLO]: {n} ops, {num(f)} per device, at "
          f"{c.matmul_quantized:.0%} of the {kind} peak {num(hw.peak_flops(kind))}/s "
          f"({c.quantized_note})" for kind, (n, f) in sorted(quantized_flops(p).items())]


def parallel_lines(p: Plan) -> list[str]:
  """Pipeline stages (bubble, per-stage memory) and context parallelism, when the mesh has them."""
  sp, lines = p.split, []
  if sp.positions < sp.seq_len:
    shards = sp.seq_len // sp.positions
    lines.append(f"  context: each sequence over {shards} devices, {sp.positions} positions "
                 f"each (2 load-balanced chunks of {sp.positions // 2}); attention gathers "
                 f"the keys and values of all {sp.seq_len}")
  if sp.stages > 1:
    per_stage = p.devices // sp.stages
    a = p.analytic
    lines += [
        f"  pipeline: {sp.stages} stages, {sp.microbatches} microbatches (GPipe): bubble "
        f"(S - 1) / (M + S - 1) = {sp.stages - 1}/{sp.microbatches + sp.stages - 1} = "
        f"{p.bubble:.1%} of the step idle",
        f"    per stage: {sp.layers // sp.stages} layers on {per_stage} devices; parameters "
        f"{gib(a.params * per_stage)}, optimizer state {gib(a.opt_state * per_stage)} [exact]"
        f" ({gib(a.params)} and {gib(a.opt_state)} per device); train peak {gib(p.train.peak)}"
        f" per device [{'TPU' if p.fit_source == 'compiler' else 'CPU'} compiler]",
    ]
  return lines


def ops_text(p: Plan, n: int = 10) -> str:
  """`plan --ops`: the train step's ops by category, and the top `n` by bytes and by time."""
  r = p.train.ops
  if r is None:
    return "  ops: none (the entry lists no peak FLOP/s or HBM bandwidth to time them by)\n"
  cov_bytes, cov_flops = r.coverage()
  lines = [f"  ops of the train step per device [compiled HLO] (roofline per op: max(FLOPs / "
           f"peak, bytes / HBM bandwidth) + bytes sent / link bandwidth):",
           f"    {'category':<13} {'ops':>6} {'bytes':>10} {'FLOPs':>9} {'time':>9}"]
  for cat, t in r.totals().items():
    lines.append(f"    {cat:<13} {t['ops']:>6} {gib(t['bytes']):>10} {num(t['flops']):>9} "
                 f"{secs(t['seconds']):>9}")
  lines.append(f"    {'total':<13} {sum(t['ops'] for t in r.totals().values()):>6} "
               f"{gib(r.bytes):>10} {num(r.flops):>9} {secs(r.seconds):>9}  (one op at a "
               f"time)")
  if cov_bytes or cov_flops:
    lines.append(f"    these sums are {cov_bytes:.0%} of the compiler's bytes accessed and "
                 f"{cov_flops:.0%} of its FLOPs")
  if cov_flops > 1.3:
    lines.append("    (well above the compiler's: it counts a loop it made of a matmul and its "
                 "collectives, windowed einsum, once, these sums every trip; on TPU entries "
                 "--nowindowed_einsum compiles without them)")
  for key, title in (("bytes", "bytes"), ("seconds", "estimated time")):
    lines.append(f"  top {n} by {title} (ops grouped by module, primitive and pass):")
    for g in r.top(key, n):
      lines.append(f"    {gib(g.bytes):>10} {num(g.flops):>9} {secs(g.seconds):>9} "
                   f"{g.ops:>5}x {g.category:<12} {g.label}")
  return "\n".join(lines) + "\n"


def ops_json(p: Plan, n: int = 10) -> dict | None:
  r = p.train.ops
  if r is None:
    return None
  group = lambda g: dict(dataclasses.asdict(g), label=g.label)
  return {"totals": r.totals(), "bytes": r.bytes, "flops": r.flops, "seconds": r.seconds,
          "coverage": dict(zip(("bytes", "flops"), r.coverage())),
          "top_by_bytes": [group(g) for g in r.top("bytes", n)],
          "top_by_seconds": [group(g) for g in r.top("seconds", n)]}


def to_json(p: Plan) -> dict:
  out = dataclasses.asdict(dataclasses.replace(
      p, train=dataclasses.replace(p.train, ops=None),
      eval=dataclasses.replace(p.eval, ops=None) if p.eval else None))
  out.update(fits=p.fits, usable=p.usable, headroom=p.headroom, host_fits=p.host_fits,
             host_needed=p.host_needed, host_phases=p.host.phases() if p.host else None,
             analytic_total=p.analytic.total, train_peak=p.train.peak,
             eval_peak=p.eval.peak if p.eval else None, bubble=p.bubble)
  return out
