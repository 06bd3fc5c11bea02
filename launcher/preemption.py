"""SIGTERM / SIGINT: finish the step in flight, checkpoint, exit EXIT_PREEMPTED.

The first signal only sets a flag that the training loop polls after each
step. A second signal exits at once (still EXIT_PREEMPTED): a save in flight
is abandoned in its temporary directory, so the last committed checkpoint is
untouched and the run resumes from it.

Signals are counted by a thread that reads Python's signal wakeup fd, one byte
per delivery. Python runs its own handlers only when the main thread returns
to the interpreter, and two signals that arrive while it waits in a device
computation or a checkpoint write run the handler once; the wakeup fd sees both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable

# EX_TEMPFAIL from sysexits.h: "temporary failure, the user is invited to retry".
# A scheduler should re-queue the same command, which resumes from the checkpoint.
EXIT_PREEMPTED = 75

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STOP = 0  # written by installed() on exit to end the reader thread; no signal has number 0


class Preemption:
  """`signals`: the signals this handles (a multi-process run leaves SIGTERM to JAX's preemption
  service, launcher/distributed.py); `on_first(signum)` runs after the first one's message."""

  def __init__(self, *, on_second: Callable[[], None] = lambda: None,
               signals: tuple[int, ...] = _SIGNALS,
               on_first: Callable[[int], None] = lambda signum: None):
    self.signum: int | None = None
    self._on_second = on_second
    self._signals = tuple(signals)
    self._on_first = on_first

  def requested(self) -> bool:
    return self.signum is not None

  def received(self, signum: int) -> None:
    """One delivery of `signum`: the first requests a stop, the second exits the process."""
    name = signal.Signals(signum).name
    if self.signum is None:
      self.signum = signum
      print(f"axtrain: {name}: finishing the current step and saving a checkpoint "
            f"(send it again to exit at once)", file=sys.stderr, flush=True)
      self._on_first(signum)
      return
    print(f"axtrain: second {name}: exiting now; the last committed checkpoint is kept",
          file=sys.stderr, flush=True)
    try:
      self._on_second()
    finally:
      os._exit(EXIT_PREEMPTED)  # pylint: disable=protected-access

  def _read(self, fd: int) -> None:
    while True:
      try:
        data = os.read(fd, 64)
      except InterruptedError:
        continue
      for signum in data:
        if signum == _STOP:
          return
        if signum in self._signals:
          self.received(signum)

  @contextlib.contextmanager
  def installed(self):
    """Counts SIGTERM/SIGINT while the block runs (main thread only); restores everything after."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    # The Python-level handler only keeps the default action (KeyboardInterrupt, exit) away.
    previous = {s: signal.signal(s, lambda *_: None) for s in self._signals}
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    reader = threading.Thread(target=self._read, args=(read_fd,), name="axtrain-signals",
                              daemon=True)
    reader.start()
    try:
      yield self
    finally:
      signal.set_wakeup_fd(previous_fd)
      for s, handler in previous.items():
        signal.signal(s, handler)
      os.write(write_fd, bytes([_STOP]))
      reader.join()
      os.close(read_fd)
      os.close(write_fd)
