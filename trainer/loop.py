"""The training loop: dispatches steps ahead and syncs with the host only when it logs or saves.

Resuming, preemption and non-finite losses are handled here; the launcher
(launcher/session.py) owns signals, the run directory and exit codes.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
import time
from typing import Callable

import flax.linen as nn
import jax
import numpy as np

from trainer.checkpoint import Checkpointer, load_params
from trainer.experiment import Experiment
from trainer.metrics import MetricsWriter
from trainer.progress import Progress, Timer
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


class NonFiniteError(Exception):
  """A NaN/Inf loss or gradient with trainer.skip_nonfinite off."""

  def __init__(self, step: int, last_good: str):
    super().__init__(f"non-finite loss or gradient at step {step}; last good checkpoint: "
                     f"{last_good} (set trainer.skip_nonfinite=True to skip such steps)")
    self.step = step


def evaluate(exp: Experiment, params, batches) -> dict:
  loss_sum = weight_sum = 0.0
  with exp.context():
    sums = [exp.eval_fn(params, exp.global_batch(b)) for b in batches]
  for loss, weight in jax.device_get(sums):
    loss_sum, weight_sum = loss_sum + float(loss), weight_sum + float(weight)
  mean = loss_sum / max(weight_sum, 1.0)
  return {"eval_loss": mean, "eval_perplexity": math.exp(min(mean, 700.0)),
          "eval_tokens": int(weight_sum)}


def _warn(text: str) -> None:
  print(f"axtrain: warning: {text}", file=sys.stderr, flush=True)


def _initial_state(exp: Experiment, ckpt: Checkpointer | None, data, progress: Progress,
                   warn: Callable[[str], None]):
  """(state, start step): the run's own checkpoint if any, else init (+ init.from_run params)."""
  abstract = nn.meta.unbox(exp.abstract_state)
  if ckpt is not None:
    restore_step = exp.run.checkpoint.restore_step or None
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
  state = exp.init()
  if exp.run.init.from_run:
    params = load_params(exp.run.init.from_run, abstract.params, exp.state_shardings.params)
    state = state.replace(params=params)
    progress.message(f"initialised parameters from {exp.run.init.from_run}")
  return state, 0


def train(exp: Experiment, *, metrics_path: pathlib.Path | None = None,
          progress: Progress | None = None, checkpoint_dir: pathlib.Path | None = None,
          stop_requested: Callable[[], bool] = lambda: False,
          pause_after_step: int | None = None,
          warn: Callable[[str], None] = _warn) -> Result:
  """Trains to trainer.max_steps, resuming from `checkpoint_dir` when it holds checkpoints.

  `stop_requested` is polled after every step: when it turns true the loop
  saves a checkpoint of the finished step and returns with `preempted`.
  `pause_after_step` (tests) holds the loop after that step until a stop is requested.
  """
  run = exp.run
  cfg = run.trainer
  progress = progress or Progress(cfg.max_steps, enabled=False)
  process = dict(process_index=jax.process_index(), process_count=jax.process_count())
  data = exp.source.train_iterator(**process)
  eval_batches = exp.source.eval_batches(batch_size=run.eval.batch_size,
                                         num_batches=run.eval.num_batches, **process)
  tokens_per_step = exp.source.batch_size * exp.source.seq_len
  ckpt = Checkpointer(checkpoint_dir, run.checkpoint) if checkpoint_dir is not None else None
  writer = MetricsWriter(metrics_path)
  try:
    state, start = _initial_state(exp, ckpt, data, progress, warn)
    return _run(exp, state, start, data=data, eval_batches=eval_batches, ckpt=ckpt,
                writer=writer, progress=progress, tokens_per_step=tokens_per_step,
                stop_requested=stop_requested, pause_after_step=pause_after_step)
  finally:
    writer.close()
    progress.close()
    if ckpt is not None:
      ckpt.close()  # waits for a save in flight


def _run(exp, state, start, *, data, eval_batches, ckpt, writer, progress, tokens_per_step,
         stop_requested, pause_after_step) -> Result:
  run, cfg = exp.run, exp.run.trainer
  timer = Timer()
  first_step_s = 0.0
  eval_loss = None
  pending = []  # (step, device scalar nonfinite) not yet checked on the host
  skipped_total = 0
  last_logged = start
  preempted = False
  step = start

  def scan_nonfinite() -> int | None:
    """Counts non-finite steps since the last scan; returns the first one."""
    nonlocal skipped_total
    if not pending:
      return None
    flags = jax.device_get([flag for _, flag in pending])
    bad = [s for (s, _), f in zip(pending, flags) if float(f) > 0]
    pending.clear()
    skipped_total += len(bad)
    return bad[0] if bad else None

  def stop_if_nonfinite(bad: int | None):
    if bad is None or cfg.skip_nonfinite:
      return
    last = None
    if ckpt is not None:
      ckpt.wait_until_finished()
      last = ckpt.latest_step()
    raise NonFiniteError(bad, f"step {last} in {ckpt.directory}" if last is not None else "none")

  def check_finite():
    stop_if_nonfinite(scan_nonfinite())

  def save(force: bool):
    if ckpt is not None and (force or ckpt.due(step)):
      check_finite()  # never write a checkpoint of non-finite parameters
      ckpt.save(step, state, data.get_state())

  watchdog = Watchdog(cfg.hang_timeout_s)
  with exp.context():
    try:
      for step in range(start + 1, cfg.max_steps + 1):
        batch = next(data)
        if step == cfg.debug_nan_at_step:
          batch = dict(batch, weights=np.full_like(batch["weights"], np.nan))
        state, metrics = exp.step_fn(state, exp.global_batch(batch))
        pending.append((step, metrics.pop("nonfinite")))
        if step == start + 1:
          jax.block_until_ready(state)
          first_step_s = timer.lap()
          progress.message(f"compiled and ran step {step} in {first_step_s:.1f}s "
                           f"({exp.num_params:,} parameters, mesh {dict(exp.mesh.shape)})")
        if step % cfg.log_every == 0 or step == cfg.max_steps:
          host = jax.device_get(metrics)  # the only host sync of a logging step
          bad = scan_nonfinite()
          elapsed = timer.lap() if step > start + 1 else first_step_s
          steps = max(step - max(last_logged, start + 1), 1) if step > start + 1 else 1
          record = {"step": step, **{k: float(v) for k, v in host.items()},
                    "tokens_per_sec": tokens_per_step * steps / max(elapsed, 1e-9),
                    "step_time_s": elapsed / steps, **exp.source.metrics()}
          if cfg.skip_nonfinite:
            record["nonfinite_skipped"] = skipped_total
          last_logged = step
          writer.write(record)
          progress.step(record)
          stop_if_nonfinite(bad)
        save(force=step == cfg.max_steps)
        # Dispatch runs ahead of the devices by a few steps at most, so a hung device stops
        # these calls soon after; the first countdown starts once compilation is done.
        watchdog.pet()
        if step == pause_after_step:
          while not stop_requested():
            time.sleep(0.01)
        if stop_requested() and step < cfg.max_steps:
          save(force=True)
          preempted = True
          progress.message(f"axtrain: stop requested; saved a checkpoint at step {step}")
          break
        if (run.eval.every_steps and step % run.eval.every_steps == 0) or step == cfg.max_steps:
          result = evaluate(exp, state.params, eval_batches)
          eval_loss = result["eval_loss"]
          writer.write({"step": step, **result})
          progress.message(f"step {step}: eval_loss {eval_loss:.4f} "
                           f"(perplexity {result['eval_perplexity']:.2f})")
          timer.lap()  # evaluation time is not step time
      if start >= cfg.max_steps:  # killed after the final save: only the evaluation is missing
        result = evaluate(exp, state.params, eval_batches)
        eval_loss = result["eval_loss"]
        writer.write({"step": start, **result})
      check_finite()
    finally:
      watchdog.stop()
  if ckpt is not None:
    ckpt.wait_until_finished()
  return Result(records=writer.records, final_eval_loss=None if preempted else eval_loss,
                time_to_first_step_s=first_step_s, state=state, start_step=start,
                preempted=preempted, last_step=step)


def initial_eval_loss(exp: Experiment) -> float:
  """Held-out loss of freshly initialised parameters (for tests and reports)."""
  process = dict(process_index=jax.process_index(), process_count=jax.process_count())
  batches = exp.source.eval_batches(batch_size=exp.run.eval.batch_size,
                                    num_batches=exp.run.eval.num_batches, **process)
  return evaluate(exp, exp.init().params, batches)["eval_loss"]
