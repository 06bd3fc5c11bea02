"""SIGTERM / SIGINT: finish the step in flight, checkpoint, exit EXIT_PREEMPTED.

The first signal only sets a flag that the training loop polls after each
step. A second signal exits at once (still EXIT_PREEMPTED): a save in flight
is abandoned in its temporary directory, so the last committed checkpoint is
untouched and the run resumes from it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Callable

# EX_TEMPFAIL from sysexits.h: "temporary failure, the user is invited to retry".
# A scheduler should re-queue the same command, which resumes from the checkpoint.
EXIT_PREEMPTED = 75

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
  def __init__(self, *, on_second: Callable[[], None] = lambda: None):
    self.signum: int | None = None
    self._on_second = on_second

  def requested(self) -> bool:
    return self.signum is not None

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    name = signal.Signals(signum).name
    if self.signum is None:
      self.signum = signum
      print(f"axtrain: {name}: finishing the current step and saving a checkpoint "
            f"(send it again to exit at once)", file=sys.stderr, flush=True)
      return
    print(f"axtrain: second {name}: exiting now; the last committed checkpoint is kept",
          file=sys.stderr, flush=True)
    try:
      self._on_second()
    finally:
      os._exit(EXIT_PREEMPTED)  # pylint: disable=protected-access

  @contextlib.contextmanager
  def installed(self):
    previous = {s: signal.signal(s, self._handle) for s in _SIGNALS}
    try:
      yield self
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
