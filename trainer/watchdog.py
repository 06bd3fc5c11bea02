"""Hang watchdog: dumps every thread's Python stack when no step finishes in time.

A hung collective or a stuck input pipeline shows up as a training loop that
stops making progress without an error; the stacks say where each thread waits.
faulthandler does the dump from its own C thread, so it works while the main
thread is blocked inside XLA.
"""

from __future__ import annotations

import faulthandler
import sys


class Watchdog:
  def __init__(self, timeout_s: float, *, file=None):
    self.timeout_s = timeout_s
    self.file = file or sys.stderr

  def pet(self) -> None:
    """A step finished: restart the countdown (repeats every timeout_s while stuck)."""
    if self.timeout_s > 0:
      faulthandler.dump_traceback_later(self.timeout_s, repeat=True, file=self.file)

  def stop(self) -> None:
    if self.timeout_s > 0:
      faulthandler.cancel_dump_traceback_later()

  def __enter__(self):  # the countdown starts at the first pet()
    return self

  def __exit__(self, *exc):
    self.stop()
