"""What `axtrain launch` checks before it writes anything: the checks a run makes first.

The training arguments go through training's own flag parser; the config is resolved under the
mesh entry's rules and checked as a run checks it (trainer/config.py:parse); the run directory
is named as the processes will name it (launcher/session.py). Where the processes see this
filesystem (local, Slurm), the directory is checked as a run checks it before it touches the
disk: writable (launcher/run_dir.py:check_writable), not inside another run
(launcher/folders.py:enclosing_run), and its state under the run lock
(launcher/run_dir.py:RunDir.prepare: a different config, completed, files that are not a
run's; a checkpoint.restore_step that exists). So a launch that its processes would refuse is
refused here, in one line, before its record is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from typing import Any, Callable, Iterator

from absl import flags

from launcher import config_loading, folders, run_dir as run_dir_lib, run_lock
from launcher.errors import UserError

# Training flags that launch sets for every process itself.
OWNED = ("coordinator_address", "num_processes", "process_id", "distributed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Train:
  """The training arguments, parsed and resolved as the processes will resolve them."""
  args: tuple[str, ...]  # as given after `--`
  fv: flags.FlagValues  # parsed by training's own parser
  config: Any  # the ml_collections.ConfigDict, with the mesh entry's rules applied
  run_dir: pathlib.Path  # --output_dir, or the default directory the processes will name
  # False: --mesh=auto on a config with mesh.rules, which apply to the entry the processes
  # detect; then the config here may not be theirs, and its comparison is left to them.
  config_known: bool

  @property
  def mesh(self) -> str:
    return self.fv.mesh


def parse(train_args: list[str], parse_train: Callable[[list[str]], flags.FlagValues], *,
          launch_flags: set[str]) -> flags.FlagValues:
  """The training arguments through training's parser; UserError for those launch owns, for
  launch's own flags given after `--`, and for --print_config."""
  if not train_args:
    raise UserError("launch: give the axtrain arguments after `--`, e.g. axtrain launch "
                    "--backend=local --num_processes=2 -- --config=configs/tiny.py")
  for arg in train_args:
    if not arg.startswith("-"):
      continue
    name = arg.lstrip("-").split("=", 1)[0]
    if name in OWNED:
      raise UserError(f"launch: drop --{name} from the axtrain arguments; launch sets it for "
                      f"every process")
    if name == "print_config":
      raise UserError("launch: --print_config runs no training; run it without launch")
    launch_name = name if name in launch_flags else name.removeprefix("no")
    if launch_name in launch_flags:
      raise UserError(f"launch: --{launch_name} is a launch flag, not an axtrain one: put it "
                      f"before `--` (axtrain launch ... {arg} -- --config=...)")
  return parse_train(["axtrain", *train_args])


def resolve(train_args: list[str], fv: flags.FlagValues) -> Train:
  """The config under the mesh entry's rules, checked; the run directory the processes name."""
  from launcher import session  # pylint: disable=import-outside-toplevel  (imports jax)
  from trainer import config as config_lib, meshes  # pylint: disable=import-outside-toplevel
  cfg, items = fv["config"].value, config_loading.overrides(train_args)
  named = None if fv.mesh == "auto" else fv.mesh  # `auto` resolves where the processes run
  if named is not None:
    meshes.apply_rules(cfg, named, {path for path, _ in items})
  config_lib.parse(cfg)
  run_dir = session._output_dir(  # pylint: disable=protected-access  (the processes' own rule)
      fv, config_loading.config_file_arg(train_args), items, cfg=cfg, mesh=named)
  return Train(args=tuple(train_args), fv=fv, config=cfg, run_dir=run_dir,
               config_known=named is not None or not cfg.mesh.rules)


def check_place(run_dir: pathlib.Path) -> None:
  """Refuses a run directory that cannot be written or lies inside another run's."""
  run_dir_lib.check_writable(run_dir)
  nested = folders.enclosing_run(run_dir)
  if nested is not None:
    raise UserError(folders.nested_message(run_dir, nested))


@contextlib.contextmanager
def claimed(train: Train) -> Iterator[str]:
  """The run directory's state (RunDir.prepare: new, incomplete, extend, overwrite, completed;
  'unchecked' where the config is not known here), under the run lock while launch writes its
  record. A refusal raises UserError and leaves the directory as it was (RunLock)."""
  rd = run_dir_lib.RunDir(train.run_dir)
  with run_lock.RunLock(rd.path):
    if train.config_known:
      resolved = json.loads(train.config.to_json_best_effort())
      state = rd.prepare(resolved, overwrite=train.fv.overwrite)
    else:
      state = "unchecked"
      foreign = rd.foreign() if rd.path.is_dir() else []
      if foreign:
        raise UserError(folders.describe(rd.path, foreign))
    from trainer import checkpoint  # pylint: disable=import-outside-toplevel  (imports orbax)
    checkpoint.check_restore_step(rd.path / "checkpoints", train.config.checkpoint.restore_step)
    yield state


def completed_note(run_dir: pathlib.Path) -> str:
  """What a run says of a completed directory (launcher/session.py), for launch to say instead."""
  hint = "raise --config.trainer.max_steps to extend it" + (
      "" if run_dir_lib.RunDir(run_dir).unproven() else ", or pass --overwrite to train again")
  return f"{run_dir} already completed; nothing to do ({hint}); nothing written or started"
