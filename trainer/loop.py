"""The training loop: dispatches one step ahead and copies to the host only when it logs or saves.

After dispatching a step it waits for the one before (not for the one it just dispatched), so
the devices always have the next step queued and a stop request lands after the step in
flight. The train metrics of the steps between two records are folded on the device as the
steps come (trainer/train_metrics.py: the loop knows none of them), and a logging step's are
fetched after the next step is dispatched (one step late), so the host never waits for the step
it just dispatched. Each record's step time is its
own steps' (trainer/step_clock.py); saves and evaluations are timed apart, in records of their
own. `_Loop.run` shows the order of a step. Resuming, preemption and non-finite losses are
handled here; writers, the profiler and test hooks are callbacks (trainer/callbacks.py); the
launcher (launcher/session.py) owns signals, the run directory and exit codes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import sys
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax

from trainer import (compile_cache, flops, host_memory, metrics as metrics_lib, train_metrics,
                     writers)
from trainer.callbacks import Callback, Profile, call_all
from trainer.checkpoint import Checkpointer, load_params
from trainer.early_init import EarlyInit
from trainer.early_restore import EarlyRestore
from trainer.experiment import Experiment
from trainer.progress import Progress, Timer, header
from trainer.step_clock import StepClock
from trainer.run_files import Manifest, no_record
from trainer.step import eval_record
from trainer.watchdog import Watchdog


@dataclasses.dataclass
class Result:
  records: list[dict]  # every metrics record written
  final_eval_loss: float | None  # None when the run stopped early
  time_to_first_step_s: float
  state: object  # the final TrainState
  start_step: int = 0  # step the run resumed from (0: a fresh start)
  preempted: bool = False  # stopped on request, with a checkpoint at the last finished step
  last_step: int = 0  # steps finished
  compiled: dict = dataclasses.field(default_factory=dict)  # the step's per-device memory, FLOPs
  profiles: list = dataclasses.field(default_factory=list)  # profiler captures (run.json)
  state_s: float = 0.0  # the initial state: initialised or restored
  first_step_at: float = 0.0  # time.time() when the first step finished
  first_compile_s: float = 0.0  # of first_step_s: the step's program lowered and compiled (or read)


class NonFiniteError(Exception):
  """A NaN/Inf loss or gradient with trainer.skip_nonfinite off."""

  def __init__(self, step: int, last_good: str, *, learning_rate: float):
    super().__init__(f"non-finite loss or gradient at step {step}; last good checkpoint: "
                     f"{last_good}; lower optimizer.learning_rate (now {learning_rate:g}) or "
                     f"lengthen optimizer.schedule.warmup_steps, and if only rare steps go bad, "
                     f"trainer.skip_nonfinite=True skips them")
    self.step = step


def evaluate(exp: Experiment, params, batches) -> dict:
  """The evaluation record of `params` on `batches` (trainer/step.py:eval_record)."""
  with exp.context():
    sums = [exp.eval_fn(params, exp.global_batch(b)) for b in batches]
  totals: dict[str, float] = {}
  for one in jax.device_get(sums):
    for name, value in one.items():
      totals[name] = totals.get(name, 0.0) + float(value)
  return eval_record(totals)


def _warn(text: str) -> None:
  print(f"axtrain: warning: {text}", file=sys.stderr, flush=True)


def _initial_state(exp: Experiment, ckpt: Checkpointer | None, data, progress: Progress,
                   warn: Callable[[str], None], early: EarlyRestore | None = None,
                   initialised: EarlyInit | None = None):
  """(state, start step): the run's own checkpoint if any (`early`'s read of it, where that is
  the one the restore would read first), else init (`initialised`'s, where it ran one beside
  the compile) (+ init.from_run params)."""
  abstract = nn.meta.unbox(exp.abstract_state)
  if ckpt is not None:
    restore_step = exp.run.checkpoint.restore_step or None
    restored = early.take(at_most=restore_step) if early is not None else None
    if restored is None:
      with exp.context():
        restored = ckpt.restore_newest(abstract, exp.state_shardings, at_most=restore_step,
                                       warn=warn)
    if restored is not None:
      newer = [s for s in ckpt.all_steps() if s > restored.step]
      if newer:
        warn(f"resuming from step {restored.step}; newer checkpoints {newer} moved to "
             f"{ckpt.set_aside(newer)}")
      if restored.data_state:
        data.set_state(restored.data_state)
      progress.message(f"resumed from checkpoint step {restored.step} in {ckpt.directory}")
      return restored.state, restored.step
  state = initialised.take() if initialised is not None else None
  if state is None:
    state = exp.init()
  if exp.run.init.from_run:
    params = load_params(exp.run.init.from_run, abstract.params, exp.state_shardings.params)
    state = state.replace(params=params)
    progress.message(f"initialised parameters from {exp.run.init.from_run}")
  return state, 0


def train(exp: Experiment, *, run_dir: pathlib.Path | None = None,
          progress: Progress | None = None, checkpoint_dir: pathlib.Path | None = None,
          stop_requested: Callable[[], bool] = lambda: False,
          callbacks: Sequence[Callback] = (), hardware_peak_flops: float | None = None,
          warn: Callable[[str], None] = _warn, early: EarlyRestore | None = None,
          initialised: EarlyInit | None = None) -> Result:
  """Trains to trainer.max_steps, resuming from `checkpoint_dir` when it holds checkpoints.

  `run_dir` receives the metrics writers' files and profiles (process 0 only);
  `stop_requested` is polled after every step: when it turns true the loop
  saves a checkpoint of the finished step and returns with `preempted`.
  `callbacks` (trainer/callbacks.py) run after the run's own writers.
  `hardware_peak_flops` (the mesh entry's) is the MFU denominator unless
  trainer.peak_flops is set. `early` (trainer/early_restore.py) and `initialised`
  (trainer/early_init.py): the checkpoint read, or the initialisation run, while the launcher
  compiled; used where the restore would read that checkpoint first, or the run initialises.
  """
  run = exp.run
  cfg = run.trainer
  progress = progress or Progress(cfg.max_steps, enabled=False)
  process = dict(process_index=jax.process_index(), process_count=jax.process_count())
  main_process = jax.process_index() == 0
  data = exp.source.train_iterator(**process)
  eval_batches = exp.source.eval_batches(batch_size=run.eval.batch_size,
                                         num_batches=run.eval.num_batches, **process)
  record = Manifest(run_dir).record if run_dir is not None and main_process else no_record
  ckpt = (Checkpointer(checkpoint_dir, run.checkpoint, record=record)
          if checkpoint_dir is not None else None)
  profile = (Profile(pathlib.Path(run_dir) / "profile", *cfg.profile_steps, record=record)
             if cfg.profile_steps and run_dir is not None and main_process else None)
  callbacks = [*writers.for_run(run_dir, cfg, main_process=main_process, record=record,
                                config=dataclasses.asdict(run) if cfg.wandb_project else None,
                                warn=warn),
               *([profile] if profile else []), *callbacks]
  for line in _header(exp, run_dir):
    progress.message(line)
  loop = LoopState(state=None, start=0, step=0, last_logged=0, stop_requested=stop_requested)
  try:
    started = time.perf_counter()
    loop.state, loop.start = _initial_state(exp, ckpt, data, progress, warn, early, initialised)
    jax.block_until_ready(loop.state)  # an initialisation runs now, not inside the first step
    loop.state_s = time.perf_counter() - started
    loop.step = loop.last_logged = loop.start
    _Loop(exp, loop, data=data, eval_batches=eval_batches, ckpt=ckpt, progress=progress,
          callbacks=callbacks, throughput=_throughput(exp, hardware_peak_flops), warn=warn).run()
  finally:
    for started in filter(None, (early, initialised)):
      started.close()
    call_all(callbacks, "on_train_end", loop)
    progress.close()
    if ckpt is not None:
      # Waits for a save in flight. Where the run already failed (a full disk, say), that save's
      # own failure is not reported over the first one.
      with contextlib.suppress(Exception) if sys.exc_info()[0] else contextlib.nullcontext():
        ckpt.close()
  return Result(records=loop.records, final_eval_loss=None if loop.preempted else loop.eval_loss,
                time_to_first_step_s=loop.first_step_s, state=loop.state, start_step=loop.start,
                preempted=loop.preempted, last_step=loop.step, compiled=loop.compiled,
                profiles=profile.captures if profile else [], state_s=loop.state_s,
                first_step_at=loop.first_step_at, first_compile_s=loop.first_compile_s)


def _header(exp: Experiment, run_dir) -> list[str]:
  state_bytes = metrics_lib.state_bytes_per_device(exp.abstract_state, exp.state_shardings)
  lines = header(mesh_shape=dict(exp.mesh.shape), devices=list(exp.mesh.devices.flat),
                 num_params=exp.num_params, state_bytes=state_bytes, run_dir=run_dir,
                 state_memory=exp.run.trainer.state_memory)
  accum = exp.run.trainer.grad_accum_steps
  if accum > 1:
    lines.insert(1, f"each step accumulates {accum} microbatches of {exp.source.batch_size // accum}"
                    f" rows (trainer.grad_accum_steps"
                    + (f", from trainer.microbatch_rows={exp.run.trainer.microbatch_rows}"
                       if exp.run.trainer.microbatch_rows else "") + ")")
  return lines


def _throughput(exp: Experiment, hardware_peak_flops: float | None) -> metrics_lib.Throughput:
  peak = metrics_lib.peak_flops(exp.run.trainer.peak_flops, hardware_peak_flops,
                                exp.mesh.devices.flat[0].platform)
  return metrics_lib.Throughput(
      flops_per_token=flops.model_flops_per_token(exp.run, exp.abstract_state.params),
      num_devices=exp.mesh.size, peak=peak)


@dataclasses.dataclass
class LoopState:
  """What the loop carries from step to step (callbacks read it)."""
  state: Any  # TrainState after the last dispatched step
  start: int  # the step the run resumed from (0: a fresh start)
  step: int  # the last dispatched step
  last_logged: int  # step of the last metrics record
  stop_requested: Callable[[], bool]
  unchecked: list = dataclasses.field(default_factory=list)  # [(step, device nonfinite flag)]
  # the train metrics of the steps since the last record, folded on the device
  interval: train_metrics.Interval = dataclasses.field(default_factory=train_metrics.Interval)
  unlogged: tuple | None = None  # (step, its Summed metrics, data metrics): written one step late
  skipped: int = 0  # non-finite steps seen so far
  first_step_s: float = 0.0  # compile + first step
  first_step_at: float = 0.0  # time.time() when it finished
  first_compile_s: float = 0.0  # of first_step_s: the step's program lowered and compiled
  state_s: float = 0.0  # the initial state: initialised or restored (its arrays ready)
  eval_loss: float | None = None
  preempted: bool = False
  records: list = dataclasses.field(default_factory=list)  # every record written
  compiled: dict = dataclasses.field(default_factory=dict)  # the step's per-device memory, FLOPs


class _Loop:
  """The steps of the loop; `run` shows their order."""

  def __init__(self, exp: Experiment, loop: LoopState, *, data, eval_batches, ckpt, progress,
               callbacks, throughput, warn: Callable[[str], None] = _warn):
    self.exp, self.s, self.cfg, self.warn = exp, loop, exp.run.trainer, warn
    self.data, self.eval_batches, self.ckpt = data, eval_batches, ckpt
    self.progress, self.callbacks, self.throughput = progress, callbacks, throughput
    self.tokens_per_step = exp.source.batch_size * exp.source.seq_len
    self.timer = Timer()  # the first step: compilation included
    self.clock = StepClock()  # every later step
    self.watchdog = Watchdog(self.cfg.hang_timeout_s)

  def run(self) -> None:
    try:
      self._run()
    except BaseException:
      self.clock.close(wait=False)
      raise
    self.clock.close()

  def _run(self) -> None:
    call_all(self.callbacks, "on_train_start", self.s)
    with self.exp.context(), self.watchdog:
      for step in range(self.s.start + 1, self.cfg.max_steps + 1):
        self.dispatch(step)  # returns before the devices finish the step
        self.log(step)  # writes step - 1's record (one step late), holds step's
        self.save(step, force=step == self.cfg.max_steps)
        # Dispatch runs one step ahead of the devices at most (wait_for_previous), so a hung
        # device stops these calls at once; the first countdown starts once compilation is done.
        self.watchdog.pet()
        call_all(self.callbacks, "on_step_end", step, self.s)
        if self.stop(step):
          break
        self.evaluate(step, due=self._eval_due(step))
      if self.s.start >= self.cfg.max_steps:  # killed after the final save: only eval is missing
        self.evaluate(self.s.start, due=True)
      self.flush_log()
      self.check_finite()
    if self.ckpt is not None:
      self.ckpt.wait_until_finished()

  def dispatch(self, step: int) -> None:
    s, exp = self.s, self.exp
    batch = next(self.data)
    for cb in self.callbacks:
      batch = cb.on_batch(step, batch)
    batch = exp.global_batch(batch)
    if step == s.start + 1:  # compiles here, once; exp.step_fn reuses the executable
      compiling = time.perf_counter()
      s.compiled = metrics_lib.compiled_stats(exp.step_fn.lower(s.state, batch).compile())
      s.first_compile_s = time.perf_counter() - compiling
    s.state, metrics = exp.step_fn(s.state, batch)
    s.step = step
    s.unchecked.append((step, metrics.pop("nonfinite")))
    s.interval.add(metrics)
    self.clock.dispatched(step, s.unchecked[-1][1])
    self.wait_for_previous(step)
    if step == s.start + 1:
      jax.block_until_ready(s.state)
      s.first_step_s = self.timer.lap()  # later steps are timed from its end (self.clock)
      s.first_step_at = time.time()
      memory = s.compiled.get("total_bytes")
      programs, saved = compile_cache.read_so_far()
      self.progress.message(f"compiled and ran step {step} in {s.first_step_s:.1f}s"
                            + (f" ({programs} program(s) read from the compilation cache, "
                               f"~{saved:.0f}s of compiling saved)" if programs else "")
                            + (f"; step memory {memory / 2**20:,.1f} MiB per device"
                               if memory is not None else ""))

  def wait_for_previous(self, step: int) -> None:
    """Waits until the step before `step` (just dispatched) has finished: its non-finite flag,
    a scalar, is ready; nothing is copied. The devices always have the next step queued, and
    the host is never more than one step ahead of them, so a stop request (a signal) is acted
    on after the step in flight, not after the steps the host would otherwise dispatch ahead
    until its next sync (a logging step).

    With the state in host memory (trainer.state_memory="host") it waits for `step` itself:
    a step queued behind the running one would hold a third copy of the state in host RAM (the
    running step's input and output, the queued one's output), and a step of tens of seconds
    gains nothing from being queued early."""
    self.clock.wait(step if self.cfg.state_memory == "host" else step - 1)

  def log(self, step: int) -> None:
    self.flush_log()
    if step % self.cfg.log_every == 0 or step == self.cfg.max_steps:
      self.s.unlogged = (step, self.s.interval.take(), self.exp.source.metrics())

  def flush_log(self) -> None:
    """Writes the held record: the only host sync of a logging step."""
    s = self.s
    if s.unlogged is None:
      return
    step, summed, data_metrics = s.unlogged
    s.unlogged = None
    self.clock.wait(step)
    summary = summed.record()
    bad = self._scan_nonfinite(upto=step)
    if step == s.start + 1:
      elapsed, steps = s.first_step_s, 1
    else:  # the first step (compilation) is in no later record
      after = max(s.last_logged, s.start + 1)
      elapsed, steps = self.clock.seconds(after, step), step - after
    tokens_per_sec = self.tokens_per_step * steps / max(elapsed, 1e-9)
    record = {"step": step, **summary,
              "tokens_per_sec": tokens_per_sec, "step_time_s": elapsed / steps,
              **self.throughput(tokens_per_sec), **metrics_lib.device_memory(self.exp.mesh.local_devices),
              **host_memory.record(), **data_metrics}
    if self.cfg.skip_nonfinite:
      record["nonfinite_skipped"] = s.skipped
    s.last_logged = step
    self._emit(record)
    self.progress.step(record)
    self._raise_if_nonfinite(bad)

  def check_finite(self) -> None:
    self._raise_if_nonfinite(self._scan_nonfinite(upto=self.s.step))

  def _skipped(self, bad: list[int], *, upto: int) -> None:
    """One warning line for the steps just found non-finite and skipped (skip_nonfinite)."""
    if not bad:
      return
    steps = (f"step {bad[0]}" if len(bad) == 1
             else f"{len(bad)} steps (between steps {bad[0]} and {bad[-1]})")
    done = upto - self.s.start
    self.warn(f"skipped {steps} with a non-finite loss or gradient, parameters unchanged; "
              f"{self.s.skipped} of {done} steps skipped so far (lower "
              f"optimizer.learning_rate if this goes on)")

  def save(self, step: int, *, force: bool) -> None:
    if self.ckpt is not None and (force or self.ckpt.due(step)):
      self.flush_log()
      self.check_finite()  # never write a checkpoint of non-finite parameters
      with self.clock.paused() as pause, host_memory.Peak(every_s=0.01) as ram:
        saved = self.ckpt.save(step, self.s.state, self.data.get_state())
      if saved:  # (a stop request right after a scheduled save finds the step saved)
        self._emit({"step": step, "save_time_s": pause.seconds, **ram.record()})

  def evaluate(self, step: int, *, due: bool) -> None:
    if not due:
      return
    self.flush_log()  # keeps the records in step order
    with self.clock.paused() as pause:
      result = evaluate(self.exp, self.s.state.params, self.eval_batches)
    self.s.eval_loss = result["eval_loss"]
    self._emit({"step": step, **result, "eval_time_s": pause.seconds})
    self.progress.message(f"step {step}: eval_loss {result['eval_loss']:.4f} "
                          f"(perplexity {result['eval_perplexity']:.2f})")

  def stop(self, step: int) -> bool:
    if not (self.s.stop_requested() and step < self.cfg.max_steps):
      return False
    self.save(step, force=True)
    self.flush_log()
    self.s.preempted = True
    self.progress.message(f"axtrain: stop requested; writing a checkpoint of step {step}")
    return True

  def _eval_due(self, step: int) -> bool:
    every = self.exp.run.eval.every_steps
    return bool(every and step % every == 0) or step == self.cfg.max_steps

  def _emit(self, record: dict) -> None:
    record = writers.plain(record)
    self.s.records.append(record)
    call_all(self.callbacks, "on_record", record)

  def _scan_nonfinite(self, *, upto: int) -> int | None:
    """Counts the non-finite steps up to `upto` not yet seen (warning when they were skipped);
    returns the first one."""
    s = self.s
    seen = [(step, flag) for step, flag in s.unchecked if step <= upto]
    if not seen:
      return None
    s.unchecked = s.unchecked[len(seen):]
    flags = jax.device_get([flag for _, flag in seen])
    bad = [step for (step, _), f in zip(seen, flags) if float(f) > 0]
    s.skipped += len(bad)
    if self.cfg.skip_nonfinite:
      self._skipped(bad, upto=upto)
    return bad[0] if bad else None

  def _raise_if_nonfinite(self, bad: int | None) -> None:
    if bad is None or self.cfg.skip_nonfinite:
      return
    last = None
    if self.ckpt is not None:
      self.ckpt.wait_until_finished()
      last = self.ckpt.latest_step()
    raise NonFiniteError(bad, f"step {last} in {self.ckpt.directory}" if last is not None
                         else "none", learning_rate=self.exp.run.optimizer.learning_rate)


def initial_eval_loss(exp: Experiment) -> float:
  """Held-out loss of freshly initialised parameters (for tests and reports)."""
  process = dict(process_index=jax.process_index(), process_count=jax.process_count())
  batches = exp.source.eval_batches(batch_size=exp.run.eval.batch_size,
                                    num_batches=exp.run.eval.num_batches, **process)
  return evaluate(exp, exp.init().params, batches)["eval_loss"]
