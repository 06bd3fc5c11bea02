"""One `axtrain` training invocation after its flags parsed: validate, resolve, run."""

from __future__ import annotations

import json
import re
import sys
import traceback

import jax
import ml_collections
from absl import flags

from launcher import config_loading, distributed, flat, run_dir as run_dir_lib
from launcher.errors import UserError, suggest
from trainer import config as config_lib, experiment as experiment_lib, loop, meshes
from trainer.progress import Progress


def select_mesh(name: str) -> meshes.Entry:
  """--mesh=NAME from the registry (it must fit the devices JAX sees), or auto-detected."""
  if name != "auto":
    entry = meshes.lookup(name)
    meshes.check_devices(entry, jax.device_count())
    return entry
  device = jax.devices()[0]
  return meshes.auto(device.platform, device.device_kind, jax.device_count(),
                     jax.process_count())


def set_path(cfg: ml_collections.ConfigDict, path: str, value, *, origin: str) -> None:
  node = cfg
  parts = path.split(".")
  for i, part in enumerate(parts):
    keys = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
    if part not in keys:
      raise UserError(f"{origin}: unknown key '{path}'{suggest(part, keys)}")
    if i < len(parts) - 1:
      node = node[part]
  try:
    node[parts[-1]] = value
  except (TypeError, ValueError) as e:
    raise UserError(f"{origin}: {path}={value!r}: {' '.join(str(e).split())}") from None


def apply_mesh_rules(cfg: ml_collections.ConfigDict, mesh_name: str,
                     explicit: set[str]) -> str | None:
  """Applies the first rule of cfg.mesh.rules whose regex matches; returns that regex."""
  for regex, changes in cfg.mesh.rules:
    try:
      matched = re.fullmatch(regex, mesh_name)
    except re.error as e:
      raise UserError(f"mesh.rules: bad regex '{regex}': {e}") from None
    if matched:
      for path, value in changes.items():
        if path not in explicit:
          set_path(cfg, path, value, origin=f"mesh rule '{regex}'")
      return regex
  return None


def human(n: int) -> str:
  for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
    if n >= scale:
      return f"{n / scale:.2f}{unit}"
  return str(n)


def run(fv: flags.FlagValues, argv: list[str]) -> int:
  distributed.maybe_initialize(fv.coordinator_address, fv.num_processes, fv.process_id)
  cfg: ml_collections.ConfigDict = fv["config"].value
  items = config_loading.overrides(argv)
  entry = select_mesh(fv.mesh)
  rule = apply_mesh_rules(cfg, entry.name, {k for k, _ in items})
  run_cfg = config_lib.parse(cfg)
  exp = experiment_lib.build(run_cfg, entry)
  resolved = json.loads(cfg.to_json_best_effort())

  if fv.print_config:
    sys.stdout.write(flat.flat_text(cfg))
    sys.stdout.write(f"# parameters: {exp.num_params:,} ({human(exp.num_params)})\n")
    sys.stdout.write(f"# mesh: {entry.name} {dict(exp.mesh.shape)}"
                     f"{f' (rule {rule!r})' if rule else ''}\n")
    return 0

  config_value = config_loading.config_file_arg(argv)
  rd = run_dir_lib.RunDir(fv.output_dir or run_dir_lib.default_dir(config_value, items))
  state = rd.prepare(resolved, overwrite=fv.overwrite)
  if state == "completed":
    print(f"axtrain: {rd.path} already completed; nothing to do (pass --overwrite to train again)",
          file=sys.stderr)
    return 0
  main_process = jax.process_index() == 0
  if main_process:
    rd.start(resolved, argv=argv, fresh=state in ("new", "overwrite"),
             extra={"mesh": {"name": entry.name, "axes": dict(exp.mesh.shape), "rule": rule},
                    "num_params": exp.num_params, "process_count": jax.process_count()})
  progress = Progress(run_cfg.trainer.max_steps, enabled=fv.progress and main_process)
  progress.message(f"axtrain: training {config_value} in {rd.path}")
  try:
    result = loop.train(exp, metrics_path=rd.metrics_jsonl if main_process else None,
                        progress=progress)
  except KeyboardInterrupt:
    if main_process:
      rd.finish("interrupted")
    raise
  except Exception:
    if main_process:
      rd.finish("failed", error=traceback.format_exc(limit=-3))
    raise
  if main_process:
    last = next((r for r in reversed(result.records) if "loss" in r), {})
    rd.finish("completed", final_loss=last.get("loss"), final_eval_loss=result.final_eval_loss,
              time_to_first_step_s=result.time_to_first_step_s)
  progress.message(f"axtrain: done; final eval_loss {result.final_eval_loss:.4f}; "
                   f"run directory {rd.path}")
  return 0
