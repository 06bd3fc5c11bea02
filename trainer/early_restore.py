"""A resumed run's restore, read beside its compile.

A run that resumes compiles (or reads back from the compilation cache) its train and eval steps,
then restores its newest checkpoint, then steps. The two do not depend on each other, and a state
in host memory (trainer.state_memory=host) is slow to restore: llm_1b on one TPU v5e chip spent
65 s tracing and reading its programs back and then 42.9 s restoring its 14.8 GB state, one
after the other (benchmarks/whole_run.py, 2026-12-07). `EarlyRestore.start` reads the checkpoint
that the loop will restore first (the newest committed step, or checkpoint.restore_step) in a
thread while the launcher compiles; the loop `take`s it instead of reading it again.

It is only a read (trainer/checkpoint.py:read_step: no CheckpointManager, which cleans its
directory; nothing on disk changes). The loop uses it only if the checkpoint it reads first is
still that one, with no stray entry to set aside first. Anything else (a read that fails, a
damaged newest step, a stray) is the loop's own restore as before, with its warnings and
fallbacks; the early read is dropped before that restore starts. Where it runs:

- one process (a multi-process run's reads meet in barriers that a thread would reorder);
- a state in host memory (a state in device memory restores in seconds, and the GPU compiler
  runs its autotuning in device memory that a restore beside it would take);
- a host whose available RAM is at least `RAM_FACTOR` times the state: the compile's heap and
  the restore are held at once (llm_1b's uncached compile peaked at 11.5 GB in use).

While the read runs, the interpreter hands its lock between threads every SWITCH_INTERVAL_S
seconds instead of Python's 5 ms: the read's threads take the lock briefly and often (Orbax's
event loop, each block's copy), and with the trace beside them holding it, each of those waited
up to 5 ms. On this repo's CPU machine a 125m host-memory restore beside llm_1b's trace took
5.4-5.8 s at 5 ms and 4.0-4.5 s at 0.5 ms (2.9-3.7 s alone), the three traces 10.4-11.4 s and
10.1-10.2 s (2026-12-07).

run.json's `startup` says when a read that the loop took started and how long it took
(`restore_started_s`, `restore_read_s`); `state_s` is then what the loop waited for it. A
resume whose restore ran after the compile says why (`restore_after_compile`).
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import sys
import time

import flax.linen as nn
import jax

from trainer import checkpoint_bounded, host_memory, metrics as metrics_lib
from trainer.checkpoint import Restored, read_step
from trainer.checkpoint_files import committed_steps, strays
from trainer.startup import Startup

# The host's available RAM, as a multiple of the state's bytes, that an early read needs: the
# state, a batch read, and the compiler's heap beside them.
RAM_FACTOR = 2.0
NOTHING_TO_RESTORE = "no committed checkpoint"  # (the run initialises: nothing to say)
SWITCH_INTERVAL_S = 0.0005  # sys.setswitchinterval while the read runs (Python's default: 0.005)


def first_step(directory: pathlib.Path, at_most: int | None) -> int | None:
  """The committed step the loop's restore tries first (Checkpointer.restore_newest)."""
  steps = [s for s in committed_steps(directory) if at_most is None or s <= at_most]
  return steps[-1] if steps else None


def why_not(exp, directory: pathlib.Path) -> str | None:
  """Why a resumed run of `exp` from `directory` restores after its compile, not beside it;
  None where it can read beside it."""
  if jax.process_count() != 1:
    return "more than one process"
  if exp.run.trainer.state_memory != "host":
    return "the state is in device memory"
  if first_step(directory, exp.run.checkpoint.restore_step or None) is None:
    return NOTHING_TO_RESTORE
  state = metrics_lib.state_bytes_per_device(exp.abstract_state, exp.state_shardings)
  state *= len(exp.mesh.local_devices)
  free = host_memory.available()
  if free is None or free < RAM_FACTOR * state:
    return "the host's available RAM is under twice the state"
  return None


class EarlyRestore:
  """The read of one checkpoint, in a thread started by `start`."""

  def __init__(self, exp, directory: pathlib.Path, *, startup: Startup | None = None):
    self._exp, self.directory, self._startup = exp, pathlib.Path(directory), startup
    self.step = first_step(self.directory, exp.run.checkpoint.restore_step or None)
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="axtrain-restore")
    self._future: concurrent.futures.Future | None = None
    self._started_at = 0.0  # time.time() when the read started
    self._read_s = 0.0  # the read's seconds, once done
    self._placing_s = 0.0  # of those, waiting for copies into host memory once all read

  @classmethod
  def start(cls, exp, directory: pathlib.Path, *,
            startup: Startup | None = None) -> "EarlyRestore | None":
    """Starts reading the checkpoint a resumed run restores first; None where it cannot
    (`why_not`). A read the loop takes is recorded in `startup` (the run's)."""
    reason = why_not(exp, pathlib.Path(directory))
    if reason is not None:
      if startup is not None and reason != NOTHING_TO_RESTORE:
        startup.add("restore_after_compile", reason)
      return None
    early = cls(exp, directory, startup=startup)
    early._future = early._pool.submit(early._read)
    return early

  def _read(self) -> Restored | None:
    self._started_at, started = time.time(), time.perf_counter()
    placing = checkpoint_bounded.placing_seconds()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    try:
      abstract = nn.meta.unbox(self._exp.abstract_state)  # outside the mesh (as the loop does)
      with self._exp.context():
        restored = read_step(self.directory, self.step, abstract, self._exp.state_shardings)
      jax.block_until_ready(restored.state)
    except Exception:  # pylint: disable=broad-except  (the loop's own restore reports it)
      return None
    finally:
      sys.setswitchinterval(interval)
    self._read_s = time.perf_counter() - started
    self._placing_s = checkpoint_bounded.placing_seconds() - placing
    return restored

  def take(self, at_most: int | None) -> Restored | None:
    """The early read, once done, if the loop's restore would read that checkpoint first
    (still its newest committed step at or before `at_most`, no stray to set aside); else
    None, the read dropped."""
    if self._future is None:
      return None
    restored, self._future = self._future.result(), None
    self.close()
    reason = ("the early read failed" if restored is None else
              "a stray entry to set aside first" if strays(self.directory) else
              "the early read was not the step restored"
              if first_step(self.directory, at_most) != restored.step else None)
    if reason is not None:
      if self._startup is not None:
        self._startup.add("restore_after_compile", reason)
      return None
    if self._startup is not None:
      self._startup.note("restore_started_s", at=self._started_at)
      self._startup.add("restore_read_s", self._read_s)
      self._startup.add("restore_placing_s", self._placing_s)
    return restored

  def close(self) -> None:
    """Waits for the read (a compile refused while it runs) and drops it."""
    if self._future is not None:
      self._future.result()
      self._future = None
    self._pool.shutdown(wait=True)
