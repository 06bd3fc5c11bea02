"""Host RAM: the process's resident set, and the machine's RAM in use, now and at their peak.

The training loop records the process's resident bytes in each step record
(`host_memory_bytes`) and the peak during each checkpoint save (`host_memory_peak_bytes`), so a
run shows the host RAM it needs (a state in host memory, trainer.state_memory=host, lives
there). Linux only (/proc); elsewhere the figures are absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
import time


def _proc_kb(path: str, field: str) -> int | None:
  try:
    with open(path, encoding="ascii") as f:
      for line in f:
        if line.startswith(field):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def rss() -> int | None:
  """Resident bytes of this process (VmRSS), None where /proc is missing."""
  return _proc_kb("/proc/self/status", "VmRSS:")


def system_used() -> int | None:
  """The machine's RAM in use (MemTotal - MemAvailable): also memory that a runtime pins
  outside the process's resident pages; None where /proc is missing."""
  total, available = _proc_kb("/proc/meminfo", "MemTotal:"), _proc_kb("/proc/meminfo",
                                                                      "MemAvailable:")
  return None if total is None or available is None else total - available


def available() -> int | None:
  """The machine's RAM that new allocations can take without swapping (MemAvailable; where
  /proc is missing, the free pages), None where neither is known."""
  found = _proc_kb("/proc/meminfo", "MemAvailable:")
  if found is not None:
    return found
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, AttributeError):
    return None


@functools.cache
def _malloc_trim():
  name = ctypes.util.find_library("c")
  try:
    return ctypes.CDLL(name).malloc_trim if name else None
  except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
    return None


def release() -> None:
  """Gives the heap's free memory back to the system (glibc's malloc_trim). NumPy buffers of a
  few MB come from malloc's arenas, which keep freed memory for reuse: after a checkpoint's
  copies or reads are freed, about 1-2 GB stayed resident on a TPU host (4.4 GB state)."""
  trim = _malloc_trim()
  if trim is not None:
    trim(0)


def record() -> dict:
  """A step record's host RAM fields (those known here): this process's resident bytes
  (`host_memory_bytes`) and the machine's RAM in use (`host_ram_in_use_bytes`), the figure
  that `axtrain plan`'s host verdict is calibrated against (planner/calibration.py:HostRam)."""
  fields = {"host_memory_bytes": rss(), "host_ram_in_use_bytes": system_used()}
  return {k: v for k, v in fields.items() if v}


class Peak:
  """The peaks of `rss()` and `system_used()` while the block runs (polled every `every_s`);
  `before`, `peak` and `after` are (rss, system_used) pairs."""

  def __init__(self, every_s: float = 0.005):
    self.every_s = every_s

  def __enter__(self):
    self.before = (rss(), system_used())
    self.peak, self._done = list(self.before), threading.Event()
    self._poller = threading.Thread(target=self._poll, name="axtrain-host-memory", daemon=True)
    self._poller.start()
    return self

  def _poll(self):
    while not self._done.is_set():
      now = (rss(), system_used())
      self.peak = [None if p is None else max(p, n) for p, n in zip(self.peak, now)]
      time.sleep(self.every_s)

  def __exit__(self, *_):
    self._done.set()
    self._poller.join()
    self.after = (rss(), system_used())

  def record(self) -> dict:
    """A save record's host RAM fields (those known here): this process's resident bytes at
    their peak (`host_memory_peak_bytes`), and the machine's RAM in use before the block and at
    its peak (`host_ram_in_use_before_bytes`, `host_ram_in_use_peak_bytes`): the save's own
    RAM is their difference."""
    fields = {"host_memory_peak_bytes": self.peak[0], "host_ram_in_use_before_bytes":
              self.before[1], "host_ram_in_use_peak_bytes": self.peak[1]}
    return {k: v for k, v in fields.items() if v}
