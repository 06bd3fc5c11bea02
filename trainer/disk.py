"""Writes that may find the disk full: one error naming the device, the file, what it needed and
what is free, and no half-written file left behind.

A write that finds no room (ENOSPC, or EDQUOT: over a disk quota) raises `NoSpace`:

    no space left on tmpfs mounted on /scratch writing /scratch/run/checkpoints/20
    (22.4 MB needed, 1.2 MB free)

`write_atomic` (config.json, run.json, manifest.json; tokenize's shards, a `runs --plot`
figure, convert's files) leaves the old file or the new one and removes its temporary file; `AppendFile` (metrics.jsonl, TensorBoard event files) takes back a
record the disk had no room for, so the file ends with its last whole record; checkpoints check
`check_room` before a save starts and `as_no_space` reads the error of a save that failed anyway
(trainer/checkpoint.py). A library that reports a full disk only in the OS's words (safetensors,
ArrayRecord) is read by them. The launcher turns NoSpace into its exit code (launcher/errors.py).
"""

from __future__ import annotations

import errno
import os
import pathlib
import re
from typing import Sequence

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
# TensorStore, which writes Orbax's arrays, reports an OS error inside its message.
_TS_CODE = re.compile(r"os_error_code='(\d+)'")
# Libraries in other languages give only the OS's text: safetensors (Rust: "No space left on
# device (os error 28)"), ArrayRecord (riegeli: "write() failed: No space left on device; ...").
_NO_ROOM_TEXT = {os.strerror(code): code for code in NO_ROOM}
_TS_FILE = re.compile(r'Failed (?:writing|to write)[^"]*"([^"]+)"')


def size_text(n: int) -> str:
  """Bytes in decimal units, as `df -H` and `du --si` print them: 412 bytes, 4.1 kB, 22.4 MB."""
  if n < 1000:
    return f"{n} bytes"
  for unit in ("kB", "MB", "GB", "TB"):
    n /= 1000
    if n < 1000 or unit == "TB":
      return f"{n:.1f} {unit}"
  raise AssertionError("not reached")


def _existing(path: pathlib.Path) -> pathlib.Path:
  """`path` or its nearest ancestor that exists."""
  path = pathlib.Path(path).absolute()
  while not path.exists() and path != path.parent:
    path = path.parent
  return path


def free_bytes(path: pathlib.Path | str) -> int:
  """Bytes an unprivileged process can still write on the filesystem that holds `path`."""
  stats = os.statvfs(_existing(pathlib.Path(path)))
  return stats.f_bavail * stats.f_frsize


def mount(path: pathlib.Path | str) -> tuple[str, str, str] | None:
  """(device, mount point, filesystem type) of the mount holding `path`, from /proc/self/mounts
  (Linux); None where that cannot be read."""
  try:
    mounts = pathlib.Path("/proc/self/mounts").read_text().splitlines()
  except OSError:
    return None
  resolved, best = str(_existing(pathlib.Path(path)).resolve()), None
  for line in mounts:
    fields = line.split()
    if len(fields) < 3:
      continue
    point = fields[1].replace("\\040", " ")
    inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
    if inside and (best is None or len(point) >= len(best[1])):
      best = (fields[0].replace("\\040", " "), point, fields[2])
  return best


def not_a(path: pathlib.Path | str, want: str) -> str | None:
  """Why `path` is not the `want` ("file" or "directory") a flag or field names, in words (it
  does not exist, or it is the other kind), or None when it is one."""
  path = pathlib.Path(path)
  if (path.is_file() if want == "file" else path.is_dir()):
    return None
  if not path.exists():
    return "is a broken symbolic link" if path.is_symlink() else "does not exist"
  found = "directory" if path.is_dir() else "file" if path.is_file() else "special file"
  return f"is a {found}, not a {want}"


def device_text(path: pathlib.Path | str) -> str:
  """`tmpfs mounted on /scratch`: the device that holds `path`, as a user finds it in `df`."""
  found = mount(path)
  if found is None:
    return f"the filesystem of {_existing(pathlib.Path(path))}"
  return f"{found[0]} mounted on {found[1]}"


class NoSpace(Exception):
  """A write of `needed` bytes (None: unknown) to `path` (None: an error that names no file)
  that found no room on its device."""

  def __init__(self, path: pathlib.Path | str | None, *, needed: int | None,
               quota: bool = False):
    self.path = None if path is None else pathlib.Path(path).absolute()
    self.needed, self.quota = needed, quota
    # What is free after the failed write was taken back.
    self.free = None if path is None or quota else free_bytes(self.path)
    self.device = "its device" if path is None else device_text(self.path)
    super().__init__(self.path)

  def __str__(self) -> str:
    figures = ([f"{size_text(self.needed)} needed"] if self.needed is not None else []) + (
        ["over the disk quota"] if self.quota else
        [f"{size_text(self.free)} free"] if self.free is not None else [])
    where = f" writing {self.path}" if self.path is not None else ""
    return (f"no space left on {self.device}{where}"
            + (f" ({', '.join(figures)})" if figures else ""))


def _code(e: BaseException) -> int | None:
  """The OS error number of `e`: an OSError's, one TensorStore wrote into its message, or that
  of a full disk or quota whose text the message holds."""
  if isinstance(e, OSError) and e.errno is not None:
    return e.errno
  found = _TS_CODE.search(str(e))
  if found:
    return int(found.group(1))
  return next((code for text, code in _NO_ROOM_TEXT.items() if text in str(e)), None)


def _ts_file(e: BaseException) -> str | None:
  found = _TS_FILE.search(str(e))
  return found.group(1) if found else None


def _chain(e: BaseException | None):
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    yield e
    e = e.__cause__ or e.__context__


def no_room(e: BaseException) -> bool:
  """Whether `e` is (or was caused by) a write that found no room."""
  return any(isinstance(x, NoSpace) or _code(x) in NO_ROOM for x in _chain(e))


def as_no_space(e: BaseException, *, path: pathlib.Path | str | None = None,
                needed: int | None = None) -> NoSpace | None:
  """NoSpace for an error that is (or was caused by) a write finding no room, else None.
  `path` names the write where the error does not (or names a file inside it)."""
  for x in _chain(e):
    if isinstance(x, NoSpace):
      return x
    code = _code(x)
    if code in NO_ROOM:
      named = getattr(x, "filename", None) or _ts_file(x)
      return NoSpace(path or named, needed=needed, quota=code == errno.EDQUOT)
  return None


def check_room(path: pathlib.Path | str, needed: int) -> None:
  """NoSpace unless the filesystem holding `path` has `needed` bytes free for us."""
  if free_bytes(path) < needed:
    raise NoSpace(path, needed=needed)


def write_atomic(path: pathlib.Path | str, data: bytes | Sequence[memoryview | bytes]) -> None:
  """Replaces `path` with `data` (bytes, or buffers written one after another) through a
  temporary file beside it: a crash leaves the old file or the new one; a disk without room
  leaves the old one (and no temporary file) and raises NoSpace."""
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  chunks = [data] if isinstance(data, bytes) else [memoryview(c).cast("B") for c in data]
  try:
    with open(tmp, "wb") as f:
      for chunk in chunks:
        f.write(chunk)
  except OSError as e:
    tmp.unlink(missing_ok=True)
    full = as_no_space(e, path=path, needed=sum(len(c) for c in chunks))
    if full is None:
      raise
    raise full from None
  os.replace(tmp, path)


class AppendFile:
  """A file that grows by whole records (one `append` each, unbuffered). A record the disk has
  no room for is taken back (the file is cut to where it was) and NoSpace raised, so the file
  never ends in half a record."""

  def __init__(self, path: pathlib.Path | str):
    self.path = pathlib.Path(path)
    try:
      self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
      full = as_no_space(e, path=self.path, needed=0)
      if full is None:
        raise
      raise full from None

  def append(self, data: bytes) -> None:
    size = os.fstat(self._fd).st_size
    view = memoryview(data)
    try:
      while view:
        view = view[os.write(self._fd, view):]
    except OSError as e:
      os.ftruncate(self._fd, size)
      full = as_no_space(e, path=self.path, needed=len(data))
      if full is None:
        raise
      raise full from None

  def close(self) -> None:
    if self._fd >= 0:
      os.close(self._fd)
      self._fd = -1
