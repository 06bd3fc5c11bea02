"""Wall time of the training steps, each step's own, with saves and evaluations kept apart.

The loop dispatches steps without waiting for them (trainer/loop.py) and hands each step's
non-finite flag, a scalar the step computes, to `StepClock.dispatched`. A watcher thread waits
on the flags in order (nothing is copied; waiting releases the interpreter) and notes when each
step finished, whatever the loop is doing meanwhile. A step's time runs from the end of the
step before it, or of the pause (save, evaluation) since, to its own end, so the host's work
for a step (its batch) is that step's, and a step dispatched late because the host was busy
is charged for the wait. A save or an evaluation runs inside `StepClock.paused`, which first
waits for every dispatched step: its time is measured on its own and never falls into a step's
figure. The first step (which includes compilation) is timed by the loop; steps after it are
timed from its end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time


@dataclasses.dataclass
class Pause:
  seconds: float = 0.0


class StepClock:

  def __init__(self, *, now=time.perf_counter):
    self._now = now
    self._flags: queue.SimpleQueue = queue.SimpleQueue()  # (step, flag); None stops the watcher
    self._seen = threading.Condition()
    self._end: dict[int, float] = {}  # step -> when it finished
    self._from: dict[int, float] = {}  # step -> end of a pause between it and the step before
    self._last_dispatched: int | None = None
    self._finished = -1  # the last step the watcher saw finish
    self._pause_end: float | None = None
    self._watcher: threading.Thread | None = None

  def dispatched(self, step: int, flag) -> None:
    """`flag`: an array the step computes (ready when the step finished)."""
    if self._pause_end is not None:
      self._from[step], self._pause_end = self._pause_end, None
    self._last_dispatched = step
    if self._watcher is None:
      self._watcher = threading.Thread(target=self._watch, name="axtrain-step-clock",
                                       daemon=True)
      self._watcher.start()
    self._flags.put((step, flag))

  def _watch(self) -> None:
    while (item := self._flags.get()) is not None:
      step, flag = item
      try:
        flag.block_until_ready()
      except Exception:  # pylint: disable=broad-except  (the loop meets the error itself)
        pass
      with self._seen:
        self._end[step], self._finished = self._now(), step
        self._seen.notify_all()

  def wait(self, upto: int | None = None) -> None:
    """Returns once the dispatched steps up to `upto` (all when None) have finished."""
    if self._last_dispatched is None:
      return
    last = self._last_dispatched if upto is None else min(upto, self._last_dispatched)
    with self._seen:
      self._seen.wait_for(lambda: self._finished >= last)

  def seconds(self, after: int, upto: int) -> float:
    """Wall time of steps after+1..upto (all finished, `after` too); forgets the steps before
    `upto`."""
    with self._seen:
      total = sum(self._end[s] - max(self._end[s - 1], self._from.get(s, self._end[s - 1]))
                  for s in range(after + 1, upto + 1))
      for table in (self._end, self._from):
        for step in [s for s in table if s < upto]:
          del table[step]
    return total

  @contextlib.contextmanager
  def paused(self):
    """Times a save or an evaluation on its own: waits for every dispatched step first, and the
    next step's time starts when the pause ends. Yields a Pause whose `seconds` is set on exit."""
    self.wait()
    pause = Pause()
    start = self._now()
    try:
      yield pause
    finally:
      self._pause_end = self._now()
      pause.seconds = self._pause_end - start

  def close(self, *, wait: bool = True) -> None:
    """Stops the watcher, once it has seen every dispatched step if `wait`."""
    if self._watcher is not None:
      self._flags.put(None)
      if wait:
        self._watcher.join()
      self._watcher = None
