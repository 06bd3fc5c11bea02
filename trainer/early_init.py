"""A second run's initialisation, run while its steps' programs are traced and loaded.

A fresh run traces its steps, compiles them (or reads them back from the compilation cache), and
then initialises its state: for a state in host memory a slow program (llm_1b on one TPU v5e
wrote its 14.8 GB state into host memory in 13.5-16 s, after its steps' executables had loaded,
2026-12-07). The initialisation does not depend on the steps. Where its program is one that
trainer/compile_prefetch.py is loading ahead (the setting ran before, in this cache folder: a
second run), `EarlyInit.start` lowers and compiles it at once in a thread (the compile is handed
that executable) and runs it there while the steps' programs are traced and loaded; the loop
`take`s the state instead of initialising. On the chip, llm_1b's second run (6045da3, probed)
initialised at 24.9-38 s, beside its train step's trace and load, and began its first step at
about 52 s instead of 69.5 s.

Where the compile was a compile after all (the code changed since the index was written), the
thread only compiles, as the launcher would have, and the loop initialises after the steps'
compile and memory check (planner/step_memory.py) as before: a first run's compiles, and the
host memory they take, keep their order. (Where it runs early, the steps were compiled and
checked for this setting before.) Where it runs, as trainer/early_restore.py's read: one
process, a state in host memory. run.json's `startup` says when it started and how long it ran
(`init_started_s`, `init_run_s`).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import jax

from trainer import compile_prefetch
from trainer.experiment import INIT_PROGRAM
from trainer.startup import Startup


def runs_beside(exp) -> bool:
  """Whether `exp`'s initialisation can run beside its steps' compile: one process, a state in
  host memory (a state in device memory initialises in moments), its program being loaded
  ahead."""
  return (jax.process_count() == 1 and exp.run.trainer.state_memory == "host"
          and compile_prefetch.loading(INIT_PROGRAM))


class EarlyInit:
  """The initialisation's compile, and its run where the compile was a read, in a thread."""

  def __init__(self, exp, startup: Startup | None):
    self._exp, self._startup = exp, startup
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="axtrain-init")
    self._compiled = threading.Event()
    self._future: concurrent.futures.Future | None = None
    self._started_at = 0.0  # time.time() when the run started
    self._run_s = 0.0

  @classmethod
  def start(cls, exp, *, startup: Startup | None = None) -> "EarlyInit | None":
    """Starts the initialisation's compile (and run) in a thread; None where it cannot
    (`runs_beside`: the launcher compiles it beside the steps as before)."""
    if not runs_beside(exp):
      return None
    early = cls(exp, startup)
    early._future = early._pool.submit(early._init)
    return early

  def _init(self):
    try:
      key = jax.random.key(self._exp.run.trainer.seed)
      compiled = self._exp.init_fn.lower(key).compile()
    finally:
      self._compiled.set()
    if not compile_prefetch.taken(INIT_PROGRAM):
      return None  # compiled here, not read: the loop initialises after the steps' compile
    self._started_at, started = time.time(), time.perf_counter()
    state = compiled(key)
    jax.block_until_ready(state)
    self._run_s = time.perf_counter() - started
    return state

  def wait_compiled(self) -> None:
    """Returns once the initialisation's program is compiled (or its compile failed)."""
    self._compiled.wait()

  def take(self):
    """The initialised state, once ready; None where the thread only compiled or failed (the
    loop initialises itself, and says so where it fails too)."""
    if self._future is None:
      return None
    try:
      state = self._future.result()
    except Exception:  # pylint: disable=broad-except  (the loop's own initialisation reports it)
      state = None
    self._future = None
    self.close()
    if state is not None and self._startup is not None:
      self._startup.note("init_started_s", at=self._started_at)
      self._startup.add("init_run_s", self._run_s)
    return state

  def close(self) -> None:
    """Waits for the thread (a compile refused while it runs) and drops what it made."""
    if self._future is not None:
      self._future.exception()
      self._future = None
    self._pool.shutdown(wait=True)
