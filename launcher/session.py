"""One `axtrain` training invocation after its flags parsed: validate, resolve, run."""

from __future__ import annotations

import json
import pathlib
import re
import sys
import traceback

import jax
import ml_collections
from absl import flags

from launcher import config_loading, distributed, flat, preemption, run_dir as run_dir_lib, run_lock
from launcher.errors import UserError, suggest
from trainer import checkpoint, config as config_lib, experiment as experiment_lib, loop, meshes
from trainer.progress import Progress


EXIT_FAILED = 1  # non-finite loss, no usable checkpoint: retrying the same command will not help


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


def run(fv: flags.FlagValues, argv: list[str], *, callbacks=()) -> int:
  """`callbacks`: trainer.callbacks.Callback objects for the training loop (tests inject them)."""
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
  # restore_step picks where to resume; it is not part of what makes two runs the same run.
  resolved.get("checkpoint", {}).pop("restore_step", None)
  check_init_from(run_cfg.init.from_run)
  main_process = jax.process_index() == 0
  lock = run_lock.RunLock(rd.path) if main_process else None
  if lock is not None:
    lock.acquire()
  try:
    return _train(fv, argv, rd=rd, resolved=resolved, run_cfg=run_cfg, exp=exp, entry=entry,
                  rule=rule, config_value=config_value, main_process=main_process,
                  callbacks=callbacks)
  finally:
    if lock is not None:
      lock.release()


def check_init_from(run_dir: str) -> None:
  if run_dir and not (pathlib.Path(run_dir) / "checkpoints").is_dir():
    raise UserError(f"init.from_run={run_dir}: no checkpoints/ there; give a run directory of "
                    f"axtrain or of `axtrain convert`")


def _train(fv, argv, *, rd, resolved, run_cfg, exp, entry, rule, config_value,
           main_process, callbacks) -> int:
  """Trains in a locked run directory: fresh, or resumed from its last committed checkpoint."""
  state = rd.prepare(resolved, overwrite=fv.overwrite)
  if state == "completed":
    print(f"axtrain: {rd.path} already completed; nothing to do (pass --overwrite to train again)",
          file=sys.stderr)
    return 0
  if main_process:
    rd.start(resolved, argv=argv, fresh=state in ("new", "overwrite"),
             extra={"mesh": {"name": entry.name, "axes": dict(exp.mesh.shape), "rule": rule},
                    "num_params": exp.num_params, "process_count": jax.process_count(),
                    "restore_step": run_cfg.checkpoint.restore_step})
  progress = Progress(run_cfg.trainer.max_steps, enabled=fv.progress and main_process)
  progress.message(f"axtrain: training {config_value} in {rd.path}")
  finish = (lambda status, **kw: rd.finish(status, **kw)) if main_process else (lambda *a, **k: None)
  stop = preemption.Preemption(on_second=lambda: finish("preempted", signal="second"))
  try:
    with stop.installed():
      result = loop.train(exp, run_dir=rd.path, progress=progress,
                          checkpoint_dir=rd.path / "checkpoints", stop_requested=stop.requested,
                          callbacks=callbacks, hardware_peak_flops=entry.hardware.peak_bf16_flops)
  except (loop.NonFiniteError, checkpoint.CheckpointError) as e:
    finish("failed", error=str(e))
    print(f"axtrain: error: {e}", file=sys.stderr)
    return EXIT_FAILED
  except KeyboardInterrupt:
    finish("interrupted")
    raise
  except Exception:
    finish("failed", error=traceback.format_exc(limit=-3))
    raise
  if result.preempted:
    finish("preempted", last_step=result.last_step, resumed_from_step=result.start_step,
           compiled_step=result.compiled, profiles=result.profiles)
    print(f"axtrain: preempted after step {result.last_step}; checkpoint saved in "
          f"{rd.path / 'checkpoints'}; re-run the same command to resume "
          f"(exit {preemption.EXIT_PREEMPTED})", file=sys.stderr)
    return preemption.EXIT_PREEMPTED
  last = next((r for r in reversed(result.records) if "loss" in r), {})
  finish("completed", final_loss=last.get("loss"), final_eval_loss=result.final_eval_loss,
         time_to_first_step_s=result.time_to_first_step_s, resumed_from_step=result.start_step,
         compiled_step=result.compiled, profiles=result.profiles)
  progress.message(f"axtrain: done; final eval_loss {result.final_eval_loss:.4f}; "
                   f"run directory {rd.path}")
  return 0
