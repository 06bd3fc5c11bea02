"""What `axtrain launch` checks before it writes anything: the checks a run makes first.

The training arguments go through training's own flag parser; the config is resolved under the
mesh entry's rules and checked as a run checks it (trainer/config.py:parse); the run directory
is named as the processes will name it (launcher/session.py). Where the processes see this
filesystem (local, Slurm), the directory is checked as a run checks it before it touches the
disk: writable (launcher/run_dir.py:check_writable), not inside another run
(launcher/folders.py:enclosing_run), and its state under the run lock
(launcher/run_dir.py:RunDir.prepare: a different config, completed, files that are not a
run's; a checkpoint.restore_step that exists). The shapes are checked as each process checks
them when it builds the run, for the launch's device count on an abstract mesh (`layout`); a
named mesh entry's step is compiled on this machine as `axtrain plan` compiles it, and one that
does not fit its devices' memory is refused (`fit`). So a launch that its processes would refuse
is refused here, in one line, before its record is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import shlex
import subprocess
import sys
import threading
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
  from trainer import config as config_lib, mesh_rules  # pylint: disable=import-outside-toplevel
  cfg, items = fv["config"].value, config_loading.overrides(train_args)
  named = None if fv.mesh == "auto" else fv.mesh  # `auto` resolves where the processes run
  if named is not None:
    mesh_rules.apply_rules(cfg, named, {path for path, _ in items})
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
      state = rd.prepare(resolved, overwrite=train.fv.overwrite,
                         rewrite_config=train.fv.rewrite_config)
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


def layout(train: Train, num_devices: int | None, platform: str | None) -> None:
  """The shape checks each process makes when it builds the run (trainer/experiment.py:build:
  the batch over its shards, parameters over their mesh axes, pipeline stages, context chunks),
  for `num_devices` devices of `platform` on an abstract mesh: no device is opened here and
  nothing compiles. Skipped where the count or the config is not known here."""
  if not train.config_known or num_devices is None or platform is None:
    return
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib, experiment, meshes, sharding  # pylint: disable=import-outside-toplevel
  if train.mesh == "auto" and platform != "cpu":
    return  # each process picks its entry by its device kind, unknown here
  # (CPU processes of --mesh=auto take the generic cpu entry: trainer/meshes.py:auto)
  entry = meshes.lookup("cpu" if train.mesh == "auto" else train.mesh)
  if not xla_bridge.backends_are_initialized():  # launch computes nothing: never an accelerator
    jax.config.update("jax_platforms", "cpu")
  experiment.build(config_lib.parse(train.config), entry, sharding.Elsewhere(num_devices, platform))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fit:
  """What `axtrain plan --json` found of the step on the mesh entry's devices."""
  fits: bool
  text: str  # `needs X per device of Y usable (basis)[, and H of host RAM per host of R]`
  command: str  # the plan command, to run by hand


def fit(train: Train, *, say: Callable[[str], None] = lambda _: None) -> Fit:
  """Compiles the train and eval steps for the mesh entry, in a subprocess of `axtrain plan
  --json` (which restarts itself with what a GPU or Trainium entry's compile needs): the same
  compile and verdict as the plan, its progress lines passed to `say` as they come. UserError
  when the plan cannot compile here."""
  from planner import plan_report  # pylint: disable=import-outside-toplevel
  args = [f"--config={config_loading.config_file_arg(list(train.args))}",
          *(f"--config.{path}={value}" for path, value in config_loading.overrides(
              list(train.args))), f"--mesh={train.mesh}"]
  command = shlex.join(["axtrain", "plan", *args])
  result = _plan_json([sys.executable, "-m", "launcher", "plan", "--json", *args], say=say)
  if result.returncode != 0:
    lines = result.stderr.strip().splitlines() or [f"exit {result.returncode}"]
    error = next((l for l in reversed(lines) if l.startswith("axtrain: error: ")), lines[-1])
    raise UserError(f"launch: the memory check (`{command}`) did not compile: "
                    f"{error.removeprefix('axtrain: error: ')}; --nocheck_fit skips it")
  p = json.loads(result.stdout)
  basis = (f"{' '.join(p['compiler'].split()[:2])} peak" if p["fit_source"] == "compiler"
           else "analytic model total")
  host = p.get("host")
  return Fit(fits=p["fits"], command=command,
             text=f"needs {plan_report.gib(p['needed'])} per device of "
                  f"{plan_report.gib(p['usable'])} usable ({basis})"
                  + (f", and {plan_report.gib(p['host_needed'])} of host RAM per host of "
                     f"{plan_report.gib(host['ram'])}" if host and host["ram"] else ""))


def _plan_json(cmd: list[str], *, say: Callable[[str], None]) -> subprocess.CompletedProcess:
  """Runs `axtrain plan --json`: its stdout, and its stderr with each progress line
  (`axtrain: plan: ...`) also told to `say` as it comes."""
  with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True) as child:
    out = []
    reader = threading.Thread(target=lambda: out.append(child.stdout.read()), daemon=True)
    reader.start()
    err = []
    for line in child.stderr:
      err.append(line)
      if line.startswith(_PROGRESS):
        say(f"plan: {line[len(_PROGRESS):].rstrip()}")
    reader.join()
  return subprocess.CompletedProcess(cmd, child.returncode, "".join(out), "".join(err))


_PROGRESS = "axtrain: plan: "  # launcher/plan.py:say


def check_fit(train: Train, *, force: bool, say: Callable[[str], None]) -> None:
  """Refuses (UserError) a job whose step does not fit the named mesh entry's devices, unless
  `force` (then a warning); says what it found. Skipped for an entry without a fixed size and
  for --mesh=auto (each process picks its entry from its devices)."""
  from trainer import meshes  # pylint: disable=import-outside-toplevel
  if (not train.config_known or train.mesh == "auto"
      or meshes.lookup(train.mesh).num_devices is None):
    return
  say(f"compiling the step for {train.mesh} as `axtrain plan` does, to check that it fits "
      f"(seconds for a small model, minutes for a large one; --nocheck_fit skips it)")
  found = fit(train, say=say)
  if found.fits:
    say(f"the step fits {train.mesh}: it {found.text}")
    return
  what = f"the step does not fit {train.mesh}: it {found.text}"
  if force:
    say(f"warning: {what}; launching it anyway (--force)")
    return
  raise UserError(f"launch: {what}; `{found.command} --sweep` ranks settings that fit; --force "
                  f"launches it anyway")
