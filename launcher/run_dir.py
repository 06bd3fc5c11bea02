"""The run directory: config.json, run.json and metrics.jsonl (checkpoints/ later).

    runs/<config stem>[:<arg>][/<override slug>]
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
import sys

from launcher.errors import UserError

_LOCK = ".lock"
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def default_dir(config_path: str, overrides: list[tuple[str, str]]) -> pathlib.Path:
  """`runs/tiny` or `runs/tiny/optimizer.learning_rate=3e-4,trainer.max_steps=200`."""
  path, _, arg = config_path.partition(":")
  name = pathlib.Path(path).stem + (f"_{arg}" if arg else "")
  out = pathlib.Path("runs") / _UNSAFE.sub("_", name)
  if overrides:
    slug = _UNSAFE.sub("_", ",".join(f"{k}={v}" for k, v in overrides))
    if len(slug) > 150:
      slug = slug[:120] + "-" + hashlib.sha1(slug.encode()).hexdigest()[:10]
    out = out / slug
  return out


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


class RunDir:
  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)

  config_json = property(lambda self: self.path / "config.json")
  run_json = property(lambda self: self.path / "run.json")
  metrics_jsonl = property(lambda self: self.path / "metrics.jsonl")

  def status(self) -> str | None:
    try:
      return json.loads(self.run_json.read_text()).get("status")
    except (OSError, ValueError):
      return None

  def prepare(self, resolved: dict, *, overwrite: bool) -> str:
    """Checks what is on disk; returns 'new', 'completed' or 'incomplete'.

    Refuses (UserError) a directory that holds a different config, or files
    that are not a run, unless `overwrite`; nothing is written here.
    """
    if not self.path.exists():
      return "new"
    if not self.path.is_dir():
      raise UserError(f"--output_dir {self.path} exists and is not a directory")
    if not any(p.name != _LOCK for p in self.path.iterdir()):
      return "new"
    if overwrite:
      return "overwrite"
    try:
      existing = json.loads(self.config_json.read_text())
    except FileNotFoundError:
      raise UserError(f"{self.path} is not empty and holds no config.json; choose another "
                      f"--output_dir or pass --overwrite") from None
    except ValueError:
      raise UserError(f"{self.config_json} is not valid JSON; pass --overwrite to start over")
    if existing != resolved:
      diff = sorted(set(_flat(existing).items()) ^ set(_flat(resolved).items()))
      keys = sorted({k for k, _ in diff})
      raise UserError(f"{self.path} holds a run with a different config ({', '.join(keys[:4])}"
                      f"{' ...' if len(keys) > 4 else ''} differ); choose another --output_dir "
                      f"or pass --overwrite")
    return "completed" if self.status() == "completed" else "incomplete"

  def start(self, resolved: dict, *, argv: list[str], fresh: bool, extra: dict) -> None:
    if fresh and self.path.exists():
      for child in self.path.iterdir():  # the lock (launcher/run_lock.py) stays held
        if child.name != _LOCK:
          shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    self.path.mkdir(parents=True, exist_ok=True)
    write_json(self.config_json, resolved)
    previous = {}
    if not fresh and self.run_json.exists():
      try:
        previous = json.loads(self.run_json.read_text())
      except ValueError:
        previous = {}
    info = {
        "argv": argv,
        "status": "running",
        "start_time": _now(),
        "first_start_time": previous.get("first_start_time", previous.get("start_time", _now())),
        "restarts": previous.get("restarts", -1) + 1 if previous else 0,
        "versions": versions(),
        "command": " ".join([os.path.basename(sys.argv[0])] + argv[1:]),
        **extra,
    }
    write_json(self.run_json, info)

  def finish(self, status: str, **fields) -> None:
    info = json.loads(self.run_json.read_text())
    info.update(status=status, end_time=_now(), **fields)
    write_json(self.run_json, info)


def _flat(d, prefix=""):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = json.dumps(v)
  return out
