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
    memory                 HBM bytes / (time x HBM bandwidth), on memory-bound ops with at
                           most 10% of their bytes on chip
    alternate_memory       all bytes / (time x HBM bandwidth), on memory-bound ops the plan
                           bounds by that rate

Attention kernels are left out (their figures come from the kernels' own timings), as are
asynchronous copies and collectives, which run beside the other ops.
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
  bound: str  # what bounds it in the plan: flops, hbm or alternate


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
  """(the compiled step's ops, the calibration row, the hardware) of a row's command on its mesh
  (tpu-v5e-1 unless the row names one), as `axtrain plan` compiles it: the mesh rules leave the
  command's overrides as given."""
  # pylint: disable=import-outside-toplevel
  from launcher import config_loading
  from planner import plan as plan_lib
  from trainer import config as config_lib, mesh_rules, meshes
  argv = [a for a in row["argv"] if not a.startswith(("--output_dir", "--overwrite",
                                                      "--config.trainer.profile_steps"))]
  config = next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
  config_loading.register_components()
  entry = meshes.lookup((row.get("mesh") or {}).get("name") or "tpu-v5e-1")
  cfg = config_loading.load(config, *(a for a in argv if a.startswith("--config.")))
  mesh_rules.apply_rules(cfg, entry, {k for k, _ in config_loading.overrides(argv)})
  planned = plan_lib.plan(config_lib.parse(cfg), entry, config_name=config, with_eval=False)
  return planned.train.ops.ops, planned.estimate.calibration, entry.hardware


def join(ops, measured: dict[str, float], cal, hw) -> list[Joined]:
  """The timed ops the estimate times one by one, each with the plan's time and its bound."""
  out = []
  for op in ops:
    if (op.name not in measured or op.category in ("kernel", "collective")
        or op.opcode in ("copy-start", "slice-start")):
      continue
    hbm = (op.bytes - op.alt_bytes if cal.alternate_memory else op.bytes) / (
        cal.memory * hw.hbm_bandwidth)
    memory = cal.bytes_seconds(op, hw.hbm_bandwidth)
    bound = "hbm" if memory == hbm else "alternate"
    planned = memory
    if op.category == "matmul":
      compute = op.flops / (cal.matmul_quantized * hw.peak_flops(op.narrow) if op.narrow
                            else cal.matmul * hw.peak_flops())
      if compute >= memory:
        planned, bound = compute, "flops"
    out.append(Joined(op, measured[op.name], planned, bound))  # both: every run in a step
  return out


def fits(joined: list[Joined], hw) -> dict[str, tuple[float, int]]:
  """figure -> (the median of what the chip achieved, ops it is the median of); see the
  module's doc."""
  samples = collections.defaultdict(list)
  for j in joined:
    op, t = j.op, j.measured
    if t <= 0:
      continue
    if j.bound == "flops":
      key = f"{op.narrow} matmul" if op.narrow else "matmul"
      samples[key].append(op.flops / (t * hw.peak_flops(op.narrow)))
    elif op.category != "matmul" and j.bound == "hbm" and op.alt_bytes <= 0.1 * op.bytes:
      samples["memory"].append((op.bytes - op.alt_bytes) / (t * hw.hbm_bandwidth))
    elif op.category != "matmul" and j.bound == "alternate":
      samples["alternate_memory"].append(op.bytes / (t * hw.hbm_bandwidth))
  return {k: (statistics.median(v), len(v)) for k, v in sorted(samples.items())}


def report(row: dict, joined: list[Joined], measured: dict[str, float], hw, top: int) -> str:
  lines = [f"{row.get('setting')} at {str(row.get('commit'))[:7]} ({row.get('date')}): "
           f"step {row.get('step_time_s', 0) * 1e3:.2f} ms on the chip; profile "
           f"{sum(measured.values()) * 1e3:.2f} ms in the {len(measured)} ops it names"]
  by_kind = collections.defaultdict(lambda: [0, 0.0, 0.0])
  for j in joined:
    k = by_kind[j.op.category + (f" {j.op.narrow}" if j.op.narrow else "")]
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
  for figure, (value, n) in fits(joined, hw).items():
    lines.append(f"  achieved {figure}: {value:.3f} (median of {n} ops)")
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
  rows = [json.loads(line) for line in pathlib.Path(args.file).read_text().splitlines() if line]
  for i, row in enumerate(rows):
    if args.row >= 0 and i != args.row or not row.get("profile"):
      continue
    measured = profile_ops(row)
    ops, cal, hw = compile_row(row)
    print(report(row, join(ops, measured, cal, hw), measured, hw, args.ops), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
