"""How long JAX takes to trace a setting's train and eval steps (no lowering, no compile): the
part of every start that the compilation cache cannot save, since its key is the traced program.

    python -m benchmarks.trace_step --config=configs/llm_1b.py --mesh=tpu-v5e-1
    python -m benchmarks.trace_step --config=configs/llm_1b.py --mesh=tpu-v5e-1 --profile

The setting is built as `axtrain plan` builds it for the mesh entry (its mesh rules applied, the
entry's compile-only devices where the entry's platform is not this machine's), and each step is
traced `--repeat` times by a new jit; one JSON line gives the median seconds of each. With
`--profile` one more trace of the train step runs under cProfile, and the functions of this
repository that took most of it (cumulative) follow. Tracing is Python: on a chip's host it runs at
that host's speed (docs/fault_tolerance.md has the figures).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import jax

from core.registry import ConfigError
from launcher import config_loading
from planner import plan as plan_lib
from trainer import config as config_lib, experiment as experiment_lib, mesh_rules, meshes


def build(config: str, mesh: str, overrides: tuple[str, ...] = ()):
  """The experiment of `config` with `overrides` (`--config.a.b=value` flags) on mesh entry
  `mesh` (rules applied; they leave the overridden fields as given), with its abstract train and
  eval inputs."""
  config_loading.register_components()
  entry = meshes.lookup(mesh)
  cfg = config_loading.load(config, *overrides)
  mesh_rules.apply_rules(cfg, entry, {k for k, _ in config_loading.overrides(list(overrides))})
  run = config_lib.parse(cfg)
  on_platform = jax.default_backend() == entry.hardware.platform
  devices = jax.devices() if on_platform else plan_lib.target_devices(entry)[0]
  exp = experiment_lib.build(run, entry, devices, platform=entry.hardware.platform)
  state, batch = plan_lib.abstract_inputs(exp, exp.source.batch_size)
  _, eval_batch = plan_lib.abstract_inputs(exp, run.eval.batch_size)
  return exp, {"train": ("step_fn", (state, batch)),
               "eval": ("eval_fn", (state.params, eval_batch))}


def trace_seconds(exp, name: str, args, *, profile: cProfile.Profile | None = None) -> float:
  """Seconds to trace `exp`'s jitted `name` for `args`, by a new jit (nothing cached)."""
  exp.__dict__.pop(name, None)
  start = time.perf_counter()
  with exp.context():
    if profile is not None:
      profile.enable()
    getattr(exp, name).trace(*args)
    if profile is not None:
      profile.disable()
  return time.perf_counter() - start


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.trace_step", description=__doc__)
  p.add_argument("--config", required=True, help="a config file (as axtrain's --config)")
  p.add_argument("--mesh", default="cpu", help="a mesh entry (trainer/meshes.py)")
  p.add_argument("--repeat", type=int, default=3, help="traces of each step")
  p.add_argument("--profile", action="store_true", help="profile one more train step trace")
  args = p.parse_args(argv)
  if args.repeat < 1:
    p.error(f"--repeat={args.repeat}: one or more")
  try:
    exp, steps = build(args.config, args.mesh)
  except (config_loading.Refused, ConfigError) as e:  # a user's mistake: one line
    p.error(str(e))
  row = {"config": args.config, "mesh": args.mesh, "backend": jax.default_backend()}
  for what, (name, inputs) in steps.items():
    times = [trace_seconds(exp, name, inputs) for _ in range(args.repeat)]
    row[f"{what}_trace_s"] = round(statistics.median(times), 3)
  print(json.dumps(row), flush=True)
  if args.profile:
    prof = cProfile.Profile()
    trace_seconds(exp, *steps["train"], profile=prof)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(
        r"/(modules|trainer)/", 25)
    print(out.getvalue())
  return 0


if __name__ == "__main__":
  sys.exit(main())
