"""The run directory: one run's files, in a directory that holds no other run.

    runs/<config stem>[_<arg>]/base/                       no overrides
    runs/<config stem>[_<arg>]/<key=value,...>/            overrides, sorted by key

Two runs never share or nest directories, so `--overwrite` of one cannot touch
another. `--overwrite` deletes only the entries in RUN_FILES (what training
writes); a directory holding anything else is refused. A directory written by
`axtrain convert` keeps what convert wrote (CONVERT_FILES and checkpoints/0).
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import shutil

from launcher.errors import ConfigError, UserError
from launcher.flat import flatten
from launcher.run_lock import LOCK_NAME

BASE = "base"  # the directory of a run without overrides (an override name always holds '=')
# What `axtrain launch` writes (the script or manifest that starts the run, the scheduler's log).
# Like the lock it comes before the run's own files and outlives --overwrite.
LAUNCH_DIR = "launch"
# What a training run writes (checkpoints/ and its siblings: trainer/checkpoint.py).
RUN_FILES = frozenset({"config.json", "run.json", "metrics.jsonl", "tensorboard", "profile",
                       "wandb", "checkpoints", "superseded_checkpoints", "corrupt_checkpoints",
                       LOCK_NAME, LAUNCH_DIR})
# What `axtrain convert --from_hf` writes besides RUN_FILES; --overwrite keeps them.
CONVERT_FILES = frozenset({"config.py", "hf_config.json"})
# Fields that choose how a run resumes, not what it trains: equal runs may differ in them,
# and config.json records their defaults (a converted run's config.py must not inherit them).
TRANSIENT = {"checkpoint": {"restore_step": 0}}
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")
_PSEUDO_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
                        "devpts", "configfs", "pstore", "bpf", "fusectl", "mqueue"})


def default_dir(config_path: str, overrides: list[tuple[str, str]]) -> pathlib.Path:
  """`runs/tiny/base` or `runs/tiny/data.seq_len=32,trainer.max_steps=200`.

  The name lists the overrides sorted by key (the last value of a repeated key
  wins, as in the config), so flag order does not make another run.
  """
  path, _, arg = config_path.partition(":")
  out = pathlib.Path("runs") / _UNSAFE.sub("_", pathlib.Path(path).stem + (f"_{arg}" if arg else ""))
  if not overrides:
    return out / BASE
  slug = _UNSAFE.sub("_", ",".join(f"{k}={v}" for k, v in sorted(dict(overrides).items())))
  if len(slug) > 150:
    slug = slug[:120] + "-" + hashlib.sha1(slug.encode()).hexdigest()[:10]
  return out / slug


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
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UserError(f"{flag} {path}: {existing} is not writable by this user")


def _fstype(path: pathlib.Path) -> str | None:
  """The filesystem type of the mount holding `path` (Linux /proc/self/mounts), if known."""
  try:
    mounts = pathlib.Path("/proc/self/mounts").read_text().splitlines()
  except OSError:
    return None
  resolved, best, kind = str(path.resolve()), "", None
  for line in mounts:
    fields = line.split()
    if len(fields) < 3:
      continue
    point = fields[1].replace("\\040", " ")
    if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
      best, kind = point, fields[2]
  return kind


def versions() -> dict:
  out = {"python": platform.python_version()}
  for pkg in ("axtrain", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ml-collections"):
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(path: pathlib.Path, obj) -> None:
  """Atomic: a crash leaves the old file or the new one, never half of one."""
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
  os.replace(tmp, path)


def _read_json(path: pathlib.Path):
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def _differ(stored: dict, resolved: dict) -> list[str]:
  """The flat keys in which a run directory's config.json and this run's config differ.

  A key that the stored config lacks (written before the field existed) is no difference
  when this run has it at its default: adding a field with a default keeps old runs the same.
  """
  flat_a, flat_b = ({k: json.dumps(v) for k, v in flatten(d).items()} for d in (stored, resolved))
  new = set(flat_b) - set(flat_a)
  default = {}
  if new:
    from trainer.config import defaults  # pylint: disable=import-outside-toplevel
    try:
      default = {k: json.dumps(v) for k, v in flatten(defaults(resolved)).items()}
    except ConfigError:
      default = {}
  return sorted(k for k in set(flat_a) | set(flat_b) if flat_a.get(k) != flat_b.get(k)
                and not (k in new and k in default and default[k] == flat_b[k]))


def _keys(keys: list[str]) -> str:
  return ", ".join(keys[:4]) + (" ..." if len(keys) > 4 else "")


class RunDir:
  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)

  config_json = property(lambda self: self.path / "config.json")
  run_json = property(lambda self: self.path / "run.json")
  metrics_jsonl = property(lambda self: self.path / "metrics.jsonl")

  def info(self) -> dict:
    info = _read_json(self.run_json)
    return info if isinstance(info, dict) else {}

  def status(self) -> str | None:
    return self.info().get("status")

  def converted(self) -> bool:
    """Written by `axtrain convert --from_hf` (then trained on, or not)."""
    return "converted_from" in self.info()

  def foreign(self) -> list[str]:
    """Entries that no axtrain run or convert wrote (temporary `*.tmp` files are ours)."""
    ours = RUN_FILES | (CONVERT_FILES if self.converted() else frozenset())
    return sorted(p.name for p in self.path.iterdir()
                  if p.name not in ours and not p.name.endswith(".tmp"))

  def prepare(self, resolved: dict, *, overwrite: bool) -> str:
    """Checks what is on disk; returns 'new', 'overwrite', 'completed' or 'incomplete'.

    Refuses (UserError) a directory that holds a different config, unless
    `overwrite`, and one that holds files that are not a run's; writes nothing.
    """
    if not self.path.exists() or all(p.name in (LOCK_NAME, LAUNCH_DIR)
                                     for p in self.path.iterdir()):
      return "new"
    foreign = self.foreign()
    if foreign:
      raise UserError(f"{self.path} holds files that axtrain did not write ({', '.join(foreign[:3])}"
                      f"{' ...' if len(foreign) > 3 else ''}); it is not a run directory, "
                      f"choose another --output_dir")
    existing = _read_json(self.config_json)
    if not isinstance(existing, dict):
      if overwrite:
        return "overwrite"
      raise UserError(f"{self.config_json} is missing or not valid JSON; pass --overwrite to "
                      f"start this run over")
    differ = _differ(identity(existing), identity(resolved))
    if differ and self.converted():
      changed = [k for k in differ if k.startswith(("model.", "optimizer.kind",
                                                     "optimizer.state_dtype"))]
      if changed:
        raise UserError(f"{self.path} holds a model converted from Hugging Face; this config "
                        f"changes its {_keys(changed)}, which its weights cannot follow; train into"
                        f" another --output_dir with --config.init.from_run={self.path}")
    if overwrite and self.converted() and not (self.path / "checkpoints" / "0").is_dir():
      raise UserError(f"{self.path}: the converted weights (checkpoints/0) were rotated out by "
                      f"checkpoint.keep, so --overwrite would start from random weights; convert "
                      f"again into a new --output_dir")
    if differ and not overwrite:
      raise UserError(f"{self.path} holds a run with a different config ({_keys(differ)} differ); "
                      f"choose another --output_dir or pass --overwrite")
    if overwrite:
      return "overwrite"
    return "completed" if self.status() == "completed" else "incomplete"

  def clear(self) -> None:
    """Deletes this run's training outputs (only RUN_FILES); keeps what convert wrote."""
    if not self.path.exists():
      return
    converted = self.converted()
    for child in self.path.iterdir():
      if child.name in (LOCK_NAME, LAUNCH_DIR) or child.name not in RUN_FILES:
        continue  # the lock stays held, launch/ started this run; others were refused in prepare()
      if converted and child.name == "checkpoints":
        for step in child.iterdir():  # checkpoints/0 holds the converted weights
          if step.name != "0":
            shutil.rmtree(step) if step.is_dir() and not step.is_symlink() else step.unlink()
      elif converted and child.name == "run.json":
        continue  # rewritten by start(), keeping what convert recorded
      else:
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()

  def start(self, resolved: dict, *, argv: list[str], fresh: bool, extra: dict) -> None:
    if fresh:
      self.clear()
    self.path.mkdir(parents=True, exist_ok=True)
    write_json(self.config_json, identity(resolved))
    previous = self.info()
    kept = {k: v for k, v in previous.items() if k in _CONVERT_INFO}
    info = {
        **kept,
        "argv": argv,
        "status": "running",
        "start_time": _now(),
        "first_start_time": _now() if fresh else previous.get("first_start_time",
                                                              previous.get("start_time", _now())),
        "restarts": 0 if fresh or "restarts" not in previous else previous["restarts"] + 1,
        "versions": versions(),
        "command": " ".join(["axtrain"] + argv[1:]),
        **extra,
    }
    write_json(self.run_json, info)

  def finish(self, status: str, **fields) -> None:
    info = self.info()
    info.update(status=status, end_time=_now(), **fields)
    write_json(self.run_json, info)


# run.json fields of `axtrain convert` that training keeps (convert --to_hf reads hf_dtype).
_CONVERT_INFO = ("converted_from", "architecture", "hf_dtype")
