"""A chip profile joined op by op with the compiled HLO: where the plan's step estimate errs.

    python -m benchmarks.chip_ops benchmarks/profiles/125m-b4.jsonl       # every row
    python -m benchmarks.chip_ops chip.jsonl --row=1 --ops=20            # one, its 20 longest ops

A row of `benchmarks.chip run --profile` holds the chip's time per op name over the profiled
steps (`ops`: every op; rows written before it only the 60 longest, in `top`). libtpu's
compile-only topology compiles the row's command to the same HLO, op names included, so each
timed op meets its bytes (and those in on-chip memory, alt_bytes), FLOPs and kind
(planner/hlo_ops.py) and the time the plan gives it (planner/plan.py:estimate, the row's
hardware's calibration). Printed per kind: the ops joined, the chip's time and the plan's; then
what the chip achieved on the ops that one resource bounds, the figures a calibration row
(planner/calibration.py) is fitted from:

    matmul / int8 matmul   FLOPs / (time x peak), on the matmuls the plan bounds by FLOPs
                           (also time-weighted: their FLOPs over their summed time, the
                           share a calibration row takes)
    memory                 HBM bytes / (time x HBM bandwidth), on memory-bound ops with at
                           most 10% of their bytes on chip
    alternate_memory       all bytes / (time x HBM bandwidth), on memory-bound ops the plan
                           bounds by that rate

    attention              one forward call's causal FLOPs (planner/plan.py:
                           attention_call_flops) / (its time x peak), on the attention
                           kernels' forward calls
    attention_backward     a backward call's time / a forward call's

An attention implementation timed as a whole (Calibration.attention_wrapper_timed) leaves the
ops around its kernel, inside the attention call, out of the plan: they are shown apart ("around
the kernel", planned at 0). Asynchronous copies and collectives, which run beside the other
ops, are left out.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pathlib
import statistics
import sys

from benchmarks import chip

_OPS_LINE = "XLA Ops"


@dataclasses.dataclass(frozen=True)
class Joined:
  """One op of the compiled step that the profile timed."""
  op: object  # planner.hlo_ops.Op
  measured: float  # seconds per step on the chip
  planned: float  # seconds per step in the plan's estimate
  # what bounds it in the plan: flops, hbm or alternate; kernel (an attention kernel); around
  # (an op inside the attention call that the plan leaves to the kernel's figures)
  bound: str


def profile_ops(row: dict) -> dict[str, float]:
  """op name -> the chip's seconds per step, from a row's profile (its device's XLA Ops line)."""
  profile = row.get("profile") or {}
  line = next((v for k, v in profile.items() if k.endswith(f"| {_OPS_LINE}")), None)
  steps_line = next((v for k, v in profile.items() if k.endswith("| Steps")), None)
  if line is None:
    raise SystemExit("benchmarks.chip_ops: the row holds no profile (run with --profile)")
  steps = max(len(steps_line["top"]), 1) if steps_line else 1
  pairs = line.get("ops") or {chip.op_name(t): (ms, n) for t, ms, n in line["top"]}
  return {name: ms / 1e3 / steps for name, (ms, _) in pairs.items()}


def compile_row(row: dict):
  """(the compiled step's ops, the calibration row, the hardware, the FLOPs of one attention
  kernel call: planner/plan.py:attention_call_flops) of a row's command on its mesh
  (tpu-v5e-1 unless the row names one), as `axtrain plan` compiles it: the mesh rules leave the
  command's overrides as given."""
  # pylint: disable=import-outside-toplevel
  from launcher import config_loading
  from planner import plan as plan_lib
  from trainer import config as config_lib, experiment, mesh_rules, meshes
  argv = [a for a in row["argv"] if not a.startswith(("--output_dir", "--overwrite",
                                                      "--config.trainer.profile_steps"))]
  config = next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
  config_loading.register_components()
  entry = meshes.lookup((row.get("mesh") or {}).get("name") or "tpu-v5e-1")
  cfg = config_loading.load(config, *(a for a in argv if a.startswith("--config.")))
  mesh_rules.apply_rules(cfg, entry, {k for k, _ in config_loading.overrides(argv)})
  run = config_lib.parse(cfg)
  planned = plan_lib.plan(run, entry, config_name=config, with_eval=False)
  exp = experiment.build(run, entry, plan_lib.target_devices(entry)[0],
                         platform=entry.hardware.platform)
  return (planned.train.ops.ops, planned.estimate.calibration, entry.hardware,
          plan_lib.attention_call_flops(exp))


def join(ops, measured: dict[str, float], cal, hw, call_flops: float = 0.0) -> list[Joined]:
  """The timed ops the estimate times one by one, each with the plan's time and its bound
  (`kernel` for an attention kernel, `around` for an op inside the attention call that a row
  timing the implementation as a whole leaves out: planned 0)."""
  from planner import plan as plan_lib  # pylint: disable=import-outside-toplevel
  out = []
  for op in ops:
    if op.name not in measured or op.category == "collective" or op.opcode in (
        "copy-start", "slice-start"):
      continue
    kernel = cal.kernel_seconds(op, call_flops, hw.peak_flops())
    if kernel is not None:
      out.append(Joined(op, measured[op.name], kernel, "kernel"))
      continue
    if op.category == "kernel":
      continue
    if cal.attention_wrapper_timed and plan_lib.ATTENTION_SCOPE in op.primitive:
      out.append(Joined(op, measured[op.name], 0.0, "around"))
      continue
    memory, bound = cal.bytes_bound(op, hw.hbm_bandwidth)
    planned = memory
    if op.category == "matmul":
      compute = op.flops / (cal.matmul_quantized * hw.peak_flops(op.narrow) if op.narrow
                            else cal.matmul * hw.peak_flops())
      if compute >= memory:
        planned, bound = compute, "flops"
    out.append(Joined(op, measured[op.name], planned, bound))  # both: every run in a step
  return out


def fits(joined: list[Joined], hw, call_flops: float = 0.0) -> dict[str, tuple[float, int]]:
  """figure -> (the median of what the chip achieved, ops it is the median of); see the
  module's doc."""
  from planner import calibration  # pylint: disable=import-outside-toplevel
  samples = collections.defaultdict(list)
  per_call = collections.defaultdict(list)  # an attention kernel's seconds a call, by pass
  for j in joined:
    op, t = j.op, j.measured
    if t <= 0:
      continue
    if j.bound == "kernel":
      per_call[calibration.kernel_pass(op.name)].append(t / op.count)
    elif j.bound == "flops":
      key = f"{op.narrow} matmul" if op.narrow else "matmul"
      samples[key].append(op.flops / (t * hw.peak_flops(op.narrow)))
    elif op.category != "matmul" and j.bound == "hbm" and op.alt_bytes <= 0.1 * op.bytes:
      samples["memory"].append((op.bytes - op.alt_bytes) / (t * hw.hbm_bandwidth))
    elif op.category != "matmul" and j.bound == "alternate":
      samples["alternate_memory"].append(op.bytes / (t * hw.hbm_bandwidth))
  out = {k: (statistics.median(v), len(v)) for k, v in sorted(samples.items())}
  forward, backward = per_call.get("forward"), per_call.get("backward")
  if forward and call_flops:
    out["attention"] = (call_flops / (statistics.median(forward) * hw.peak_flops()),
                        len(forward))
    if backward:
      out["attention_backward"] = (statistics.median(backward) / statistics.median(forward),
                                   len(backward))
  return out


def time_weighted(joined: list[Joined], hw) -> dict[str, float]:
  """"matmul" / "int8 matmul" -> their FLOPs over their time, as a share of the peak, on the
  matmuls the plan bounds by FLOPs: what a calibration row's matmul share must be for the plan
  to sum those ops to the chip's time (long ops weigh more than in the median)."""
  flops, seconds = collections.defaultdict(float), collections.defaultdict(float)
  for j in joined:
    if j.bound == "flops" and j.measured > 0:
      key = f"{j.op.narrow} matmul" if j.op.narrow else "matmul"
      flops[key] += j.op.flops / hw.peak_flops(j.op.narrow)
      seconds[key] += j.measured
  return {k: flops[k] / seconds[k] for k in sorted(flops)}


def report(row: dict, joined: list[Joined], measured: dict[str, float], hw, top: int,
           call_flops: float = 0.0) -> str:
  lines = [f"{row.get('setting')} at {str(row.get('commit'))[:7]} ({row.get('date')}): "
           f"step {row.get('step_time_s', 0) * 1e3:.2f} ms on the chip; profile "
           f"{sum(measured.values()) * 1e3:.2f} ms in the {len(measured)} ops it names"]
  by_kind = collections.defaultdict(lambda: [0, 0.0, 0.0])
  for j in joined:
    k = by_kind["around the kernel" if j.bound == "around" else
                j.op.category + (f" {j.op.narrow}" if j.op.narrow else "")]
    k[0] += 1
    k[1] += j.measured
    k[2] += j.planned
  lines.append(f"  {'kind':20s} {'ops':>5s} {'chip ms':>9s} {'plan ms':>9s} {'plan/chip':>9s}")
  for kind, (n, chip, planned) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
    lines.append(f"  {kind:20s} {n:5d} {chip * 1e3:9.3f} {planned * 1e3:9.3f} "
                 f"{planned / chip if chip else 0:9.2f}")
  chip = sum(j.measured for j in joined)
  planned = sum(j.planned for j in joined)
  lines.append(f"  {'joined':20s} {len(joined):5d} {chip * 1e3:9.3f} {planned * 1e3:9.3f} "
               f"{planned / chip if chip else 0:9.2f}")
  weighted = time_weighted(joined, hw)
  for figure, (value, n) in fits(joined, hw, call_flops).items():
    also = f"; {weighted[figure]:.3f} time-weighted" if figure in weighted else ""
    lines.append(f"  achieved {figure}: {value:.3f} (median of {n} ops{also})")
  for j in sorted(joined, key=lambda j: -j.measured)[:top]:
    lines.append(f"    {j.op.name:40s} {j.op.category:12s} {j.bound:9s} chip "
                 f"{j.measured * 1e3:8.3f} plan {j.planned * 1e3:8.3f} ms  "
                 f"{j.op.bytes / 1e6:8.1f} MB ({j.op.alt_bytes / 1e6:.1f} on chip) "
                 f"{j.op.flops / 1e9:8.1f} GFLOP")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.chip_ops", description=__doc__.split(
      "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("file", help="a chip.jsonl of `benchmarks.chip run --profile`")
  p.add_argument("--row", type=int, default=-1, help="only this row (0-based; default: all)")
  p.add_argument("--ops", type=int, default=10, help="list this many of the longest ops")
  args = p.parse_args(argv)
  try:
    rows = [json.loads(line) for line in pathlib.Path(args.file).read_text().splitlines() if line]
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    p.error(f"{args.file}: not a readable chip.jsonl ({type(e).__name__}: {e})")
  chosen = [r for i, r in enumerate(rows) if (args.row < 0 or i == args.row)
            and isinstance(r, dict) and r.get("profile")]
  if not chosen:
    p.error(f"{args.file}: no profiled row" + (f" {args.row}" if args.row >= 0 else "")
            + f" among its {len(rows)} (`benchmarks.chip run --profile` writes them)")
  for row in chosen:
    measured = profile_ops(row)
    ops, cal, hw, call_flops = compile_row(row)
    print(report(row, join(ops, measured, cal, hw, call_flops), measured, hw, args.ops,
                 call_flops), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
