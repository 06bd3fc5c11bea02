"""What XLA says while it compiles, in words: its C++ log lines captured for one compile and
turned into notes (planner/plan.py's report, a run's compiler.log), and the figures of the TPU
compiler's refusal of a program that does not fit (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings

# What XLA logs while it compiles, in its own words ("[SPMD] Involuntary full rematerialization
# ... Contact Shardy or XLA team"; XLA:GPU's "Can't reduce memory use below 56.71GiB (...) by
# rematerialization; only reduced to 303.54GiB"), said as a plan note: the finding, what it
# costs, what to do.
_SPMD_REMAT = re.compile(r"Involuntary full rematerialization")
_REMAT_LIMIT = re.compile(r"Can't reduce memory use below ([\d.]+\w+) .*only reduced to "
                          r"([\d.]+\w+)")


@contextlib.contextmanager
def compiler_log(notes: list[str], rest: list[str] | None = None):
  """Captures file descriptor 2 (where XLA's C++ logging goes) for one compile: lines it
  recognises become `notes`; the others are written back to stderr unchanged, or, with `rest`,
  every line is kept there instead (a run writes them to its compiler.log). Python's warnings
  of the same time (numpy's, while the step is traced) are not XLA's: they are shown on stderr
  as ever, after the capture."""
  said: list = []
  try:
    with warnings.catch_warnings(record=True) as said, _fd2_lines(notes, rest):
      yield
  finally:
    for w in said:
      warnings.showwarning(w.message, w.category, w.filename, w.lineno)


@contextlib.contextmanager
def _fd2_lines(notes: list[str], rest: list[str] | None):
  """compiler_log's capture of file descriptor 2."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as log:
    os.dup2(log.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      log.seek(0)
      other = []
      remats = 0
      for line in log.read().decode(errors="replace").splitlines():
        if rest is not None and line.strip():
          rest.append(line)
        if _SPMD_REMAT.search(line):
          remats += 1
        elif m := _REMAT_LIMIT.search(line):
          notes.append(f"the compiler could not rematerialise the step within its memory limit "
                       f"({m[1]}): it got it down to {m[2]}")
        elif line.strip():
          other.append(line)
      if remats:
        notes.append(f"the SPMD partitioner resharded {remats} value(s) by gathering them whole "
                     f"(XLA's 'involuntary full rematerialization'): a layout the shardings do "
                     f"not keep; `axtrain plan --ops` shows the collectives it adds")
      if other and rest is None:
        sys.stderr.write("\n".join(other) + "\n")


# The TPU compiler's words when it refuses a program: its temporaries and the HBM it had.
_UNITS = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, "P": 1024 ** 5}
_TEMPORARIES = re.compile(r"HLO temporaries \(([\d.]+)([KMGTP])\)")
_AVAILABLE = re.compile(r"available HBM \(([\d.]+)([KMGTP])\)")


def refused_bytes(message: str) -> tuple[int | None, int | None]:
  """(temporaries, available HBM) in bytes, from the TPU compiler's RESOURCE_EXHAUSTED
  message ("... HLO temporaries (1.23T) exceeds available HBM (15.75G)"); None where absent."""
  def find(pattern):
    m = pattern.search(message)
    return int(float(m[1]) * _UNITS[m[2]]) if m else None
  return find(_TEMPORARIES), find(_AVAILABLE)
