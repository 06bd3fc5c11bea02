"""`make bench`: runs the benchmark suite and writes BENCHMARKS.md (and benchmarks/scaling.png).

    python -m benchmarks.run [--output BENCHMARKS.md]

Sections: this CPU's peak matmul FLOP/s; axtrain against plain JAX (tokens/s,
MFU, ratio, time to first step) for bench_lm, tiny and 125m; step time against
model size; per-device memory under fsdp = 1, 2, 4, 8; the checkpoint and
data-loader figures when benchmarks.bench_checkpoint / bench_data exist.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax

from benchmarks import bench_checkpoint, bench_data, bench_decode, compare, machine, memory, scaling
from benchmarks import tpu_step
from configs import bench_lm, tiny
from configs.base import lm_config
from modules import llama
from trainer import config as config_lib, experiment, meshes

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Steps per run (the first is compile + warm-up, the rest are timed) and rounds per side.
ROUNDS = {"bench_lm": 3, "tiny": 3, "125m": 1}
STEPS = {"bench_lm": 6, "tiny": 6, "125m": 3}
SCALING_BATCH, SCALING_SEQ = 4, 64


def _configs() -> dict:  # built after --quick has set STEPS
  bench = bench_lm.get_config()
  t = tiny.get_config()
  t.eval.num_batches = 1
  big = lm_config(llama.model_node("125m"), max_steps=STEPS["125m"], learning_rate=6e-4,
                  batch_size=SCALING_BATCH, seq_len=SCALING_SEQ, warmup_steps=10,
                  data_kind="synthetic")
  big.eval.batch_size, big.eval.num_batches = SCALING_BATCH, 1
  return {
      "bench_lm": (bench, "as configs/bench_lm.py"),
      "tiny": (t, "as configs/tiny.py (eval cut to one batch; it is not timed)"),
      "125m": (big, f"llama 125m, synthetic data, batch {SCALING_BATCH} x seq "
                    f"{SCALING_SEQ} (shortened to fit the 15-minute budget)"),
  }


def _build(cfg, steps: int) -> experiment.Experiment:
  cfg.trainer.max_steps = steps
  cfg.trainer.log_every = steps
  schedule = cfg.optimizer.schedule  # a warm-up longer than the run is refused
  schedule.warmup_steps = min(schedule.warmup_steps, steps)
  return experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))


def _scaling_config(model_node):
  cfg = lm_config(model_node, max_steps=4, learning_rate=1e-3, batch_size=SCALING_BATCH,
                  seq_len=SCALING_SEQ, warmup_steps=2, data_kind="synthetic")
  cfg.eval.batch_size, cfg.eval.num_batches = SCALING_BATCH, 1
  return cfg


def _table(header: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
  return "\n".join(lines)


def _mib(n: float) -> str:
  return f"{n / 2 ** 20:.1f}"


def _render_extra(value) -> str:
  if isinstance(value, str):
    return value
  if isinstance(value, dict):
    flat = {}
    for k, v in value.items():  # one level of nesting: {"checkpoint": {...}}
      flat.update({f"{k}.{k2}": v2 for k2, v2 in v.items()} if isinstance(v, dict) else {k: v})
    return _table(["figure", "value"], [[k, f"{v:.4g}" if isinstance(v, float) else v]
                                        for k, v in flat.items()])
  if isinstance(value, list) and value and isinstance(value[0], dict):
    header = list(value[0])
    return _table(header, [[row.get(k, "") for k in header] for row in value])
  return f"```\n{value!r}\n```"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
  parser.add_argument("--quick", action="store_true",
                      help="2 steps x 1 round everywhere: checks that the suite runs end to end")
  args = parser.parse_args(argv)
  if args.quick:
    STEPS.update(dict.fromkeys(STEPS, 2))
    ROUNDS.update(dict.fromkeys(ROUNDS, 1))
  out_path = pathlib.Path(args.output)
  started = time.perf_counter()
  info = machine.describe()
  load_start = machine.load_average()
  log = lambda msg: print(f"[bench {time.perf_counter() - started:6.0f}s] {msg}", flush=True)

  peak = machine.peak_matmul_flops()
  log(f"peak matmul {peak / 1e9:.1f} GFLOP/s")
  comparisons = _compare_all(log)
  points = _scaling_points(comparisons, log)
  png = out_path.parent / "benchmarks" / "scaling.png"
  png.parent.mkdir(parents=True, exist_ok=True)
  plotted = scaling.plot(points, png, tokens=SCALING_BATCH * SCALING_SEQ)
  mem = memory.measure_all()
  log("memory done")
  tiny_tps = next(c.tokens_per_step / c.ours_median_s for c, _ in comparisons if c.name == "tiny")
  extras = _run_extras(log)

  total = time.perf_counter() - started
  text = _report(info, peak, comparisons, points, plotted, png, mem, extras, tiny_tps,
                 load=(load_start, machine.load_average()), total=total, out_path=out_path)
  _write(out_path, text)
  log(f"wrote {out_path}")
  return 0


def _compare_all(log) -> list:
  """(axtrain against plain JAX, note) for each config of `_configs`."""
  comparisons = []
  for name, (cfg, note) in _configs().items():
    exp = _build(cfg, STEPS[name])
    c = compare.compare(name, exp, rounds=ROUNDS[name])
    comparisons.append((c, note))
    log(f"{name}: axtrain {c.ours_median_s:.3f}s/step, plain {c.plain_median_s:.3f}s/step, "
        f"ratio {c.ratio:.3f}")
  return comparisons


def _scaling_points(comparisons, log) -> list:
  """Step time against model size: test, tiny, bench_lm measured here, 125m from its
  comparison (which ran at this batch shape)."""
  points = []
  reuse = {c.name: c for c, _ in comparisons}
  for name, node in (("test", llama.model_node("test")), ("tiny", llama.model_node("tiny")),
                     ("bench_lm", bench_lm.model_node()), ("125m", None)):
    if node is None:
      c = reuse["125m"]
      points.append(scaling.Point("125m", c.params, c.flops_per_step, c.ours_median_s))
      continue
    exp = _build(_scaling_config(node), 4)
    points.append(scaling.measure(name, exp, compare.model_flops_per_step(exp)))
    log(f"scaling {name}: {points[-1].step_s:.3f}s/step")
  return points


def _run_extras(log) -> dict:
  """The checkpoint, data and decode sections; one section's failure is reported in its place
  and must not sink the rest of the report."""
  extras = {}
  for key, module in (("checkpoint", bench_checkpoint), ("data", bench_data),
                      ("decode", bench_decode)):
    try:
      extras[key] = module.run()
    except Exception as e:  # pylint: disable=broad-except
      extras[key] = f"{module.__name__}.run() failed: {type(e).__name__}: {e}"
    log(f"{key}: done")
  return extras


def _write(out_path: pathlib.Path, text: str) -> None:
  """Writes the report, keeping `make bench-tpu`'s section (minutes of TPU compiles) as it was
  measured."""
  old = out_path.read_text(encoding="utf-8") if out_path.exists() else ""
  if tpu_step.BEGIN in old and tpu_step.END in old:
    kept = old[old.index(tpu_step.BEGIN):old.index(tpu_step.END) + len(tpu_step.END)]
    text = text.rstrip("\n") + "\n\n" + kept + "\n"
  out_path.write_text(text, encoding="utf-8")


def _report(info, peak, comparisons, points, plotted, png, mem, extras, tiny_tps, *, load,
            total, out_path) -> str:
  mfu = lambda flops, s: f"{100 * flops / s / peak:.1f}%"
  plot = (f"![step time against parameters]({png.relative_to(out_path.parent).as_posix()})"
          if plotted else "(no plot: matplotlib is not installed; `pip install -e '.[bench]'`)")
  parts = [*_head(info, peak, load=load, total=total), *_comparison(comparisons, mfu),
           *_scaling(points, mfu, plot), *_memory(mem), *_extras(extras, tiny_tps)]
  return "\n".join(parts)


def _head(info, peak, *, load, total) -> list[str]:
  return [
      "# Benchmarks",
      "",
      "Generated by `make bench` (`python -m benchmarks.run`); do not edit by hand.",
      "",
      _table(["", ""], [[k, v] for k, v in info.items()] + [
          ["command", " ".join(["python -m benchmarks.run", *sys.argv[1:]])],
          ["load average (1/5/15 min) at start / end", f"{load[0]}  /  {load[1]}"],
          ["wall time of the suite", f"{total / 60:.1f} min"],
          ["peak FLOP/s (best 2048x2048 float32 matmul, jitted, this run)",
           f"{peak / 1e9:.1f} GFLOP/s"]]),
      "",
  ]


def _comparison(comparisons, mfu) -> list[str]:
  parts = [
      "## axtrain against plain JAX",
      "",
      "The same model, batches (packed documents too), starting parameters, loss and AdamW"
      " (clip 1.0, b1 0.9, b2 0.95, weight decay 0.1 on matrices, warm-up + cosine) in"
      " `benchmarks/plain_jax.py`: one jitted function, no framework, written as one would by"
      " hand for speed (layers unrolled, q/k/v and gate/up each one matrix) with the run's"
      " compute dtype, attention kernel, remat, microbatches and loss chunks"
      " (`benchmarks/compare.py:plain_options`, `CPU_VARIANT`). axtrain's figure"
      " is the `step_time_s` its own training loop logs (`trainer.loop.train`, steps 2..K, the"
      " host sync included); plain JAX is timed over the same span. Runs alternate which side"
      " goes first; medians over rounds. On the TPU chip, `python -m benchmarks.chip compare`"
      " runs the same comparison (plain JAX with splash attention beside axtrain's kernel:"
      " `benchmarks/compare.py:plain_attention`; in several variants, the ratio against the"
      " fastest)."
      " Ratio = axtrain tokens/s / plain tokens/s (>= 1: axtrain is at least as fast)."
      " MFU = (6 N T + attention FLOPs) / step time / peak, with N the parameters"
      " that do matmuls (all but the input embedding table) and attention counted as"
      " 12 x layers x seq x dim per token.",
      "",
      _table(["model", "params", "tokens/step", "steps x rounds",
              "axtrain tokens/s", "plain JAX tokens/s", "**ratio**", "axtrain MFU",
              "plain MFU", "time to first step axtrain / plain (s)",
              "loss at step K axtrain / plain"],
             [[c.name, f"{c.params:,}", c.tokens_per_step,
               f"{STEPS[c.name]} x {ROUNDS[c.name]}",
               f"{c.tokens_per_step / c.ours_median_s:,.0f}",
               f"{c.tokens_per_step / c.plain_median_s:,.0f}", f"**{c.ratio:.3f}x**",
               mfu(c.flops_per_step, c.ours_median_s), mfu(c.flops_per_step, c.plain_median_s),
               f"{c.ours_first_s:.1f} / {c.plain_first_s:.1f}",
               f"{c.ours_loss:.5f} / {c.plain_loss:.5f}"] for c, _ in comparisons]),
      "",
      "Per-round step times (s), axtrain | plain:",
      "",
  ]
  for c, note in comparisons:
    parts.append(f"- {c.name} ({note}): " + ", ".join(f"{x:.3f}" for x in c.ours_step_s) +
                 " | " + ", ".join(f"{x:.3f}" for x in c.plain_step_s))
  return parts


def _scaling(points, mfu, plot: str) -> list[str]:
  return [
      "",
      "## Step time against model size",
      "",
      f"axtrain only, synthetic data, batch {SCALING_BATCH} x seq {SCALING_SEQ} "
      f"({SCALING_BATCH * SCALING_SEQ} tokens per step), default `scan_layers=True`.",
      "",
      _table(["model", "params", "model GFLOP/step", "step time (s)", "GFLOP/s", "MFU"],
             [[p.name, f"{p.params:,}", f"{p.flops_per_step / 1e9:.2f}", f"{p.step_s:.3f}",
               f"{p.flops_per_step / p.step_s / 1e9:.1f}", mfu(p.flops_per_step, p.step_s)]
              for p in points]),
      "",
      plot,
      "",
  ]


def _memory(mem) -> list[str]:
  return [
      "## Per-device memory under FSDP (bench_lm, fake CPU devices)",
      "",
      "`XLA_FLAGS=--xla_force_host_platform_device_count=8`, mesh data=1 fsdp=N model=1,"
      " XLA's compiled memory analysis of the train step per device; the state is donated,"
      " so outputs alias arguments.",
      "",
      _table(["fsdp", "train state / device (MiB)", "arguments (MiB)", "outputs (MiB)",
              "aliased (MiB)", "temporaries (MiB)", "peak estimate (MiB)"],
             [[m["fsdp"], _mib(m["state_bytes"]), _mib(m["argument_bytes"]),
               _mib(m["output_bytes"]), _mib(m["alias_bytes"]), _mib(m["temp_bytes"]),
               _mib(m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"]
                    + m["temp_bytes"])] for m in mem]),
      "",
  ]


def _extras(extras, tiny_tps) -> list[str]:
  return [
      "## Checkpointing",
      "",
      _render_extra(extras["checkpoint"]),
      "",
      "## Data loading",
      "",
      f"Training consumption of configs/tiny.py on this machine (from the comparison above): "
      f"{tiny_tps:,.0f} tokens/s.",
      "",
      _render_extra(extras["data"]),
      "",
      *[f"- {k}: {v / tiny_tps:,.0f}x what training tiny consumes"
        for k, v in (extras["data"] or {}).items()
        if isinstance(extras["data"], dict) and k.endswith("tokens_per_s")],
      "",
      "## Decoding (KV cache, `axtrain generate`)",
      "",
      _render_extra(extras["decode"]),
      "",
      "## GPU",
      "",
      "No GPU was lent to the session that wrote this suite; the llm_1b bfloat16 check on an"
      " H100/H200-class GPU is still to be run.",
      "",
  ]


if __name__ == "__main__":
  sys.exit(main())
