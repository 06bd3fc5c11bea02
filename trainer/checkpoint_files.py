"""What a committed checkpoint holds on disk, checked without reading an array.

    <run_dir>/checkpoints/<step>/state  Orbax's `_METADATA` (the tree) and an OCDBT database
                                        (`manifest.ocdbt`, `d/`, `ocdbt.process_<i>/` files)
                                        holding one zarr array per leaf
    <run_dir>/checkpoints/<step>/data   the data iterator's state as JSON (`data/metadata`)

`check_step` reads only metadata: the tree, the OCDBT manifest and B+tree nodes, each array's
zarr header and chunk keys, and the size of every data file a value points into. Reading
(trainer/checkpoint.py) starts with it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shutil
import threading
from typing import Any, Callable

import orbax.checkpoint as ocp
import tensorstore as ts

STATE, DATA = "state", "data"


class CheckpointError(Exception):
  """No usable checkpoint where one was expected."""


def committed_steps(directory: pathlib.Path | str) -> list[int]:
  """Committed steps in a checkpoints/ directory, oldest first; [] if it does not exist."""
  return sorted(ocp.path.step.checkpoint_steps(pathlib.Path(directory)))


# Held while a save of this process commits (Orbax renames its temporary folder to <step>), and
# for good by `final_committed_steps`: what a process about to exit says it leaves is what it
# leaves, not a step whose save committed between the listing and the exit.
_COMMITS = threading.Lock()


class GatedCommit(ocp.path.atomicity.AtomicRenameTemporaryPath):
  """Orbax's commit of a save by atomic rename (its default on a local disk), under _COMMITS."""

  async def finalize(self, *args, **kwargs):
    with _COMMITS:
      await super().finalize(*args, **kwargs)


def final_committed_steps(directory: pathlib.Path | str, *, wait_s: float = 60.0) -> list[int]:
  """committed_steps for a process about to exit: waits up to `wait_s` for a commit under way
  to end (a rename and two small files), then keeps every later save of this process from
  committing."""
  _COMMITS.acquire(timeout=wait_s)  # pylint: disable=consider-using-with
  return committed_steps(directory)


def strays(directory: pathlib.Path | str) -> dict[pathlib.Path, str]:
  """Entries of a checkpoints/ directory named like a step that are no folder ({path: what it
  is}): Orbax lists none of them as a checkpoint, and a save of that step would write over it."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    return {}
  found = sorted((p for p in directory.iterdir() if p.name.isdigit() and not p.is_dir()),
                 key=lambda p: int(p.name))
  return {p: ("a link to nothing" if p.is_symlink() and not p.exists() else
              "a file, not a checkpoint folder") for p in found}


def move_aside(path: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
  """Moves `path` into `folder` under its own name, or `<name>.<n>` where that is taken (a step
  set aside twice); returns where it went."""
  folder.mkdir(parents=True, exist_ok=True)
  dest, n = folder / path.name, 1
  while dest.exists() or dest.is_symlink():
    dest, n = folder / f"{path.name}.{n}", n + 1
  shutil.move(str(path), dest)
  return dest


def _read_json(step_dir: pathlib.Path, name: str) -> Any:
  try:
    return json.loads((step_dir / name).read_text())
  except FileNotFoundError:
    raise CheckpointError(f"{name} is missing") from None
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{name} is not readable JSON ({type(e).__name__})") from None


class _Ocdbt:
  """The OCDBT database of one `state` directory, read through tensorstore's dump (no arrays)."""

  def __init__(self, directory: pathlib.Path):
    self.directory = directory
    self._sizes: dict[pathlib.Path, int] = {}
    self._kv = ts.KvStore.open({"driver": "file", "path": str(directory) + "/"}).result()

  def check_location(self, location: str) -> None:
    """`<kind>:<base>:<file>:<offset>:<length>`: the file exists and holds offset + length bytes."""
    _, base, name, offset, length = location.rsplit(":", 4)
    path = self.directory / base / name
    if path not in self._sizes:
      try:
        self._sizes[path] = path.stat().st_size
      except OSError:
        raise CheckpointError(f"{path.relative_to(self.directory)} is missing") from None
    if self._sizes[path] < int(offset) + int(length):
      raise CheckpointError(f"{path.relative_to(self.directory)} holds {self._sizes[path]} bytes, "
                            f"the manifest needs {int(offset) + int(length)}")

  def dump(self, location: str | None = None) -> Any:
    if location is not None:
      self.check_location(location)
    try:
      return ts.ocdbt.dump(self._kv, location).result()
    except Exception as e:  # pylint: disable=broad-except  (any decode failure means unusable)
      what = "manifest.ocdbt" if location is None else location.split(":")[2]
      raise CheckpointError(f"{what} does not decode ({type(e).__name__})") from None

  def entries(self) -> dict[bytes, dict]:
    """key -> leaf entry (`inline_value` or `indirect_value`), every node checked on the way."""
    if not (self.directory / "manifest.ocdbt").is_file():
      raise CheckpointError("manifest.ocdbt is missing")
    versions = self.dump()["versions"]
    root = versions[-1]["root"] if versions else {}
    out = {}
    todo = [(root["location"], b"")] if "location" in root else []
    while todo:
      location, prefix = todo.pop()
      node = self.dump(location)
      for entry in node["entries"]:
        if node["height"] > 0:
          todo.append((entry["location"], prefix + entry["subtree_common_prefix"]))
        else:
          if "indirect_value" in entry:
            self.check_location(entry["indirect_value"])
          out[prefix + entry["key"]] = entry
    return out

  def value(self, entry: dict) -> bytes:
    return entry["inline_value"] if "inline_value" in entry else self.dump(entry["indirect_value"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArrayInfo:
  shape: tuple[int, ...]
  dtype: str


def check_step(step_dir: pathlib.Path | str, *, items=(STATE, DATA)) -> dict[str, ArrayInfo]:
  """Orbax name ("params.layers.mlp.wi") -> ArrayInfo of every array of a committed step.

  Raises CheckpointError (the reason, one clause) unless every file a restore
  reads exists with the size its manifest says and every array's zarr header
  and chunks are present. Reads metadata only.
  """
  step_dir = pathlib.Path(step_dir)
  if DATA in items:
    _read_json(step_dir, f"{DATA}/metadata")
  state_dir = step_dir / STATE
  meta = _read_json(step_dir, f"{STATE}/_METADATA")
  if not isinstance(meta, dict) or not isinstance(meta.get("tree_metadata"), dict):
    raise CheckpointError(f"{STATE}/_METADATA holds no tree")
  if not meta.get("use_ocdbt", True):
    raise CheckpointError("it was not written as an OCDBT database")
  db = _Ocdbt(state_dir)
  try:
    entries = db.entries()
  except CheckpointError as e:
    raise CheckpointError(f"{STATE}/{e}") from None
  zarr3 = meta.get("use_zarr3", False)
  all_chunks = meta.get("store_array_data_equal_to_fill_value", False)
  chunk_counts: dict[bytes, int] = {}
  for key in entries:
    name, _, rest = key.rpartition(b"/")
    if not rest.startswith(b".") and not rest.endswith(b".json"):
      chunk_counts[name] = chunk_counts.get(name, 0) + 1
  out = {}
  for leaf in meta["tree_metadata"].values():
    value = leaf.get("value_metadata", {})
    if value.get("skip_deserialize") or value.get("value_type") not in (
        "jax.Array", "np.ndarray", "scalar"):
      continue
    name = ".".join(str(k["key"]) for k in leaf["key_metadata"])
    header = entries.get(f"{name}/{'zarr.json' if zarr3 else '.zarray'}".encode())
    if header is None:
      raise CheckpointError(f"array {name} has no zarr header in {STATE}/manifest.ocdbt")
    try:
      spec = json.loads(db.value(header))
      shape = tuple(spec["shape"])
      chunks = spec["chunk_grid"]["configuration"]["chunk_shape"] if zarr3 else spec["chunks"]
    except (ValueError, KeyError, TypeError):
      raise CheckpointError(f"array {name}'s zarr header does not parse") from None
    expected = math.prod(-(-s // max(c, 1)) for s, c in zip(shape, chunks))
    found = chunk_counts.get(name.encode(), 0)
    if all_chunks and not zarr3 and found < expected:
      raise CheckpointError(f"array {name} has {found} of its {expected} chunks")
    out[name] = ArrayInfo(shape=shape, dtype=str(spec.get("dtype", spec.get("data_type", ""))))
  return out


def steps_holding(directory: pathlib.Path, step: int | None) -> list[int]:
  """The committed steps of `directory`; CheckpointError where there is none, or `step` (None:
  any) is not one of them."""
  steps = committed_steps(directory)
  if not steps:
    raise CheckpointError(f"{directory} holds no committed checkpoint")
  if step is not None and step not in steps:
    raise CheckpointError(f"{directory} holds no committed checkpoint of step {step}; steps: "
                          f"{', '.join(map(str, steps))}")
  return steps


def readable_step(directory: pathlib.Path | str, step: int | None = None, *,
                  warn: Callable[[str], None]) -> int:
  """The step a reader of a run (convert --to_hf, generate, eval) loads from `directory`:
  `step`, or with None the newest committed step that passes check_step, each newer one that
  does not reported through `warn` and left in place (only training moves checkpoints).
  CheckpointError when there is none, or `step` is not committed or does not pass: it names the
  steps that do."""
  directory = pathlib.Path(directory)
  steps = steps_holding(directory, step)
  broken: dict[int, str] = {}
  for candidate in [step] if step is not None else reversed(steps):
    try:
      check_step(directory / str(candidate), items=(STATE,))
    except CheckpointError as e:
      broken[candidate] = str(e)
      continue
    for bad, why in broken.items():
      warn(f"checkpoint {directory / str(bad)} is unreadable ({why}); using step {candidate}, "
           f"the newest that reads (--step=N chooses another)")
    return candidate
  others = [s for s in steps if s not in broken and _reads(directory / str(s))]
  first = next(iter(broken))
  then = (f"the steps that read: {', '.join(map(str, others))} (--step={others[-1]})" if others
          else "no other step reads either")
  raise CheckpointError(f"checkpoint {directory / str(first)} is unreadable ({broken[first]}); "
                        f"{then}")


def _reads(step_dir: pathlib.Path) -> bool:
  try:
    check_step(step_dir, items=(STATE,))
  except CheckpointError:
    return False
  return True
