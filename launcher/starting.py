"""A training run's start, up to its first step: its programs compiled, or read back from the
compilation cache and loaded ahead of their lookup (trainer/compile_prefetch.py), the
initialisation compiled beside the steps (a second run's also run beside them:
trainer/early_init.py), and a resume's checkpoint read beside them all
(trainer/early_restore.py). run.json's `startup` (trainer/startup.py) says where the time went.
"""

from __future__ import annotations

import concurrent.futures
import pathlib

import jax

from planner import compiler_output, step_memory
from trainer import checkpoint_files, compile_prefetch, early_init, early_restore, host_memory
from trainer import experiment as experiment_lib
from trainer import meshes
from trainer.startup import Startup


def compile_reading(exp: experiment_lib.Experiment, entry: meshes.Entry, *,
                    run_dir: pathlib.Path, startup: Startup, fresh: bool,
                    cache_dir: pathlib.Path | None, resolved: dict):
  """(a resume's checkpoint read beside the compile, or None; a second run's initialisation
  beside it, or None; `_compile`'s). `cache_dir`: the compilation cache's folder (None: off);
  `resolved`: the resolved config (its setting's name in trainer/compile_prefetch.py)."""
  ckpts = run_dir / "checkpoints"
  initialises = fresh or not checkpoint_files.committed_steps(ckpts)
  # The programs this setting used last, loaded in a thread from here in the order this start
  # needs them (a run that restores leaves out the initialisation's, a run that initialises
  # runs it first); what the compile does not take is let go after it.
  setting = compile_prefetch.setting(resolved, entry.name)
  steps = experiment_lib.STEP_PROGRAMS
  compile_prefetch.start(
      cache_dir, setting, leave=() if initialises else (experiment_lib.INIT_PROGRAM,),
      first=(experiment_lib.INIT_PROGRAM, *steps) if initialises else steps)
  early = None if fresh else early_restore.EarlyRestore.start(exp, ckpts, startup=startup)
  try:
    init, compiled = _compile(exp, entry, startup=startup, initialises=initialises)
  except BaseException:
    if early is not None:
      early.close()
    raise
  finally:
    ahead = compile_prefetch.finish()
  compile_prefetch.remember(cache_dir, setting)
  for name, value in ahead.items():
    if value:
      startup.add(name, value)
  return early, init, compiled


def _compile(exp: experiment_lib.Experiment, entry: meshes.Entry, *, startup: Startup,
             initialises: bool) -> tuple[early_init.EarlyInit | None,
                                         tuple[dict, list[str], list[str]]]:
  """The run's one compile (refused here for memory, nothing written) with XLA's log kept apart:
  (the initialisation run beside it, or None; (the train step's compiled_stats, XLA's lines for
  compiler.log, the notes on them))."""
  lines, notes = [], []
  with compiler_output.compiler_log(notes, rest=lines), \
      concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="axtrain-init") as pool:
    # A second run initialises at once, beside the steps' trace and loads (trainer/early_init.py).
    # Else the loop will initialise: its program is compiled beside the steps' (llm_1b on one v5e
    # compiled it for 78 s after the steps' 166 s) once the train step is traced, in a thread
    # the block waits for, also when the steps are refused (step_memory.check_train).
    beside = early_init.EarlyInit.start(exp, startup=startup) if initialises else None
    init = []
    start_init = (lambda: init.append(pool.submit(lambda: exp.init_fn.lower(
        jax.random.key(exp.run.trainer.seed)).compile()))) if initialises and not beside else None
    try:
      compiled = _check_memory(exp, entry, on_lowered=start_init)
    except BaseException:
      if beside is not None:
        beside.close()
      raise
    startup.note("to_steps_compiled_s")
    for started in init:
      started.result()
    if beside is not None:
      beside.wait_compiled()
  # The compiler's freed heap goes back to the system: llm_1b's steps on one v5e host kept
  # 3.9 GiB more RAM in use after compiling than after reading the programs from the cache.
  host_memory.release()
  startup.note("to_compiled_s")
  return beside, (compiled, lines, notes)


def _check_memory(exp: experiment_lib.Experiment, entry: meshes.Entry, *, on_lowered=None):
  """Compiles the train and eval steps for batches shaped like the data's; refuses (ConfigError)
  a step that needs more memory than a device has (naming `entry`'s sweep); calls `on_lowered`
  once the train step is lowered. Returns the train step's compiled_stats (a dict)."""
  process = dict(process_index=jax.process_index(), process_count=jax.process_count())
  train_batch = next(exp.source.train_iterator(**process))
  eval_batch = exp.source.eval_batches(batch_size=exp.run.eval.batch_size, num_batches=1,
                                       **process)[0]
  return step_memory.check_train(exp, train_batch=train_batch, eval_batch=eval_batch,
                                 entry=entry, on_lowered=on_lowered)
