"""Training on a real accelerator, as a user runs it: tokens/s, MFU and peak memory per setting.

On the lent TPU chip (../shared/chip/README.md), after `../shared/chip/wheels.sh` here:

    bash .chip/on_chip.sh python3 -m benchmarks.chip run --out=$OUT [--profile] [NAME ...]
    python -m benchmarks.chip write $OUT/chip.jsonl     # here: BENCHMARKS.md's chip section
    bash .chip/on_chip.sh python3 -m benchmarks.chip compare --out=$OUT [--plain=V,...] [NAME ...]

Each setting is one `axtrain` command (launcher.main.main, in this process: one opening of the
chip for all of them) with `--config.trainer.max_steps` and per-step logging; its figures are
medians over the steps after the first WARMUP of the run's own metrics.jsonl (the loop's
`step_time_s`, host syncs included), and the device's peak memory (`memory_peak_bytes`).
`--profile` also traces a few steps with jax.profiler and sums the device's op times by name
(profile_summary), so that where the time goes comes back as one small JSON file.

`compare` trains a setting (default 125m-b4) through axtrain's loop (trainer.loop.train, the
CLI's config, overrides and mesh rules) and benchmarks/plain_jax.py's one jitted step on the
same model, batches, start and optimizer, in alternating rounds of --steps steps (steps 2..K
timed, medians over --rounds), into compare.jsonl: ratio = axtrain tokens/s / plain tokens/s.
A setting takes overrides after a colon, e.g. axtrain with its projections fused (plain JAX's
`fused` variants fuse theirs by hand) beside the setting as shipped:

    bash .chip/on_chip.sh python3 -m benchmarks.chip compare --out=$OUT 125m-b4 \
        125m-b4:--config.model.block.attention.fused_qkv=true,--config.model.block.ffn.fused_gate_up=true
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import pathlib
import re
import shutil
import statistics
import sys
import threading
import time

from benchmarks import sections
ROOT = pathlib.Path(__file__).resolve().parents[1]
WARMUP = 5  # steps left out of the medians (compilation, first dispatches)
STEPS = 30

# name -> (config, overrides): the settings of BENCHMARKS.md's chip table. Overrides are those a
# user would type; the recipes' own mesh rules choose the rest on the chip.
_ONE_EVAL = ("--config.eval.num_batches=1",)  # one eval batch at the end: not what is timed
SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tiny": ("configs/tiny.py", _ONE_EVAL),
    # The recipes as shipped: their mesh rules fit them to the chip.
    "125m": ("configs/llama.py:size=125m", _ONE_EVAL),
    "1b": ("configs/llm_1b.py", _ONE_EVAL),
    # One microbatch a step: the settings of issue 32's first measurements (125m 4 sequences,
    # no remat; llm_1b 8 sequences, full remat), as the rules lay them out now.
    "125m-b4": ("configs/llama.py:size=125m", ("--config.data.batch_size=4", *_ONE_EVAL)),
    # llm_1b as shipped (state in host memory) with 4 of its 16 layers: what fits the lent
    # machine's time and host RAM, for the host transfers' share of a step.
    "1b-l4": ("configs/llm_1b.py", ("--config.model.num_layers=4", *_ONE_EVAL)),
    # Adafactor with the state on the chip, full remat and splash, as issue 32 measured it (the
    # one-chip rule now keeps AdamW's state in host memory and saves the matmuls' outputs with
    # pallas_hd64: at 8 rows that does not fit).
    "1b-b8": ("configs/llm_1b.py", ("--config.data.batch_size=8",
                                    "--config.trainer.microbatch_rows=8",
                                    "--config.optimizer.kind=adafactor",
                                    "--config.trainer.state_memory=device",
                                    "--config.model.remat=full",
                                    "--config.model.block.attention.implementation=splash",
                                    *_ONE_EVAL)),
}


# setting -> (steps, warmup) when --steps is not given: a recipe's step is a whole global batch
# (64 microbatches: 125m ~5 s, 1b ~45 s on the chip), the others one microbatch.
STEPS_OF = {"125m": (3, 1), "1b": (2, 1), "1b-l4": (2, 1), "125m-b4": (15, 5), "1b-b8": (8, 3)}


def argv_for(name: str, overrides: tuple[str, ...], *, steps: int, out: pathlib.Path,
             profile: tuple[int, int] | None) -> list[str]:
  config, preset = SETTINGS.get(name, (None, ()))
  if config is None:
    raise SystemExit(f"benchmarks.chip: unknown setting '{name}'; settings: {', '.join(SETTINGS)}")
  argv = ["axtrain", f"--config={config}", *preset, *overrides,
          f"--config.trainer.max_steps={steps}", "--config.trainer.log_every=1",
          f"--config.checkpoint.every_steps={10 * steps}", f"--output_dir={out}", "--overwrite"]
  if profile:
    argv.append(f"--config.trainer.profile_steps=({profile[0]}, {profile[1]})")
  return argv


def profile_summary(trace_dir: pathlib.Path, top: int = 60) -> dict:
  """Device op time by op name over the captured steps, from jax.profiler's xplane file: per
  device plane and line ("XLA Ops", "XLA Modules", ...), the `top` names by total time; the XLA
  Ops line also every op (`ops`: HLO name -> [ms, runs])."""
  from jax.profiler import ProfileData  # pylint: disable=import-outside-toplevel
  files = sorted(trace_dir.rglob("*.xplane.pb"))
  if not files:
    return {}
  data = ProfileData.from_file(str(files[-1]))
  out = {}
  for plane in data.planes:
    if not plane.name.startswith("/device:"):
      continue
    for line in plane.lines:
      total = collections.Counter()
      count = collections.Counter()
      for event in line.events:
        total[event.name] += event.duration_ns
        count[event.name] += 1
      if total:
        out[f"{plane.name} | {line.name}"] = entry = {
            "total_ms": sum(total.values()) / 1e6,
            "top": [[name, round(ns / 1e6, 3), count[name]] for name, ns in total.most_common(top)]}
        if line.name == "XLA Ops":  # every op by its HLO name, for benchmarks/chip_ops.py
          entry["ops"] = {op_name(name): [round(ns / 1e6, 5), count[name]]
                          for name, ns in total.items()}
  return out


def op_name(event: str) -> str:
  """An XLA Ops event's HLO instruction name ("%fusion.12 = bf16[...] fusion(...)" -> fusion.12)."""
  m = re.match(r"%?([\w.\-]+)", event)
  return m[1] if m else event


def _host_rss_bytes() -> int:
  """This process's resident host memory (Linux /proc; 0 elsewhere): offloaded state counts."""
  try:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


class MemoryWatch:
  """The device's memory_stats() polled while a run trains: the largest value of each field
  seen (is a step's scratch space counted anywhere while it runs?), and the process's host RSS
  (host_rss_bytes: what offloaded state and checkpoints take of the host's RAM)."""

  def __init__(self, period_s: float = 0.005):
    self.period_s, self.seen, self._stop = period_s, {}, threading.Event()
    self._thread = threading.Thread(target=self._poll, daemon=True)

  def _poll(self) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    device = jax.devices()[0]
    while not self._stop.wait(self.period_s):
      stats = dict(device.memory_stats() or {}, host_rss_bytes=_host_rss_bytes())
      for k, v in stats.items():
        self.seen[k] = max(self.seen.get(k, v), v)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()


def run_one(name: str, overrides: tuple[str, ...], *, steps: int, work: pathlib.Path,
            profile: bool, keep_trace: pathlib.Path | None = None, warmup: int = WARMUP) -> dict:
  """Trains one setting; returns its row (medians of the logged steps after WARMUP)."""
  from launcher import main as main_lib  # pylint: disable=import-outside-toplevel
  run_dir = work / name.replace("/", "_")
  window = (warmup + 1, min(warmup + 3, steps)) if profile else None
  argv = argv_for(name, overrides, steps=steps, out=run_dir, profile=window)
  start = time.time()
  with MemoryWatch() as watch:
    code = main_lib.main(argv)
  row = {"setting": name, "argv": argv[1:], "code": code, "wall_s": round(time.time() - start, 1),
         "memory_stats_max": watch.seen}
  metrics = run_dir / "metrics.jsonl"
  if code != 0 or not metrics.exists():
    return row
  records = [json.loads(line) for line in metrics.read_text().splitlines()]
  steps_ = [r for r in records if "step_time_s" in r and r["step"] > warmup]
  run = json.loads((run_dir / "run.json").read_text())
  for key in ("step_time_s", "tokens_per_sec", "mfu"):
    values = [r[key] for r in steps_ if key in r]
    if values:
      row[key] = statistics.median(values)
  peaks = [r["memory_peak_bytes"] for r in records if "memory_peak_bytes" in r]
  row["memory_peak_bytes"] = max(peaks) if peaks else None
  row["compiled_step"] = run.get("compiled_step")
  row["mesh"] = run.get("mesh")
  row["config"] = json.loads((run_dir / "config.json").read_text())
  row["loss_last"] = steps_[-1].get("loss") if steps_ else None
  if profile:
    row["profile"] = profile_summary(run_dir / "profile")
    traces = sorted((run_dir / "profile").rglob("*.xplane.pb"))
    if keep_trace is not None and traces and traces[-1].stat().st_size < 16e6:
      shutil.copy(traces[-1], keep_trace / f"{name.replace('/', '_')}.xplane.pb")
  import jax  # pylint: disable=import-outside-toplevel
  row["memory_stats"] = jax.devices()[0].memory_stats()  # after the run, for what it reports
  return row


def profile_alone(argv: list[str]) -> list[str]:
  """`run`'s arguments with a bare `--profile` meaning every setting: argparse would take the
  word after it, a setting, as the names to profile and leave that setting out of the run (a
  call on the chip lost 125m-b4 that way); `--profile=NAME,...` profiles those."""
  return ["--profile=all" if a == "--profile" else a for a in argv]


def run_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m benchmarks.chip run")
  p.add_argument("--out", required=True, help="folder for chip.jsonl (the device tool's $OUT)")
  p.add_argument("--steps", type=int, default=0, help=f"steps per setting (default: STEPS_OF, "
                                                      f"else {STEPS})")
  p.add_argument("--profile", default="",  # a bare --profile is "all" (profile_alone)
                 help="trace 3 steps of each setting; --profile=NAME,...: of these")
  p.add_argument("--warmup", type=int, default=-1, help="first steps left out of the medians "
                                                       f"(default: STEPS_OF, else {WARMUP})")
  p.add_argument("--keep_traces", action="store_true",
                 help="copy each trace's .xplane.pb into --out (under 16 MB each)")
  p.add_argument("--work", default="/tmp/axtrain-chip", help="run directories (scratch)")
  _commit_flag(p)
  p.add_argument("settings", nargs="*", default=list(SETTINGS),
                 help="NAME or NAME:--config.a=1,--config.b=2 (extra overrides)")
  return p


def run(argv: list[str]) -> int:
  args = run_parser().parse_args(profile_alone(argv))
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  work = pathlib.Path(args.work)
  head = _head(args.commit)
  with open(out / "chip.jsonl", "a", encoding="utf-8") as f:
    for spec in args.settings:
      name, _, extra = spec.partition(":")
      overrides = tuple(o for o in extra.split(",") if o)
      steps, warmup = STEPS_OF.get(name, (STEPS, WARMUP))
      steps, warmup = args.steps or steps, warmup if args.warmup < 0 else args.warmup
      row = {**head, **run_one(name, overrides, steps=steps, work=work,
                               profile=args.profile == "all" or name in args.profile.split(","),
                               warmup=warmup,
                               keep_trace=out if args.keep_traces else None)}
      f.write(json.dumps(row) + "\n")
      f.flush()
      print(f"benchmarks.chip: {spec}: " + json.dumps(
          {k: row.get(k) for k in ("code", "step_time_s", "tokens_per_sec", "mfu",
                                   "memory_peak_bytes", "wall_s")}), flush=True)
      shutil.rmtree(work / name.replace("/", "_"), ignore_errors=True)
  return 0


HISTORY = ROOT / "benchmarks" / "chip_runs.jsonl"  # every measured row, oldest first
PLANS = ROOT / "benchmarks" / "chip_plans.json"  # setting -> what `axtrain plan` said of it
BEGIN, END = "<!-- chip: begin -->", "<!-- chip: end -->"
_KEEP = ("date", "commit", "device", "setting", "argv", "code", "step_time_s", "tokens_per_sec",
         "mfu", "memory_peak_bytes", "compiled_step", "mesh", "memory_stats_max", "loss_last")


def plan_setting(name: str) -> dict:
  """`axtrain plan` of a setting on the chip's entry (tpu-v5e-1), in this process (libtpu's
  compile-only topology): its estimate and peak, for the table's planned columns."""
  from launcher import main as main_lib  # pylint: disable=import-outside-toplevel
  import contextlib, io  # pylint: disable=import-outside-toplevel,multiple-imports
  config, preset = SETTINGS[name]
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    code = main_lib.main(["axtrain", "plan", f"--config={config}", *preset,
                          "--mesh=tpu-v5e-1", "--noeval", "--json"])
  if code:
    raise SystemExit(f"benchmarks.chip: plan of {name} failed ({code})")
  p = json.loads(out.getvalue())
  e = p["estimate"] or {}
  return {"from": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
          "step_s": e.get("step_s"), "mfu": e.get("mfu"), "train_peak": p["train_peak"],
          "calibration": (e.get("calibration") or {}).get("source")}


def _gib(n) -> str:
  return "-" if n is None else f"{n / 2**30:.2f} GiB"


def table(rows: list[dict], plans: dict) -> str:
  lines = ["| date | commit | setting | step time | tokens/s | MFU | peak memory (device, polled) | "
           "step memory (compiler) | plan: step | plan: peak |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if r.get("code") != 0 or "step_time_s" not in r:
      continue
    extra = _extra(r)
    plan = plans.get(r["setting"], {})
    # A setting's plan is of it as shipped when it was planned ("from"): not of a row with
    # overrides, nor of one that ran before the recipe last changed.
    plan = {} if extra or r["date"] < plan.get("from", "") else plan
    step = plan.get("step_s")
    err = f" ({step / r['step_time_s'] - 1:+.0%})" if step else ""
    compiled = (r.get("compiled_step") or {}).get("total_bytes")
    watched = r.get("memory_stats_max") or {}
    # The most held at once while it ran: buffers plus the scratch reserved for a running step
    # (trainer/metrics.py:device_peak), polled; the allocator's own peaks last the process.
    peak = (watched["bytes_in_use"] + watched.get("bytes_reserved", 0)
            if "bytes_in_use" in watched else r.get("memory_peak_bytes"))
    setting = r["setting"] + "".join(f" `{o}`" for o in extra)
    lines.append(f"| {r['date']} | {r['commit']} | {setting} | {r['step_time_s']:.4g} s | "
                 f"{r['tokens_per_sec']:,.0f} | {r['mfu']:.3f} | "
                 f"{_gib(peak)} | {_gib(compiled)} | "
                 + (f"{step:.4g} s{err}" if step else "-") + f" | {_gib(plan.get('train_peak'))} |")
  return "\n".join(lines)


_PLUMBING = ("trainer.max_steps", "trainer.log_every", "checkpoint.every_steps",
             "trainer.profile_steps")


def _extra(r: dict) -> list[str]:
  """A row's overrides beyond its setting's own and the run's plumbing, shortened to their last
  two names (`attention.implementation=pallas_hd64`)."""
  own = set(SETTINGS.get(r["setting"], ("", ()))[1])
  out = []
  for arg in r.get("argv", ()):
    if arg.startswith("--config.") and "=" in arg and arg not in own:
      path, value = arg.removeprefix("--config.").split("=", 1)
      if path not in _PLUMBING:
        out.append(".".join(path.split(".")[-2:]) + "=" + value)
  return out


def write(argv: list[str]) -> int:
  """Appends the rows of the given chip.jsonl files to HISTORY, plans the settings that lack a
  plan (`--plan`), and rewrites BENCHMARKS.md's chip section from both."""
  p = argparse.ArgumentParser(prog="python -m benchmarks.chip write")
  p.add_argument("files", nargs="*", help="chip.jsonl files brought back from the chip")
  p.add_argument("--plan", action="store_true", help="plan the settings without a plan")
  args = p.parse_args(argv)
  with open(HISTORY, "a", encoding="utf-8") as f:
    for path in args.files:
      for line in pathlib.Path(path).read_text().splitlines():
        row = json.loads(line)
        f.write(json.dumps({k: row[k] for k in _KEEP if k in row}) + "\n")
  rows = [json.loads(line) for line in HISTORY.read_text().splitlines()] if HISTORY.exists() else []
  plans = json.loads(PLANS.read_text()) if PLANS.exists() else {}
  if args.plan:
    for name in sorted({r["setting"] for r in rows} - set(plans)):
      if name in SETTINGS:
        plans[name] = plan_setting(name)
        PLANS.write_text(json.dumps(plans, indent=1) + "\n")
  section = (f"{BEGIN}\n## On the chip (one TPU v5e, the `device` tool)\n\n"
             f"Measured by `bash .chip/on_chip.sh python3 -m benchmarks.chip run --out=$OUT "
             f"SETTING...` (benchmarks/chip.py: the settings trained through axtrain's CLI, "
             f"medians of the logged steps), written here by `python -m benchmarks.chip write "
             f"chip.jsonl --plan` with what `axtrain plan --mesh=tpu-v5e-1` estimated for the "
             f"same setting as shipped (planner/calibration.py; `-` for a row with overrides, "
             f"shown after its setting, or one that ran before the recipe changed). "
             f"Settings:\n\n"
             + "\n".join(f"- `{n}`: `axtrain --config={c} {' '.join(o)}`"
                          for n, (c, o) in SETTINGS.items()) + "\n\n" + table(rows, plans)
             + f"\n{END}")
  sections.write_section(section, begin=BEGIN, end=END)
  return 0


COMPARE_STEPS, COMPARE_ROUNDS = 20, 5
COMPARE_SETTINGS = ("125m-b4",)
# Plain JAX variants timed by default; the ratio is taken against the fastest.
COMPARE_PLAIN = ("unrolled", "unrolled+fused", "unrolled+permute", "unrolled+fused+permute")


def compare_run(argv: list[str]) -> int:
  """`compare`: axtrain's training loop against plain JAX (benchmarks/plain_jax.py) per setting,
  alternating rounds in this one process (benchmarks/compare.py:measure); one JSON record per
  setting in --out/compare.jsonl, ratio = axtrain tokens/s / the fastest plain variant's."""
  p = argparse.ArgumentParser(prog="python -m benchmarks.chip compare")
  p.add_argument("--out", required=True, help="folder for compare.jsonl (the device tool's $OUT)")
  p.add_argument("--steps", type=int, default=COMPARE_STEPS,
                 help="steps per round; steps 2..K are timed")
  p.add_argument("--rounds", type=int, default=COMPARE_ROUNDS, help="rounds per side")
  p.add_argument("--plain", default=",".join(COMPARE_PLAIN),
                 help="plain JAX variants, comma-separated, each words joined by '+' "
                      "(benchmarks/compare.py:VARIANT_WORDS), e.g. unrolled,scan+fused+permute")
  _commit_flag(p)
  p.add_argument("settings", nargs="*", default=list(COMPARE_SETTINGS),
                 help="NAME or NAME:--config.a=1,--config.b=2 (extra overrides)")
  args = p.parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  with open(out / "compare.jsonl", "a", encoding="utf-8") as f:
    for spec in args.settings:
      row = {**_head(args.commit), **compare_one(spec, plain=tuple(args.plain.split(",")),
                                              steps=args.steps, rounds=args.rounds)}
      f.write(json.dumps(row) + "\n")
      f.flush()
      summary = {k: row.get(k) for k in ("ratio", "fastest_plain", "ratios", "error")}
      summary["tokens_per_sec"] = {n: round(s["tokens_per_sec"])
                                   for n, s in row.get("sides", {}).items()}
      print(f"benchmarks.chip compare: {spec}: " + json.dumps(summary), flush=True)
  return 0


def _commit_flag(p: argparse.ArgumentParser) -> None:
  p.add_argument("--commit", default="", help="the commit of the tree that runs (the chip's copy "
                 "of the tree may carry another .git: `git rev-parse --short HEAD > .chip/commit`"
                 " here, then --commit=$(cat .chip/commit) there)")


def _head(commit: str) -> dict:
  """What every record of `run` and `compare` starts with: when, which tree, which devices."""
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks import machine  # pylint: disable=import-outside-toplevel
  return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
          "commit": commit or machine.git_commit(), "device": jax.devices()[0].device_kind,
          "devices": jax.device_count(), "jax": jax.__version__}


def compare_one(spec: str, *, plain: tuple[str, ...], steps: int, rounds: int) -> dict:
  """One setting's comparison record; a setting plain JAX does not write (ValueError) is
  recorded with its `error` and no figures."""
  from benchmarks import compare  # pylint: disable=import-outside-toplevel
  name, _, extra = spec.partition(":")
  if name not in SETTINGS:
    raise SystemExit(f"benchmarks.chip: unknown setting '{name}'; settings: {', '.join(SETTINGS)}")
  config, preset = SETTINGS[name]
  overrides = (*preset, *(o for o in extra.split(",") if o))
  row = {"setting": spec, "config": config, "overrides": list(overrides), "steps": steps,
         "rounds": rounds}
  start = time.time()
  exp = compare.chip_experiment(config, overrides, steps=steps)
  try:
    variants = {v: compare.variant(exp, v) for v in plain}
  except ValueError as e:
    return {**row, "error": str(e)}
  row["mesh"] = dict(exp.mesh.shape)
  row.update(compare.row(compare.measure(exp, variants, rounds=rounds), exp, variants))
  row["wall_s"] = round(time.time() - start, 1)
  return row


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["run"]:
    return run(argv[1:])
  if argv[:1] == ["write"]:
    return write(argv[1:])
  if argv[:1] == ["compare"]:
    return compare_run(argv[1:])
  raise SystemExit("usage: python -m benchmarks.chip run --out=DIR [--profile] [SETTING ...] | "
                   "write FILE.jsonl... [--plan] | compare --out=DIR [--plain=VARIANTS] "
                   "[SETTING ...]")


if __name__ == "__main__":
  sys.exit(main())
