"""Which files of a run directory axtrain wrote: what `--overwrite` may delete, and nothing else.

    manifest.json   {"written_by": "axtrain", "files": [...]}: every file that axtrain created in
                    the run directory (config.json, run.json, metrics.jsonl, TensorBoard event
                    files, profiler captures, Weights & Biases files, checkpoints moved aside),
                    recorded as it creates them (`Manifest.add`, the `record` callback that
                    trainer/writers.py, trainer/callbacks.py and trainer/checkpoint.py take)
    checkpoints/    Orbax step folders prove themselves: a step-named folder holding Orbax's
                    `_CHECKPOINT_METADATA` (a committed step, damaged or not), or Orbax's
                    temporary folder of a save cut short

A run written before the manifest existed (no manifest.json) is recognised by its layout: an
axtrain run.json, a config.json with the run config's sections, metrics records, TensorBoard
event files named and framed as TensorBoardWriter writes them, profiler captures that run.json
lists, compiler.log, Orbax step folders. So is a run whose manifest was damaged (emptied):
its manifest.json is still its own. `adopt` records those in a new manifest the first time a newer
axtrain resumes the run. Whatever is neither listed nor recognised is someone else's
(`Contents.unproven`): `--overwrite` refuses, naming it.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import struct
from typing import Callable, Iterable

from trainer import disk
from trainer.config import RunConfig

MANIFEST = "manifest.json"
# XLA's log of a run's compiles (launcher/session.py writes it), each start's part headed so.
COMPILER_LOG = "compiler.log"
_COMPILER_LOG_HEAD = re.compile(r"^# \S+: compiling the train and eval steps$")
_TAG = "axtrain"
_STEP = re.compile(r"^\d+(\.\d+)?$")  # checkpoints/<step>, or <step>.<n> once moved aside twice
_ORBAX_TMP = re.compile(r"^\d+\.orbax-checkpoint-tmp(-\d+)?$")
_EVENTS = re.compile(r"^events\.out\.tfevents\.\d+\..+\.\d+\.from\d+$")  # writers.TensorBoardWriter
_SECTIONS = frozenset(f.name for f in dataclasses.fields(RunConfig))  # of every config.json
_OWN = frozenset({MANIFEST, MANIFEST + ".tmp", "config.json.tmp", "run.json.tmp"})
_CHECKPOINT_DIRS = ("checkpoints", "superseded_checkpoints", "corrupt_checkpoints")

Record = Callable[[pathlib.Path], None]  # called with each file or folder axtrain just created


def no_record(path: pathlib.Path) -> None:
  del path


def _read_json(path: pathlib.Path):
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def _files(path: pathlib.Path) -> list[pathlib.Path]:
  """`path` itself if it is a file or a link, else every file and link below it; [] if absent."""
  if path.is_symlink() or path.is_file():
    return [path]
  if not path.is_dir():
    return []
  return sorted(p for p in path.rglob("*") if p.is_symlink() or not p.is_dir())


class Manifest:
  """The manifest of one run directory; written by process 0 only, atomically."""

  def __init__(self, run_dir: pathlib.Path | str):
    self.run_dir = pathlib.Path(run_dir).absolute()
    self.path = self.run_dir / MANIFEST

  def files(self) -> set[str] | None:
    """The relative paths it lists; None when there is no manifest (or it is not axtrain's)."""
    data = _read_json(self.path)
    if not isinstance(data, dict) or data.get("written_by") != _TAG:
      return None
    return {str(f) for f in data.get("files", ()) if isinstance(f, str)}

  def add(self, *paths: pathlib.Path | str) -> None:
    """Records files inside the run directory (paths as the filesystem knows them: absolute,
    or relative to the working directory). A folder stands for every file below it; a path
    not there yet is recorded as the file about to be created."""
    names = set(self.files() or ())
    for path in paths:
      path = pathlib.Path(path).absolute()
      for file in _files(path) or [path]:
        names.add(file.relative_to(self.run_dir).as_posix())
    self._write(names)

  def prune(self) -> None:
    """Drops the files that are gone (deleted by --overwrite)."""
    names = self.files()
    if names is not None:
      self._write({n for n in names if _files(self.run_dir / n)})

  def _write(self, names: set[str]) -> None:
    self.run_dir.mkdir(parents=True, exist_ok=True)
    disk.write_atomic(self.path, (json.dumps({"written_by": _TAG, "files": sorted(names)},
                                             indent=1) + "\n").encode())

  def record(self, path: pathlib.Path) -> None:
    """The `Record` callback: adds one path."""
    self.add(path)


class NewFiles:
  """Records the files that appear under `directory` between `start()` and `done()` (for what a
  library writes under names it chooses: TensorBoard event files, profiler captures)."""

  def __init__(self, directory: pathlib.Path, record: Record):
    self.directory, self.record = pathlib.Path(directory), record
    self._before: set[pathlib.Path] = set()

  def start(self) -> None:
    self._before = set(_files(self.directory))

  def done(self) -> None:
    for path in _files(self.directory):
      if path not in self._before:
        self.record(path)
        self._before.add(path)


# -- what a directory holds ----------------------------------------------------------------

def axtrain_run_json(run_dir: pathlib.Path) -> dict | None:
  """run.json if an axtrain training run or `axtrain convert` wrote it, else None."""
  info = _read_json(run_dir / "run.json")
  if (isinstance(info, dict) and isinstance(info.get("versions"), dict)
      and str(info.get("command", "")).startswith("axtrain")):
    return info
  return None


def orbax_step(path: pathlib.Path) -> bool:
  """A checkpoint step folder that Orbax wrote: its `_CHECKPOINT_METADATA` is Orbax's (the
  arrays may be damaged: such a step is still ours to delete), or a save's temporary folder."""
  if path.is_symlink() or not path.is_dir():
    return False
  if _ORBAX_TMP.match(path.name):
    return True
  meta = _read_json(path / "_CHECKPOINT_METADATA")
  return bool(_STEP.match(path.name)) and isinstance(meta, dict) and "item_handlers" in meta


def _event_file(path: pathlib.Path) -> bool:
  """A TensorBoard event file as TensorBoardWriter names it, starting with its version record."""
  if not _EVENTS.match(path.name) or path.is_symlink():
    return False
  try:
    with open(path, "rb") as f:
      head = f.read(12)
      length = struct.unpack("<Q", head[:8])[0] if len(head) == 12 else 0
      record = f.read(min(length, 256))
  except OSError:
    return False
  return b"brain.Event:" in record


def _metrics_file(path: pathlib.Path) -> bool:
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except (OSError, UnicodeDecodeError):
    return False
  for i, line in enumerate(lines):
    try:
      record = json.loads(line)
    except ValueError:
      if i == len(lines) - 1:
        continue  # a line cut short by a crash
      return False
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
      return False
  return True


def _first_line(path: pathlib.Path) -> str | None:
  try:
    with open(path, encoding="utf-8") as f:
      return f.readline().rstrip("\n")
  except (OSError, UnicodeDecodeError):
    return None


def _by_layout(run_dir: pathlib.Path, rel: str, info: dict | None) -> bool:
  """Whether a run written before manifests existed made the file `rel` (see module doc)."""
  path = run_dir / rel
  parts = rel.split("/")
  if info is None:
    return False
  if rel == "run.json":
    return True
  if rel == "config.json":
    config = _read_json(path)
    return isinstance(config, dict) and _SECTIONS <= set(config)
  if rel == "metrics.jsonl":
    return _metrics_file(path)
  if rel == COMPILER_LOG:
    line = _first_line(path)
    return line is not None and bool(_COMPILER_LOG_HEAD.match(line))
  if parts[0] == "tensorboard" and len(parts) == 2:
    return _event_file(path)
  if parts[0] == "profile" and info.get("profiles"):
    return parts[1:3] == ["plugins", "profile"] and len(parts) == 5
  if parts[0] == "wandb":  # only a run with trainer.wandb_project set writes there
    config = _read_json(run_dir / "config.json")
    return bool(isinstance(config, dict) and (config.get("trainer") or {}).get("wandb_project"))
  return False


@dataclasses.dataclass(frozen=True)
class Contents:
  """Files under some top-level entries of a run directory, split by who wrote them."""
  ours: list[pathlib.Path]  # files and Orbax step folders axtrain wrote
  unproven: list[str]  # relative paths axtrain cannot show it wrote


def contents(run_dir: pathlib.Path, names: Iterable[str]) -> Contents:
  """Who wrote what under the top-level entries `names` (files or folders) of `run_dir`."""
  run_dir = pathlib.Path(run_dir)
  listed = Manifest(run_dir).files()
  info = axtrain_run_json(run_dir)
  ours: list[pathlib.Path] = []
  unproven: list[str] = []
  for name in sorted(names):
    top = run_dir / name
    if not (top.exists() or top.is_symlink()):
      continue
    steps = []
    if name in _CHECKPOINT_DIRS and top.is_dir() and not top.is_symlink():
      steps = [p for p in sorted(top.iterdir()) if orbax_step(p)]
      ours.extend(steps)
    for file in _files(top):
      if any(s in file.parents for s in steps):
        continue
      rel = file.relative_to(run_dir).as_posix()
      if rel == MANIFEST or rel in _OWN:  # the manifest (ours, or emptied in a run directory of
        mine = listed is not None or info is not None  # ours), write_json's temporary files
      else:
        mine = (rel in listed) if listed is not None else _by_layout(run_dir, rel, info)
      (ours.append(file) if mine else unproven.append(rel))
  return Contents(ours=ours, unproven=unproven)


def adopt(run_dir: pathlib.Path, names: Iterable[str]) -> None:
  """Gives a run written before manifests existed its manifest: the files its layout proves."""
  manifest = Manifest(run_dir)
  if manifest.files() is not None:
    return
  found = contents(run_dir, names)
  manifest.add(*(p for p in found.ours if not orbax_step(p)))


def delete(run_dir: pathlib.Path, found: Contents, *, keep: Callable[[pathlib.Path], bool]) -> None:
  """Deletes `found.ours` but what `keep` holds, then the folders that left empty (not the run's)."""
  import shutil  # pylint: disable=import-outside-toplevel
  run_dir = pathlib.Path(run_dir)
  parents = set()
  for path in found.ours:
    if keep(path):
      continue
    parents.update(p for p in path.parents if run_dir in p.parents)
    if path.is_dir() and not path.is_symlink():
      shutil.rmtree(path)
    else:
      path.unlink(missing_ok=True)
  for folder in sorted(parents, key=lambda p: len(p.parts), reverse=True):
    try:
      folder.rmdir()  # only when empty
    except OSError:
      pass
