"""Hooks of the training loop: the one way writers, the profiler and tests see a run.

The loop (trainer/loop.py) calls every callback, in list order, at these points:

    on_train_start(loop)             after the initial state is restored or initialised
    on_batch(step, batch) -> batch   the host batch of `step`, before it is dispatched
    on_record(record)                a metrics record (a logged step, or an evaluation)
    on_step_end(step, loop)          after step `step` is dispatched, logged, saved
    on_train_end(loop)               once, when the loop returns or raises

`loop` is the loop's `LoopState` (read it, do not change it). Metrics reach the
host one step late, so `on_step_end(s)` comes before the record of step s.
"""

from __future__ import annotations

import pathlib
from typing import Any

from trainer.run_files import NewFiles, Record, no_record


class Callback:
  """Does nothing: subclasses override the hooks they need."""

  def on_train_start(self, loop) -> None:
    pass

  def on_batch(self, step: int, batch: dict) -> dict:
    return batch

  def on_record(self, record: dict) -> None:
    pass

  def on_step_end(self, step: int, loop) -> None:
    pass

  def on_train_end(self, loop) -> None:
    pass


class Profile(Callback):
  """A jax.profiler trace of steps first..last (inclusive) into `directory`; `record` receives
  the files of each capture (the run's manifest, trainer/run_files.py)."""

  def __init__(self, directory: pathlib.Path, first: int, last: int, *,
               record: Record = no_record):
    self.directory, self.first, self.last = pathlib.Path(directory), first, last
    self.captures: list[dict] = []  # {"steps": [first, last], "dir": ...} per finished capture
    self._active = False
    self._new = NewFiles(self.directory, record)

  def on_train_start(self, loop) -> None:
    if loop.start + 1 == self.first:
      self._begin()

  def on_step_end(self, step: int, loop) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    if self._active and step >= self.last:
      jax.block_until_ready(loop.state)  # the trace holds the device work of its steps
      self._stop()
      self.captures.append({"steps": [self.first, self.last], "dir": str(self.directory)})
    elif step + 1 == self.first:
      jax.block_until_ready(loop.state)
      self._begin()

  def on_train_end(self, loop) -> None:
    if self._active:  # stopped inside the range (preemption, error): keep what was captured
      self._stop()
      self.captures.append({"steps": [self.first, loop.step], "dir": str(self.directory)})

  def _begin(self) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    self.directory.mkdir(parents=True, exist_ok=True)
    self._new.start()
    jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)  # + Perfetto's file
    self._active = True

  def _stop(self) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    jax.profiler.stop_trace()
    self._active = False
    self._new.done()  # the capture's files


def call_all(callbacks: list[Callback], hook: str, *args: Any) -> None:
  for cb in callbacks:
    getattr(cb, hook)(*args)
