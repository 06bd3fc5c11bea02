"""One live process per run directory: `<run_dir>/.lock` holds its pid under an fcntl lock.

The kernel drops the lock when the process dies however it dies, so a lock file
left by a killed run is stale and simply taken over. A command refused while it holds the
lock (a ConfigError) puts back what it found: the file's bytes and times, or no file.
"""

from __future__ import annotations

import fcntl
import os
import pathlib

from launcher.errors import ConfigError, UserError
from trainer import disk

LOCK_NAME = ".lock"


class RunLock:
  def __init__(self, run_dir: pathlib.Path):
    self.path = pathlib.Path(run_dir) / LOCK_NAME
    self._fd: int | None = None
    self._created: list[pathlib.Path] = []  # what acquire() made, newest last
    self._found: tuple[bytes, os.stat_result] | None = None  # the lock file as acquire() found it

  def acquire(self) -> "RunLock":
    """Takes the lock or raises UserError naming the live process that holds it."""
    missing = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
    existed = self.path.exists()
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      self._created = list(reversed(missing)) + ([] if existed else [self.path])
    except OSError as e:  # launcher.run_dir.check_writable ran first; this is a race or a quota
      raise UserError(f"--output_dir {self.path.parent}: {e.strerror or e}") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      raise UserError(f"{self.path.parent} is in use by another axtrain (pid {holder}); wait for "
                      f"it to finish or stop it, or choose another --output_dir") from None
    if existed:
      self._found = (os.pread(fd, 1 << 16, 0), os.fstat(fd))
    self._fd = fd
    pid = f"{os.getpid()}\n".encode()
    try:
      os.ftruncate(fd, 0)
      os.write(fd, pid)
    except OSError as e:
      full = disk.as_no_space(e, path=self.path, needed=len(pid))
      self.__exit__(ConfigError, None, None)  # as found, unlocked
      if full is None:
        raise
      raise full from None
    return self

  def _put_back(self) -> None:
    """The lock file's bytes and times as acquire() found them (the lock still held)."""
    if self._fd is not None and self._found is not None:
      content, stat = self._found
      os.ftruncate(self._fd, 0)
      os.pwrite(self._fd, content, 0)
      os.utime(self.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

  def release(self) -> None:
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self):
    return self.acquire()

  def undo(self) -> None:
    """Removes the lock file and directories that acquire() created (a refused run writes nothing)."""
    for path in reversed(self._created):
      try:
        path.unlink() if path == self.path else path.rmdir()
      except OSError:
        break  # something else was written there meanwhile: leave it
    self._created = []

  def forget(self) -> None:
    """What a refused command leaves, for a process about to end without unwinding (a signal
    before training, launcher/preemption.py): the lock file as found, or none; the kernel
    drops the lock itself."""
    self._put_back()
    self.undo()

  def __exit__(self, exc_type, *exc):
    refused = exc_type is not None and issubclass(exc_type, ConfigError)
    if refused:
      self._put_back()
    self.release()
    if refused:
      self.undo()  # a ConfigError: the run was refused before it wrote anything
