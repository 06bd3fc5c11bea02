"""Where a run's time to its first step goes (run.json's `startup`).

    to_experiment_s   process start -> the model, data and shardings built (imports, the
                      runtime's start, the config)
    to_steps_compiled_s  ... -> the train and eval steps compiled (or read from the
                      compilation cache), the memory check
    to_compiled_s     ... -> the initialisation compiled too (a run that initialises; it is
                      compiled beside the steps, so this waits only for what is left of it)
    state_s           the train state initialised, or restored from a checkpoint (its arrays
                      ready); for a resume whose checkpoint was read beside the compile
                      (trainer/early_restore.py), what the loop still waited for that read
    restore_started_s process start -> that read started (beside the compile)
    restore_read_s    that read's own seconds
    restore_placing_s of those, waiting for copies into host memory once all was read
    restore_after_compile  for a resume whose restore ran after the compile, why
    init_started_s    process start -> a second run's initialisation started, beside the
                      compile (trainer/early_init.py); state_s is then what the loop waited
    init_run_s        that initialisation's own seconds
    programs_loaded_ahead  programs that JAX took from trainer/compile_prefetch.py's loads
                      (read from the compilation cache while the steps were traced)
    loaded_ahead_wait_s  of JAX's cache reads, what it still waited for those loads
    loads_not_taken   programs loaded ahead that this run did not ask for (let go)
    first_step_s      the first step, dispatched and finished (its programs' last compile or
                      load included)
    first_compile_s   of first_step_s: the train step lowered and compiled again by the loop
                      (from JAX's caches: what remains of a compile that was already made)
    to_first_step_s   process start -> the first step finished
    compile           seconds JAX spent, summed over this process's programs (and threads)
                      until the first step finished: `trace_s` (Python to jaxpr), `lower_s`
                      (jaxpr to StableHLO), `compile_s` (XLA, or a read from the compilation
                      cache) and, of that, `cache_read_s`; a program read from the cache is
                      still traced and lowered (its key is the lowered program)
    compile_at        the same seconds as they stood at to_steps_compiled_s and
                      to_compiled_s: which phase spent them (all are counted from
                      to_experiment_s on)
    compile_by_program  the same by program (the process's, from its start: those that took
                      at least 0.5 s), but for the cache reads, which JAX does not name

Seconds since the process started come from Linux's /proc (None elsewhere).
"""

from __future__ import annotations

import os
import threading
import time

from jax import monitoring

# JAX's duration events (jax/_src/dispatch.py, compiler.py) -> the `compile` field's names
_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
           "/jax/core/compile/backend_compile_duration": "compile_s",
           "/jax/compilation_cache/cache_retrieval_time_sec": "cache_read_s"}
_spent = dict.fromkeys(_EVENTS.values(), 0.0)  # this process's, so far
_by_program: dict[str, dict[str, float]] = {}  # the same by JAX's function or module name
_lock = threading.Lock()  # programs compile in threads too (launcher/starting.py, early_init.py)


def _add(event: str, seconds: float, fun_name: str | None = None, **_) -> None:
  if event in _EVENTS:
    with _lock:
      _spent[_EVENTS[event]] += seconds
      if fun_name is not None:
        mine = _by_program.setdefault(fun_name, dict.fromkeys(_EVENTS.values(), 0.0))
        mine[_EVENTS[event]] += seconds


def program_seconds(least: float = 0.5) -> dict[str, dict[str, float]]:
  """JAX's seconds in this process so far by program (its function's name for tracing, its
  module's for lowering and compiling), for programs that took at least `least` in all; a cache
  read is not attributed (JAX does not name it)."""
  with _lock:
    return {name: {k: round(v, 2) for k, v in spent.items() if v}
            for name, spent in _by_program.items() if sum(spent.values()) >= least}


monitoring.register_event_duration_secs_listener(_add)


def compile_seconds(since: dict[str, float] | None = None) -> dict[str, float]:
  """JAX's seconds in this process so far (past `since`, an earlier answer): tracing,
  lowering, compiling, cache reads."""
  with _lock:
    return {k: round(v - (since or {}).get(k, 0.0), 2) for k, v in _spent.items()}


def process_start() -> float | None:
  """Wall-clock time (time.time()) at which this process started; None without /proc."""
  try:
    with open("/proc/self/stat", encoding="ascii") as f:
      ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
    with open("/proc/uptime", encoding="ascii") as f:
      uptime = float(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return None
  return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class Startup:
  """Seconds since the process started, noted at each phase."""

  def __init__(self):
    self.started = process_start()
    self.phases: dict[str, float] = {}
    self.compile_at: dict[str, dict[str, float]] = {}
    self._compiled_before = compile_seconds()  # another run's, in a process that ran one

  def note(self, phase: str, at: float | None = None) -> None:
    if self.started is not None:
      self.phases[phase] = round((time.time() if at is None else at) - self.started, 2)
    if phase in ("to_steps_compiled_s", "to_compiled_s"):
      self.compile_at[phase] = compile_seconds(self._compiled_before)

  def add(self, name: str, value: float | str) -> None:
    """A phase's own duration (`restore_read_s`), beside the times since the start, or a word
    on it (`restore_after_compile`: why a resume's restore did not run beside its compile)."""
    self.phases[name] = round(value, 2) if isinstance(value, float) else value

  def record(self, *, state_s: float, first_step_s: float, first_step_at: float,
             first_compile_s: float = 0.0) -> dict:
    self.note("to_first_step_s", at=first_step_at)
    return {**self.phases, "state_s": round(state_s, 2), "first_step_s": round(first_step_s, 2),
            "first_compile_s": round(first_compile_s, 2),
            "compile": compile_seconds(self._compiled_before), "compile_at": self.compile_at,
            "compile_by_program": program_seconds()}
