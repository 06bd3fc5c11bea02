"""An output folder written beside its place and renamed onto it when complete (`axtrain convert`,
`axtrain tokenize`), so that nothing half-written is ever left where the output goes:

    <parent>/.<name>.XXXXXXXX.tmp   convert's (hidden, one per process)
    <parent>/<name>.partial         tokenize's

Its writer holds an flock on the folder while it writes, which the kernel drops however the
process ends. A failure removes the folder (a full disk: disk.NoSpace naming the target), and
so does a stop (Ctrl-C, SIGTERM), from launcher/preemption.py's signal thread just before the
process ends, whose stop line then names it. One left by a writer that could not clean up
(SIGKILL, a lost machine) holds no lock: the next command writing the same target removes it,
with a note.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import re
import shutil
import sys
import tempfile

from launcher import preemption
from launcher.errors import UserError
from trainer import disk


def _held_elsewhere(folder: pathlib.Path) -> bool:
  """Whether a live process holds the flock of `folder` (its writer)."""
  try:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return False
  except BlockingIOError:
    return True
  finally:
    os.close(fd)


def _apply_umask(root: pathlib.Path) -> None:
  """The user's umask on every file and folder under `root` (mkdtemp makes 0700, safetensors
  0600)."""
  umask = os.umask(0)
  os.umask(umask)
  for path in [root, *root.rglob("*")]:
    if not path.is_symlink():
      path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


class Staging:
  """The folder that becomes `target` (module doc). `command` names the writer in messages;
  `partial` chooses `<name>.partial` (else a hidden temporary folder); a disk with less room
  than `needed` bytes (what the output takes, about) is refused before anything is written."""

  def __init__(self, target: pathlib.Path, *, command: str, partial: bool = False,
               needed: int | None = None):
    self.target, self.command, self.partial, self.needed = target, command, partial, needed
    self.tmp: pathlib.Path | None = None
    self._fd = -1
    self._stack = contextlib.ExitStack()

  def leftovers(self) -> list[pathlib.Path]:
    """Folders of this target's earlier writers still beside it, live or not."""
    name = self.target.name
    pattern = re.compile(rf"^{re.escape(name)}\.partial$" if self.partial else
                         rf"^\.{re.escape(name)}\.[a-z0-9_]{{8}}\.tmp$")
    parent = self.target.parent
    return sorted(p for p in (parent.iterdir() if parent.is_dir() else ())
                  if pattern.match(p.name) and p.is_dir() and not p.is_symlink())

  def _clean_leftovers(self) -> None:
    for folder in self.leftovers():
      if _held_elsewhere(folder):
        if self.partial:  # one name per target: this command cannot write it too
          raise UserError(f"{self.command}: {folder} is being written by another axtrain "
                          f"{self.command} to {self.target}; wait for it to finish, or choose "
                          f"another --output_dir")
        continue  # another live writer's own
      shutil.rmtree(folder, ignore_errors=True)
      print(f"axtrain: note: {self.command}: removed {folder}, the partial output of an earlier "
            f"{self.command} to {self.target} that was stopped before it could clean up",
            file=sys.stderr)

  def _remove(self) -> None:
    """Removes the folder (a second pass: what the writing thread added meanwhile)."""
    if self.tmp is not None:
      for _ in range(2):
        shutil.rmtree(self.tmp, ignore_errors=True)

  def __enter__(self) -> pathlib.Path:
    self._clean_leftovers()
    if self.needed is not None:
      disk.check_room(self.target, self.needed)
    parent = self.target.parent
    parent.mkdir(parents=True, exist_ok=True)
    with preemption.held():  # a signal meanwhile takes effect once the folder can be removed
      if self.partial:
        self.tmp = parent / f"{self.target.name}.partial"
        if self.tmp.exists() or self.tmp.is_symlink():  # no folder: not a writer's leftover
          raise UserError(f"{self.command}: {self.tmp} exists and is not a folder {self.command} "
                          f"writes; move it away, or choose another --output_dir")
        self.tmp.mkdir()
      else:
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", suffix=".tmp",
                                                 dir=parent))
      self._fd = os.open(self.tmp, os.O_RDONLY | os.O_DIRECTORY)
      fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      self._stack.enter_context(preemption.undone_on_stop(
          self._remove, f"; removed its partial output {self.tmp}"))
    return self.tmp

  def __exit__(self, exc_type, exc, _):
    try:
      if exc_type is None:
        with preemption.held():  # complete: a signal now takes effect once it is in place
          _apply_umask(self.tmp)
          if self.target.exists():
            self.target.rmdir()  # empty, checked before we started
          os.replace(self.tmp, self.target)
          self.tmp = None
          self._stack.close()
        return
      self._remove()
      full = disk.as_no_space(exc) if exc is not None else None
      if full is not None:  # what is free counts the removed folder as free again
        raise disk.NoSpace(self.target, needed=self.needed, quota=full.quota) from None
    finally:
      self._stack.close()
      os.close(self._fd)
