"""`axtrain plan`: will this config fit that mesh, and how fast should it run? Ahead of time.

usage:
  axtrain plan --config=FILE [--config.a.b=VALUE ...] --mesh=NAME [--json] [--ops]
               [--sweep [--sweep_limit=N] [--sweep_budget_s=S] [--sweep_recipe]]

examples:
  axtrain plan --config=configs/llm_1b.py --mesh=tpu-v5e-16
  axtrain plan --config=configs/llm_70b.py --mesh=gpu-h100-8x16 --json
  axtrain plan --config=configs/tiny.py --mesh=tpu-v5e-4 --sweep
  axtrain plan --config=configs/llama.py:size=125m --mesh=tpu-v5e-1 --sweep
  axtrain plan --config=configs/tiny.py --mesh=tpu-v5e-8 --ops --noeval --nowindowed_einsum

Compiles the train and eval steps for the entry's devices without any (docs/plan.md):
TPU entries with the real TPU compiler (libtpu), GPU entries with XLA's GPU compiler (the
jax-cuda12 plugin's compile-only GPUs), Trainium entries for as many CPU devices plus an
analytic memory model. A plan that does not fit is a report like any other (exit 0). With
the train state in host memory (trainer.state_memory=host) it fits only where each host's RAM
holds the largest phase of the run: its steps, a save, a restore, a first run's compiler heap
(docs/offload.md).
--ops adds where the train step's time goes: its ops' bytes, FLOPs and roofline time by
category (matmul, elementwise, copy/convert, collective, kernel) and the top ops, named by
module (planner/hlo_ops.py); with --nowindowed_einsum (TPU entries) the compiler keeps FSDP
matmuls and their collectives apart, so that every op is counted once.
--sweep tries settings that keep the run's math (planner/sweep_space.py, planner/plan_sweep.py): mesh axes, remat and
gradient accumulation on an entry of several devices; on one device, or where no layout fits,
also trainer.loss_chunk_size, the platform's native lean attention (splash on TPU) and
model.scan_layers, and the eval.microbatch_rows the best one's eval step needs. It compiles the
likeliest first and prints those that fit, fastest first, then the best one's flags.
--sweep_recipe also tries optimizer.state_dtype=bfloat16 and optimizer.kind=adafactor, which
change the training recipe (labelled so).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

from absl import flags

from launcher import config_loading
from launcher.errors import UserError
from trainer import mesh_rules, meshes


def _define_flags(argv: list[str]) -> flags.FlagValues:
  fv = flags.FlagValues()
  config_loading.define(fv, argv)
  flags.DEFINE_string("mesh", None, "Mesh entry to plan for (docs/meshes.md).", flag_values=fv)
  flags.DEFINE_boolean("json", False, "Print the report as JSON.", flag_values=fv)
  flags.DEFINE_boolean("sweep", False, "Try settings that keep the run's math (mesh axes, "
                       "remat, gradient accumulation; on one device, or where no layout fits, "
                       "also loss chunks, attention, scan_layers, eval rows per pass); rank "
                       "those that fit.", flag_values=fv)
  flags.DEFINE_boolean("sweep_recipe", False, "With --sweep: also try "
                       "optimizer.state_dtype=bfloat16 and optimizer.kind=adafactor, which "
                       "change the training recipe "
                       "(labelled so).", flag_values=fv)
  flags.DEFINE_boolean("ops", False, "Also list the train step's ops by bytes and by "
                       "estimated time, named by module, with totals by category.",
                       flag_values=fv)
  flags.DEFINE_integer("ops_top", 10, "How many ops --ops lists.", flag_values=fv)
  flags.DEFINE_boolean("windowed_einsum", True, "TPU entries: let the compiler turn FSDP "
                       "matmuls and their collectives into loops (its default). "
                       "--nowindowed_einsum turns that off, for --ops and the TPU cost model.",
                       flag_values=fv)
  flags.DEFINE_boolean("eval", True, "Also compile the eval step.", flag_values=fv)
  flags.DEFINE_float("margin", 0.05, "Fraction of device memory to keep free, in [0, 1).",
                     flag_values=fv)
  flags.DEFINE_float("sweep_budget_s", 1800.0, "Seconds of compiling a sweep may spend.",
                     flag_values=fv)
  flags.DEFINE_integer("sweep_limit", 12, "Most candidates a sweep compiles.", flag_values=fv)
  config_loading.register_flag_names(fv)
  return fv


def _flag(argv: list[str], name: str) -> str | None:
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      if argv[i + 1].startswith("--"):
        raise UserError(f"--{name} is given no value (the next argument, {argv[i + 1]}, is a "
                        f"flag); write --{name}=VALUE")
      return argv[i + 1]
  return None


def _cpu_devices_flag(n: int) -> str:
  return f"--xla_force_host_platform_device_count={n}"


# `make install` puts the jax-cuda12 plugin (XLA's GPU compiler) here, outside site-packages:
# importable, it makes every JAX process look for CUDA and log that it found none. Only a plan
# of a GPU entry puts it on the path.
GPU_PLUGIN_DIR = pathlib.Path(sys.prefix) / "gpu-compiler"
# What the plugin logs in a process without CUDA (every time; nothing is wrong).
_NO_CUDA_LOG = re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called"
                          r"|^I\d{4} .*cudart_stub\.cc:\d+\] Could not find cuda drivers")


def _gpu_plan_env() -> dict | None:
  """The environment a GPU entry's plan needs (the plugin importable, JAX on its CPU backend
  so that the plugin skips its CUDA check); None when this process has it."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  path = os.environ.get("PYTHONPATH", "")
  if (importlib.util.find_spec("jax_cuda12_plugin") is None and GPU_PLUGIN_DIR.is_dir()
      and str(GPU_PLUGIN_DIR) not in path.split(os.pathsep)):
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(GPU_PLUGIN_DIR), path) if p)
  # Nothing to change: plan here (without the plugin the planner says how to install it).
  return None if env == dict(os.environ) else env


def _restart(argv: list[str], env: dict, *, quiet_cuda: bool = False) -> int:
  """`axtrain plan` again in a fresh process with `env`; `quiet_cuda` leaves out the plugin's
  two lines about a machine without CUDA from its stderr."""
  cmd = [sys.executable, "-m", "launcher", "plan", *argv[1:]]
  if not quiet_cuda:
    return subprocess.run(cmd, env=env, check=False).returncode
  with subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) as child:
    for line in child.stderr:
      if not _NO_CUDA_LOG.match(line):
        sys.stderr.write(line)
        sys.stderr.flush()
  return child.returncode


def main(argv: list[str]) -> int:
  """argv without the `plan` word: [prog, flags...]."""
  if any(a in ("-h", "--help", "-help") for a in argv[1:]):
    sys.stdout.write(__doc__.strip() + "\n")
    return 0
  _check_flag_names(argv)  # a mistyped flag first, before the mesh or the config is read
  name = _flag(argv, "mesh")
  if not name:
    raise UserError("plan: --mesh=NAME is required (an entry of docs/meshes.md, e.g. "
                    "tpu-v5e-16 or gpu-h100-8)")
  entry = meshes.lookup(name)
  if entry.num_devices is None:
    raise UserError(f"plan: --mesh={name} has no fixed device count; plan a named entry, e.g. "
                    f"tpu-v5e-16 or gpu-h100-8")
  # Planning never runs on an accelerator: the CPU backend only (no TPU/GPU initialisation).
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if entry.hardware.platform == "gpu":
    if (env := _gpu_plan_env()) is not None:
      return _restart(argv, env, quiet_cuda=True)
  elif entry.hardware.platform != "tpu":
    want = _cpu_devices_flag(entry.num_devices)
    if want not in os.environ.get("XLA_FLAGS", ""):
      # The CPU device count is fixed when jax initialises: run ourselves again with it.
      return _restart(argv, dict(
          os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {want}".strip()))
  config_loading.check_file(config_loading.config_file_arg(argv), argv=argv[1:])
  fv = _define_flags(argv)
  config_loading.check_values(fv, argv)
  try:
    fv(argv)
  except (flags.Error, AttributeError, KeyError, SyntaxError, TypeError, ValueError) as e:
    raise config_loading.translate(e, argv) from None
  config_loading.check_values(fv, argv)
  if fv.ops_top < 1:
    raise UserError(f"plan: --ops_top must be at least 1, got {fv.ops_top}")
  if fv.sweep_limit < 1:
    raise UserError(f"plan: --sweep_limit must be at least 1, got {fv.sweep_limit}")
  if fv.sweep_recipe and not fv.sweep:
    raise UserError("plan: --sweep_recipe widens a sweep; add --sweep")
  if not 0 <= fv.margin < 1:
    raise UserError(f"plan: --margin={fv.margin:g}: give the fraction of device memory to keep "
                    f"free, from 0 up to (not including) 1, e.g. 0.05 for 5%")
  return _plan(fv, argv, entry)


def _check_flag_names(argv: list[str]) -> None:
  """UserError (with a did-you-mean) for a flag that plan does not have, in the order given."""
  fv = _define_flags(argv)
  for arg in argv[1:]:
    name = arg.lstrip("-").split("=", 1)[0]
    if not arg.startswith("-") or name == "config" or name.startswith("config."):
      continue
    if name not in fv and not (name.startswith("no") and name[2:] in fv):
      raise config_loading.translate(flags.UnrecognizedFlagError(name, arg), argv)


def _plan(fv: flags.FlagValues, argv: list[str], entry: meshes.Entry) -> int:
  # pylint: disable-next=import-outside-toplevel
  from trainer import config as config_lib
  from planner import plan as plan_lib, plan_report
  cfg = fv["config"].value
  rule = mesh_rules.apply_rules(cfg, entry, {k for k, _ in config_loading.overrides(argv)})
  run = config_lib.parse(cfg)
  name = config_loading.config_file_arg(argv)
  if fv.sweep:
    return _sweep(fv, run, entry, name)
  options = plan_lib.WINDOWED_EINSUM_OFF if (
      not fv.windowed_einsum and entry.hardware.platform == "tpu") else None
  p = plan_lib.plan(run, entry, config_name=name, margin=fv.margin, with_eval=fv.eval,
                    compiler_options=options, say=say)
  if fv.json:
    out = dict(plan_report.to_json(p), mesh_rule=rule)
    if fv.ops:
      out["ops"] = plan_report.ops_json(p, fv.ops_top)
    print(json.dumps(out, indent=1, default=str))
  else:
    sys.stdout.write(plan_report.text(p) + (f"  mesh rule: {rule!r}\n" if rule else "")
                     + (plan_report.ops_text(p, fv.ops_top) if fv.ops else ""))
  return 0


def say(text: str) -> None:
  """A progress line of a plan on stderr, as it goes (a large model's compile takes minutes)."""
  print(f"axtrain: plan: {text}", file=sys.stderr, flush=True)


def _sweep(fv: flags.FlagValues, run, entry: meshes.Entry, name: str) -> int:
  """`plan --sweep`: the ranking as text (the best one's flags last) or JSON."""
  from planner import plan_report, plan_sweep  # pylint: disable=import-outside-toplevel

  def progress(cand, p):
    verdict = "fits" if p.fits else "does not fit"
    print(f"  compiled {plan_sweep.label(cand)}: {verdict} ({p.train.seconds:.0f} s)",
          file=sys.stderr, flush=True)
  result = plan_sweep.sweep(run, entry, config_name=name, budget_s=fv.sweep_budget_s,
                            limit=fv.sweep_limit, margin=fv.margin, progress=progress,
                            with_eval=fv.eval, recipe=fv.sweep_recipe, say=say)
  if not fv.json:
    sys.stdout.write(plan_sweep.sweep_text(result))
    return 0
  flags_of = lambda c: {"flags": c.flags(), "recipe_changes": c.recipe_changes()}
  print(json.dumps({
      "mode": result.mode,
      "ranked": [dict(flags_of(c), plan=plan_report.to_json(p)) for c, p in result.ranked],
      "rejected": [dict(flags_of(c), reason=r) for c, r in result.rejected],
      "implied": [dict(flags_of(c), reason=r) for c, r in result.implied],
      "skipped": result.skipped,
      "eval": dataclasses.asdict(result.eval) if result.eval else None,
      "best": flags_of(result.best) if result.best else None}, indent=1, default=str))
  return 0
