"""axtrain that signals itself as it starts writing a given file, for tests of what a stop leaves.

    python -m tests.signal_at_write SIGINT|SIGTERM NAME_SUFFIX -- convert --from_hf=... (axtrain's arguments)

The signal is sent when trainer/disk.py opens a file whose path ends with NAME_SUFFIX (a
shard's temporary file, convert's run.json), so it lands while the command's output is half
written; the writing thread then waits, as a slow disk would, while the process's own signal
handling (launcher/preemption.py, installed by launcher.main.run) ends it.
"""

from __future__ import annotations

import builtins
import os
import signal
import sys
import time

from launcher import main
from trainer import disk


def _signal_at(signum: int, suffix: str):
  def opened(path, *args, **kwargs):
    if str(path).endswith(suffix):
      os.kill(os.getpid(), signum)
      time.sleep(60)  # the signal thread ends the process meanwhile
    return builtins.open(path, *args, **kwargs)
  return opened


if __name__ == "__main__":
  name, suffix, separator, *args = sys.argv[1:]
  assert separator == "--", sys.argv
  disk.open = _signal_at(signal.Signals[name], suffix)
  main.run(["axtrain", *args])
