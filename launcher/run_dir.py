"""The run directory: one run's files, in a directory that holds no other run.

Its default name comes from the command (launcher/run_names.py). Two runs never share or nest
directories, so `--overwrite` of one cannot touch another. `--overwrite` deletes only files
that axtrain can show it wrote (trainer/run_files.py: the run's manifest, Orbax's step
folders); a directory holding anything else is refused, naming what is in the way. A directory
written by `axtrain convert` keeps what convert wrote (CONVERT_FILES and checkpoints/0).

What makes two runs the same run is what their steps compute: every config field but the ones
`relaid` names. Those say where and how the steps run (PLACEMENT: the mesh and its rules,
rematerialisation, gradient accumulation over the same global batch, host offload, ...) or how the run is
logged, watched and checkpointed (BOOKKEEPING); a run resumes with other values of them, on any
mesh or device count, with a note. A stored config.json that lacks a field the config now has
(axtrain gained it since) is the same run when the config holds that field's default. Raising
trainer.max_steps alone extends a run: it continues from its last checkpoint (`prepare` returns
'extend').
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import json
import os
import pathlib
import re
import platform
from typing import Literal

from launcher import folders
from launcher.distributed import RUNTIME_LOG_DIR
from launcher.errors import ConfigError, UserError
from launcher.flat import flatten
from launcher.run_lock import LOCK_NAME
from trainer import config as config_lib, disk, run_files

# What `axtrain launch` writes before the run starts (its script, the scheduler's log): like
# the lock it is the run's, and --overwrite keeps it.
LAUNCH_DIR = "launch"
KEPT = frozenset({LOCK_NAME, LAUNCH_DIR})
# XLA's own log of a run's compiles (launcher/session.py), rather than on the console.
COMPILER_LOG = run_files.COMPILER_LOG
# What a training run writes (checkpoints/ and its siblings: trainer/checkpoint.py).
# (metrics.jsonl.cut: lines of metrics.jsonl cut off by a killed run, trainer/writers.py;
# runtime/: the JAX runtime's log of each process of a multi-process run, distributed.py.)
RUN_FILES = frozenset({"config.json", "run.json", "metrics.jsonl", "metrics.jsonl.cut",
                       "tensorboard", "profile", "wandb", "checkpoints", "superseded_checkpoints",
                       "corrupt_checkpoints", COMPILER_LOG, RUNTIME_LOG_DIR, run_files.MANIFEST,
                       *KEPT})
# What `axtrain convert --from_hf` writes besides RUN_FILES; --overwrite keeps them.
CONVERT_FILES = frozenset({"config.py", "hf_config.json"})
# Fields that choose how a run resumes, not what it trains: equal runs may differ in them,
# and config.json records their defaults (a converted run's config.py must not inherit them).
TRANSIENT = {"checkpoint": {"restore_step": 0}}
EXTENDS = "trainer.max_steps"  # the one field whose raise extends a run rather than changing it
# Where and how the steps are computed, not what they compute: the mesh's axes and rules (and
# so every value a rule chooses), what the backward pass recomputes, how many microbatches the
# global batch is accumulated over (a MoE layer's load-balancing loss is taken over each
# microbatch's tokens: there its gradient moves a little, as another mesh's rounding moves the
# sums), the loss's chunks, the pipeline's microbatches and the attention kernel.
PLACEMENT = ("mesh.", "model.remat", "model.pipeline_microbatches", "trainer.grad_accum_steps",
             "trainer.microbatch_rows", "eval.microbatch_rows", "trainer.loss_chunk_size",
             "trainer.state_memory",
             "model.block.attention.implementation",
             "model.block.attention.query_chunk_size", "model.block.attention.splash_block_size",
             "model.block.attention.pallas_block_q", "model.block.attention.pallas_block_kv",
             "model.block.attention.pallas_products")
# How the run is logged, watched, profiled and checkpointed (checkpoint.restore_step included).
BOOKKEEPING = ("trainer.log_every", "trainer.hang_timeout_s", "trainer.peak_flops",
               "trainer.profile_steps", "trainer.wandb_project", "trainer.compile_cache",
               "checkpoint.")
_PSEUDO_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
                        "devpts", "configfs", "pstore", "bpf", "fusectl", "mqueue"})
State = Literal["new", "overwrite", "completed", "incomplete", "extend", "rewrite_config"]


def relaid(key: str) -> bool:
  """Whether the flat config key is PLACEMENT or BOOKKEEPING: not part of what a run is. A
  block group's member (model.block.blocks.<name>.attention.implementation) is read as the
  block it stands for (modules/block_group.py)."""
  key = re.sub(r"^model\.block\.blocks\.\w+\.", "model.block.", key)
  return any(key == p or (p.endswith(".") and key.startswith(p))
             for p in PLACEMENT + BOOKKEEPING)


def names_directory(key: str) -> bool:
  """Whether an override of `key` names a run's default directory (launcher/run_names.py): not
  when it leaves the run the same run (relaid) or only extends it (trainer.max_steps)."""
  return key != EXTENDS and not relaid(key)


def rewinds(resolved: dict) -> bool:
  """Whether checkpoint.restore_step names a step before trainer.max_steps: the run trains again
  from there, a completed one too (its newer checkpoints are set aside, trainer/loop.py)."""
  flat = flatten(resolved)
  step, end = flat.get("checkpoint.restore_step"), flat.get(EXTENDS)
  return isinstance(step, int) and isinstance(end, int) and 0 < step < end


def identity(resolved: dict) -> dict:
  """`resolved` with the TRANSIENT fields at their defaults: what makes two runs the same run."""
  out = json.loads(json.dumps(resolved))
  for section, fields in TRANSIENT.items():
    if isinstance(out.get(section), dict):
      out[section].update((k, v) for k, v in fields.items() if k in out[section])
  return out


def check_writable(path: pathlib.Path, *, flag: str = "--output_dir") -> None:
  """Refuses (UserError) a directory that cannot be created or written; writes nothing."""
  path = pathlib.Path(path).absolute()
  existing = path
  while not existing.exists() and existing != existing.parent:
    if existing.is_symlink():  # a dangling link
      raise UserError(f"{flag} {path}: {existing} is a broken symbolic link")
    existing = existing.parent
  if not existing.is_dir():
    raise UserError(f"{flag} {path}: {existing} is a file, not a directory")
  fstype = _fstype(existing)
  if fstype in _PSEUDO_FS or existing.resolve().parts[1:2] in (("proc",), ("sys",)):
    raise UserError(f"{flag} {path} is on the kernel's {fstype or 'pseudo'} filesystem; choose a "
                    f"directory on a disk")
  if os.statvfs(existing).f_flag & os.ST_RDONLY:  # refused to every user, root too
    found = disk.mount(existing)
    where = f" ({found[2]} mounted on {found[1]})" if found else ""
    raise UserError(f"{flag} {path}: {existing} is on a read-only filesystem{where}; choose a "
                    f"directory on a writable disk")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UserError(f"{flag} {path}: {existing} is not writable by this user")


def _fstype(path: pathlib.Path) -> str | None:
  """The filesystem type of the mount holding `path` (Linux /proc/self/mounts), if known."""
  found = disk.mount(path)
  return found[2] if found else None


def versions() -> dict:
  out = {"python": platform.python_version()}
  for pkg in ("axtrain", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ml-collections"):
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(path: pathlib.Path, obj) -> None:
  """Atomic: a crash leaves the old file or the new one, never half of one."""
  disk.write_atomic(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def _read_json(path: pathlib.Path):
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def differences(stored: dict, resolved: dict) -> list[str]:
  """Flat keys whose values differ. A key that `stored` lacks is no difference where `resolved`
  holds that field's default: the field was added to axtrain after the run was written. Values
  are compared as JSON with sorted keys: config.json is written so, and a dict inside a list (a
  mesh rule) is the same dict in any order."""
  same = functools.partial(json.dumps, sort_keys=True)
  try:  # flatten: defaults() may give the nested tree as well as flat keys
    defaults = {k: same(v) for k, v in flatten(config_lib.defaults(resolved)).items()}
  except ConfigError:  # a kind this axtrain does not know: every key counts
    defaults = {}
  flat_a, flat_b = ({k: same(v) for k, v in flatten(d).items()} for d in (stored, resolved))
  return sorted(k for k in set(flat_a) | set(flat_b)
                if flat_a.get(k) != flat_b.get(k)
                and not (k not in flat_a and defaults.get(k, object()) == flat_b[k]))


# Schedule lengths that may rise together with trainer.max_steps when a run is extended.
_FOLLOWS = ("optimizer.schedule.decay_steps",)


def extension(stored: dict, resolved: dict, differ: list[str]) -> str | None:
  """'' when `differ` is an extension (trainer.max_steps raised; with it, maybe _FOLLOWS),
  else None; a lowered max_steps gives the reason it cannot be one."""
  if EXTENDS not in differ or not set(differ) <= {EXTENDS, *_FOLLOWS}:
    return None
  old, new = (flatten(d) for d in (stored, resolved))
  if not (isinstance(old.get(EXTENDS), int) and isinstance(new.get(EXTENDS), int)):
    return None
  if new[EXTENDS] < old[EXTENDS]:
    return (f"{EXTENDS} {new[EXTENDS]} is below the run's {old[EXTENDS]}: a run can be "
            f"extended (raise it), not shortened")
  for key in differ:
    if key != EXTENDS:
      before = old.get(key) if old.get(key) is not None else old[EXTENDS]
      after = new.get(key) if new.get(key) is not None else new[EXTENDS]
      if not isinstance(before, int) or not isinstance(after, int) or after < before:
        return None
  return ""


def _changes(old: dict, new: dict, keys: list[str]) -> str:
  """`key old -> new` for the first three of `keys` (flat configs `old`, `new`), and a count of
  the rest."""
  def show(key, flat):
    text = "unset" if key not in flat else json.dumps(flat[key])
    return text if len(text) <= 40 else text[:37] + "..."
  listed = ", ".join(f"{k} {show(k, old)} -> {show(k, new)}" for k in keys[:3])
  return listed + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _keys(keys: list[str]) -> str:
  return ", ".join(keys[:4]) + (" ..." if len(keys) > 4 else "")


def _tmp(name: str) -> bool:
  """write_json's temporary file of one of our files (left by a crash between two lines)."""
  return name.endswith(".tmp") and name[:-len(".tmp")] in RUN_FILES


class RunDir:
  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)

  config_json = property(lambda self: self.path / "config.json")
  run_json = property(lambda self: self.path / "run.json")
  metrics_jsonl = property(lambda self: self.path / "metrics.jsonl")
  manifest = property(lambda self: run_files.Manifest(self.path))

  def info(self) -> dict:
    info = _read_json(self.run_json)
    return info if isinstance(info, dict) else {}

  def info_damage(self) -> str | None:
    """Why run.json holds no record of this run (emptied, cut short, missing beside a
    config.json), or None when it does or the directory holds no run yet."""
    if not self.run_json.exists():
      return "is missing" if self.config_json.exists() else None
    try:
      info = json.loads(self.run_json.read_text())
    except (OSError, ValueError):
      return ("is empty" if self.run_json.is_file() and self.run_json.stat().st_size == 0
              else "is not valid JSON")
    return None if isinstance(info, dict) else "holds no JSON object"

  def status(self) -> str | None:
    return self.info().get("status")

  def stored_config(self) -> dict | None:
    config = _read_json(self.config_json)
    return config if isinstance(config, dict) else None

  def converted(self) -> bool:
    """Written by `axtrain convert --from_hf` (then trained on, or not)."""
    return "converted_from" in self.info()

  def foreign(self) -> list[str]:
    """Top-level entries that no axtrain run or convert writes."""
    ours = RUN_FILES | (CONVERT_FILES if self.converted() else frozenset())
    return sorted(p.name for p in self.path.iterdir() if p.name not in ours and not _tmp(p.name))

  def _deletable(self) -> list[str]:
    """Top-level entries that --overwrite may delete from (never the lock or launch/)."""
    return [p.name for p in self.path.iterdir()
            if p.name not in KEPT and (p.name in RUN_FILES or _tmp(p.name))]

  def contents(self) -> run_files.Contents:
    return run_files.contents(self.path, self._deletable())

  def unproven(self) -> list[str]:
    """Files among the run's entries that axtrain cannot show it wrote (--overwrite refuses)."""
    return self.contents().unproven if self.path.is_dir() else []

  def _names(self, unproven: list[str]) -> str:
    return ", ".join(unproven[:3]) + (" ..." if len(unproven) > 3 else "")

  def prepare(self, resolved: dict, *, overwrite: bool, rewrite_config: bool = False) -> State:
    """Checks what is on disk; returns 'new', 'overwrite', 'completed', 'incomplete', 'extend'
    or 'rewrite_config' (config.json damaged, `rewrite_config` asked to write it again from
    this command and resume the checkpoints: the caller checks they fit its model).

    Refuses (UserError) a directory that holds a different run (its config differs in a field
    that is not `relaid`), unless `overwrite`, and one that holds files that are not a run's;
    `overwrite` only when every file it would delete is axtrain's (run_files.py). A message
    suggests --overwrite only then. Writes nothing.
    """
    # Nothing yet, or a first start cut short before config.json (a full disk): a new run.
    if not self.path.exists() or all(p.name in KEPT or p.name == run_files.MANIFEST or _tmp(p.name)
                                     for p in self.path.iterdir()):
      return "new"
    existing, unproven = self._check_ours()
    if existing is None:
      return self._damaged_config(overwrite=overwrite, rewrite_config=rewrite_config)
    if rewrite_config:
      raise UserError(f"--rewrite_config rewrites a damaged config.json, and {self.config_json} "
                      f"is fine; drop the flag")
    differ = [k for k in differences(identity(existing), identity(resolved)) if not relaid(k)]
    self._check_converted(differ, overwrite=overwrite)
    if overwrite:
      if unproven:
        raise UserError(f"--overwrite deletes only the files axtrain wrote, and {self.path} also "
                        f"holds others ({self._names(unproven)}); move them out of it or choose "
                        f"another --output_dir")
      return "overwrite"
    if not differ:
      return "completed" if self.status() == "completed" and not rewinds(resolved) else (
          "incomplete")
    if self.status() == "converted":
      return "incomplete"  # never trained: its first run may set anything but the model
    reason = extension(identity(existing), identity(resolved), differ)
    if reason == "":
      return "extend"
    saved = max((int(p.name) for p in (self.path / "checkpoints").glob("*") if p.name.isdigit()),
                default=0)
    hint = (f"choose another --output_dir (it also holds files that axtrain did not write: "
            f"{self._names(unproven)})" if unproven
            else f"choose another --output_dir, or pass --overwrite to delete that run (its "
                 f"checkpoints reach step {saved}) and start this one there" if saved
            else "choose another --output_dir or pass --overwrite")
    raise UserError(self._another_run(identity(existing), identity(resolved), differ, reason)
                    + f"; {hint}")

  def _another_run(self, stored: dict, resolved: dict, differ: list[str],
                   reason: str | None) -> str:
    """What the stored run is to this command, in words: another model (the config file that
    trained it, and how its model differs) or another config (how it differs). A raised
    trainer.max_steps is not listed: alone it would extend the run."""
    if reason:
      return f"{self.path} holds a run with a different config ({reason})"
    old, new = flatten(stored), flatten(resolved)
    raised = isinstance(old.get(EXTENDS), int) and isinstance(new.get(EXTENDS), int) and (
        new[EXTENDS] >= old[EXTENDS])
    shown = [k for k in differ if not (raised and k in (EXTENDS, *_FOLLOWS))] or differ
    model = sorted((k for k in shown if k.startswith("model.")),  # kinds, then the outermost
                   key=lambda k: (not k.endswith(".kind"), k.count("."), k))
    if not model:
      return f"{self.path} holds a run with a different config ({_changes(old, new, shown)})"
    command = str(self.info().get("command", ""))
    file = next((a for a in command.split() if a.startswith("--config=")), None)
    return (f"{self.path} holds a run of another model ({f'trained with {file}: ' if file else ''}"
            f"{_changes(old, new, model)})")

  def _damaged_config(self, *, overwrite: bool, rewrite_config: bool) -> State:
    """The state of a run whose config.json is missing or unreadable: started over
    (`overwrite`), its checkpoints resumed under this command's config (`rewrite_config`), or
    refused, naming the way that keeps its checkpoints."""
    if overwrite:
      return "overwrite"
    from trainer.checkpoint_files import committed_steps  # pylint: disable=import-outside-toplevel  (orbax)
    steps = committed_steps(self.path / "checkpoints")
    if rewrite_config:
      if not steps:
        raise UserError(f"--rewrite_config resumes a run's checkpoints, and {self.path} holds "
                        f"none; pass --overwrite to start this run over")
      return "rewrite_config"
    if not steps:
      raise UserError(f"{self.config_json} is missing or not valid JSON; pass --overwrite to "
                      f"start this run over")
    raise UserError(f"{self.config_json} is missing or not valid JSON, so nothing shows this "
                    f"command is that run; its checkpoints (steps {_keys(list(map(str, steps)))})"
                    f" are intact: to resume them, run this command with --rewrite_config (it "
                    f"writes config.json from this command once the newest checkpoint's "
                    f"parameters fit its model), or pass --overwrite to start the run over, "
                    f"deleting them")

  def _check_ours(self) -> tuple[dict | None, list[str]]:
    """(the stored config, files axtrain cannot show it wrote); refuses a directory of others'."""
    foreign = self.foreign()
    if foreign:
      raise UserError(folders.describe(self.path, foreign))
    unproven = self.unproven()
    existing = self.stored_config()
    if unproven and (existing is None or {"config.json", "run.json"} & set(unproven)):
      raise UserError(f"{self.path} holds files that axtrain did not write "
                      f"({self._names(unproven)}); it is not an axtrain run directory, choose "
                      f"another --output_dir")
    return existing, unproven

  def _check_converted(self, differ: list[str], *, overwrite: bool) -> None:
    """Refuses what a directory of `axtrain convert --from_hf` cannot take: another model under
    its weights, or --overwrite once its converted weights are gone."""
    if not self.converted():
      return
    changed = [k for k in differ if k.startswith(("model.", "optimizer.kind",
                                                   "optimizer.state_dtype"))]
    if changed:
      raise UserError(f"{self.path} holds a model converted from Hugging Face; this config "
                      f"changes its {_keys(changed)}, which its weights cannot follow; train into"
                      f" another --output_dir with --config.init.from_run={self.path}")
    if overwrite and not (self.path / "checkpoints" / "0").is_dir():
      raise UserError(f"{self.path}: the converted weights (checkpoints/0) were rotated out by "
                      f"checkpoint.keep, so --overwrite would start from random weights; convert "
                      f"again into a new --output_dir")

  def relaid_changes(self, resolved: dict) -> list[str]:
    """'key old -> new' for each `relaid` field whose value differs from the stored config's:
    what a resumed run changes of where and how it runs (a note says so)."""
    stored, now = identity(self.stored_config() or {}), identity(resolved)
    old, new = flatten(stored), flatten(now)
    show = lambda v: "unset" if v is None else json.dumps(v)  # pylint: disable=unnecessary-lambda-assignment
    return [f"{k} {show(old.get(k))} -> {show(new.get(k))}"
            for k in differences(stored, now) if relaid(k)]

  def clear(self) -> None:
    """Deletes this run's training outputs, only files axtrain wrote (prepare() refused a
    directory holding others); keeps what convert wrote and the lock."""
    if not self.path.exists():
      return
    converted = self.converted()
    kept = {self.manifest.path, self.path / "checkpoints" / "0"} if converted else {
        self.manifest.path}
    if converted:
      kept.add(self.run_json)  # rewritten by start(), keeping what convert recorded
    found = self.contents()
    run_files.delete(self.path, found, keep=lambda p: p in kept)
    for name in self._deletable():  # folders of ours left empty (or empty already)
      folder = self.path / name
      if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
        folder.rmdir()
    self.manifest.prune()

  def start(self, resolved: dict, *, argv: list[str], fresh: bool, extra: dict) -> None:
    if fresh:
      self.clear()
    else:
      run_files.adopt(self.path, self._deletable())  # a run written before manifests existed
    self.path.mkdir(parents=True, exist_ok=True)
    self.manifest.add(self.config_json, self.run_json)
    write_json(self.config_json, identity(resolved))
    previous = self.info()
    kept = {k: v for k, v in previous.items()
            if k in _CONVERT_INFO or (k in _RUN_INFO and not fresh)}
    info = {
        **kept,
        "argv": argv,
        "status": "running",
        "start_time": now(),
        "first_start_time": now() if fresh else previous.get("first_start_time",
                                                              previous.get("start_time", now())),
        "restarts": 0 if fresh or "restarts" not in previous else previous["restarts"] + 1,
        "versions": versions(),
        "command": " ".join(["axtrain"] + argv[1:]),
        **extra,
    }
    write_json(self.run_json, info)

  def finish(self, status: str, **fields) -> None:
    info = self.info()
    info.update(status=status, end_time=now(), **fields)
    write_json(self.run_json, info)


# run.json fields of `axtrain convert` that training keeps (convert --to_hf reads hf_dtype).
_CONVERT_INFO = ("converted_from", "architecture", "hf_dtype")
# ... and of training, while it is not started over: the run's extensions (max_steps raised).
_RUN_INFO = ("extensions",)
# What a run.json written again (RunDir.info_damage) cannot know of the run's earlier starts.
LOST = ("first_start_time", "restarts", *_RUN_INFO)
