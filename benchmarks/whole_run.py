"""A recipe on the chip as a user runs it, start to finish: trains, saves, is stopped, resumes,
ends, exports; with the host RAM in use throughout and the resumed run compared bit for bit.

On the lent TPU chip (../shared/chip/README.md), after `../shared/chip/wheels.sh` here:

    bash .chip/on_chip.sh python3 -m benchmarks.whole_run run --out=$OUT [--reference]
    python -m benchmarks.whole_run write whole_run.json      # here: BENCHMARKS.md's section

`run` times these phases of one command, `axtrain --config=CONFIG
--config.trainer.max_steps=STEPS --config.checkpoint.every_steps=EVERY` (llm_1b: 3 and 2):

    stopped     the command; SIGTERM --stop_after_s seconds after its first step's line (it
                finishes the step in flight, saves it and leaves with exit 75)
    resumed     the same command again: restores, trains to STEPS, saves, evaluates (exit 0)
    reference   with --reference: the same command, uninterrupted, in another directory
    export      `axtrain convert --to_hf` of the resumed run

(`--noexport` leaves the export out; `--only=stopped`, then `--only=resumed` in a second call on
the same warm machine, splits a recipe whose phases pass one call's 10 minutes.) The machine's
RAM in use (MemTotal - MemAvailable) is polled every second into <phase>_ram.tsv (seconds, GB,
the log's last line then); a phase that passes --ram_limit_gb is killed (the lent machine
returns nothing at all from a call killed for RAM). It writes whole_run.json after each phase (a
call cut short brings back what finished): each phase's exit code, wall time, RAM peak and its
run's run.json `startup`, the run's metrics records, and `bit_exact` (the last step's loss,
norms and eval loss of the resumed run against the reference's, compared as float64 from their
JSON).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time

from benchmarks import sections
from trainer import host_memory

ROOT = pathlib.Path(__file__).resolve().parents[1]
HISTORY = ROOT / "benchmarks" / "whole_runs.jsonl"
BEGIN, END = "<!-- whole_run: begin -->", "<!-- whole_run: end -->"
COMPARED = ("loss", "grad_norm", "param_norm", "update_norm")


class _Phase:
  """One command as a subprocess, its RAM peak polled; killed past `limit` bytes in use. Each
  poll goes to `trace`: seconds since the start, GB in use, and the log's last line then (what
  the run was doing: a step, a save, a restore)."""

  def __init__(self, argv: list[str], log: pathlib.Path, limit: float, trace: pathlib.Path):
    self.argv, self.log, self.limit, self.trace_path = argv, log, limit, trace
    self.peak, self.killed = 0, False

  def run(self, *, stop_after_s: float | None = None) -> dict:
    start = time.time()
    with open(self.log, "w", encoding="utf-8") as out, \
        open(self.trace_path, "w", encoding="utf-8") as trace:
      proc = subprocess.Popen([sys.executable, "-m", "launcher", *self.argv], cwd=ROOT,
                              stdout=out, stderr=subprocess.STDOUT)
      stopper = threading.Thread(target=self._stop_after, args=(proc, stop_after_s), daemon=True)
      if stop_after_s is not None:
        stopper.start()
      while proc.poll() is None:
        used = host_memory.system_used() or 0
        self.peak = max(self.peak, used)
        # written as it goes: a call cut short still brings the trace back
        trace.write(f"{time.time() - start:.1f}\t{used / 1e9:.3f}\t{self._last_line()}\n")
        trace.flush()
        if used > self.limit:
          self.killed = True
          proc.kill()
        time.sleep(1)
    return {"argv": self.argv, "code": proc.returncode, "wall_s": round(time.time() - start, 1),
            "ram_peak_gb": round(self.peak / 1e9, 2), "killed_for_ram": self.killed}

  def _last_line(self) -> str:
    lines = self.log.read_text(errors="replace").strip().splitlines() if self.log.exists() else []
    return lines[-1][:80] if lines else ""

  def _stop_after(self, proc, seconds: float) -> None:
    while proc.poll() is None:
      if "compiled and ran step" in self.log.read_text(errors="replace"):
        time.sleep(seconds)
        proc.send_signal(signal.SIGTERM)
        return
      time.sleep(1)


def _records(run_dir: pathlib.Path) -> list[dict]:
  path = run_dir / "metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _last(records: list[dict], key: str) -> dict:
  return next((r for r in reversed(records) if key in r), {})


def run(argv: list[str]) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.whole_run run")
  p.add_argument("--out", required=True, help="folder for whole_run.json and the logs")
  p.add_argument("--config", default="configs/llm_1b.py")
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--every", type=int, default=2, help="checkpoint.every_steps")
  p.add_argument("--stop_after_s", type=float, default=15.0,
                 help="SIGTERM this long after the first step's line")
  p.add_argument("--reference", action="store_true", help="also run it uninterrupted")
  p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                 help="--config.KEY=VALUE in every phase's command (repeatable), e.g. "
                      "checkpoint.compression=false")
  p.add_argument("--ram_limit_gb", type=float, default=38.0)
  p.add_argument("--work", default="/tmp/axtrain-whole-run")
  p.add_argument("--noexport", dest="export", action="store_false",
                 help="leave out the export (where the call's time is short)")
  p.add_argument("--only", default="", help="PHASE,... of stopped, resumed, reference, export: "
                 "run only these, in --work as an earlier call left it (a warm machine keeps "
                 "it), so that a recipe whose phases pass one call's limit takes two calls")
  args = p.parse_args(argv)
  out, work = pathlib.Path(args.out), pathlib.Path(args.work)
  out.mkdir(parents=True, exist_ok=True)
  command = [f"--config={args.config}", f"--config.trainer.max_steps={args.steps}",
             f"--config.checkpoint.every_steps={args.every}",
             *(f"--config.{item}" for item in args.override)]
  limit = args.ram_limit_gb * 1e9
  result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "axtrain " + " ".join(command), "phases": {}}
  phases = result["phases"]
  run_dir, ref_dir = work / "run", work / "reference"
  steps = [("stopped", [*command, f"--output_dir={run_dir}", "--overwrite"], args.stop_after_s),
           ("resumed", [*command, f"--output_dir={run_dir}"], None)]
  if args.reference:
    steps.append(("reference", [*command, f"--output_dir={ref_dir}", "--overwrite"], None))
  if args.export:
    steps.append(("export", ["convert", f"--to_hf={run_dir}", f"--output_dir={work / 'hf'}"],
                  None))
  only = [n for n in args.only.split(",") if n]
  unknown = set(only) - {name for name, _, _ in steps}
  if unknown:
    p.error(f"--only: {', '.join(sorted(unknown))} not among this run's phases")
  for name, phase_argv, stop_after in steps:
    if only and name not in only:
      continue
    phase = _Phase(phase_argv, out / f"{name}.log", limit, out / f"{name}_ram.tsv")
    phases[name] = phase.run(stop_after_s=stop_after)
    _finish(result, run_dir, ref_dir if args.reference else None)
    if name in ("stopped", "resumed"):  # each run writes its own run.json
      info = run_dir / "run.json"
      phases[name]["startup"] = json.loads(info.read_text()).get("startup") if info.exists() else None
    # Written after each phase: a call cut short still brings back the phases it finished.
    (out / "whole_run.json").write_text(json.dumps(result, indent=1) + "\n")
  print(json.dumps(phases), flush=True)
  return 0


def _finish(result: dict, run_dir: pathlib.Path, ref_dir: pathlib.Path | None) -> None:
  """The run's records and, with a reference, `bit_exact`, as they stand."""
  result["records"] = _records(run_dir)
  if ref_dir is not None:
    ref = _records(ref_dir)
    mine, theirs = _last(result["records"], "loss"), _last(ref, "loss")
    result["reference_records"] = ref
    result["bit_exact"] = bool(theirs) and mine.get("step") == theirs.get("step") and all(
        mine.get(k) == theirs.get(k) for k in COMPARED) and (
            _last(result["records"], "eval_loss").get("eval_loss")
            == _last(ref, "eval_loss").get("eval_loss"))


def row(r: dict) -> str:
  """One table row of a whole_run.json."""
  phases, records = r["phases"], r.get("records", [])
  steps = [x["step_time_s"] for x in records if "step_time_s" in x and "loss" in x]
  saves = [x["save_time_s"] for x in records if "save_time_s" in x]
  evals = [x["eval_time_s"] for x in records if "eval_time_s" in x]
  codes = "/".join(str(phases[k]["code"]) for k in ("stopped", "resumed", "export") if k in phases)
  exact = {True: "yes", False: "NO", None: "-"}[r.get("bit_exact")]
  own = [x["host_ram_in_use_peak_bytes"] - x["host_ram_in_use_before_bytes"] for x in records
         if "host_ram_in_use_peak_bytes" in x and "host_ram_in_use_before_bytes" in x]
  return (f"| {r['date']} | {r.get('commit', '-')} | `{r['command']}` | {codes} | "
          f"{max(steps) if steps else 0:.4g} s | {max(saves) if saves else 0:.3g} s | "
          f"{f'+{max(own) / 1e9:.2f} GB' if own else '-'} | "
          f"{max(evals) if evals else 0:.3g} s | "
          f"{_peak(phases, 'stopped')} / {_peak(phases, 'resumed')} GB | "
          f"{phases['export']['wall_s'] if 'export' in phases else '-'} s | {exact} |")


def _peak(phases: dict, name: str):
  return phases[name]["ram_peak_gb"] if name in phases else "-"


def write(argv: list[str]) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.whole_run write")
  p.add_argument("files", nargs="*", help="whole_run.json files brought back from the chip")
  p.add_argument("--commit", default="", help="the commit of the tree that ran")
  args = p.parse_args(argv)
  with open(HISTORY, "a", encoding="utf-8") as f:
    for path in args.files:
      r = json.loads(pathlib.Path(path).read_text())
      f.write(json.dumps({**r, "commit": args.commit or r.get("commit", "-")}) + "\n")
  rows = [json.loads(line) for line in HISTORY.read_text().splitlines()] if HISTORY.exists() else []
  section = "\n".join([
      BEGIN, "## A recipe start to finish on the chip", "",
      "Measured by `bash .chip/on_chip.sh python3 -m benchmarks.whole_run run --out=$OUT "
      "--reference` (benchmarks/whole_run.py): the command trained, took a SIGTERM during "
      "step 2 (exit 75 after saving), was run again (resumed to the end, saved, evaluated), "
      "then exported with `axtrain convert --to_hf`; exit codes stopped/resumed/export; a save's "
      "own RAM is the most the machine's RAM in use rose during one of the run's saves (its "
      "records' `host_ram_in_use_peak_bytes` less `..._before_bytes`, from 2026-12-07); RAM "
      "peak is the machine's in use at its peak in the stopped / resumed runs; bit for bit: the last "
      "step's loss and norms and the eval loss against an uninterrupted run.", "",
      "| date | commit | command | exit codes | slowest step | slowest save | a save's own RAM "
      "| eval | RAM peak | export | bit for bit |", "|---|---|---|---|---|---|---|---|---|---|---|",
      *map(row, rows), "",
      *[f"- {r['date']}: {r['note']}" for r in rows if r.get("note")], END])
  sections.write_section(section, begin=BEGIN, end=END)
  return 0


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  commands = {"run": run, "write": write}
  if not argv or argv[0] not in commands:
    print(f"usage: python -m benchmarks.whole_run {{{'|'.join(commands)}}} ...", file=sys.stderr)
    return 2
  return commands[argv[0]](argv[1:])


if __name__ == "__main__":
  sys.exit(main())
