"""The training loop: dispatches steps ahead and syncs with the host only when it logs."""

from __future__ import annotations

import dataclasses
import math
import pathlib

import jax


from trainer.experiment import Experiment
from trainer.metrics import MetricsWriter
from trainer.progress import Progress, Timer


@dataclasses.dataclass
class Result:
  records: list[dict]  # every metrics record written
  final_eval_loss: float | None
  time_to_first_step_s: float
  state: object  # the final TrainState


def evaluate(exp: Experiment, params, batches) -> dict:
  loss_sum = weight_sum = 0.0
  with exp.context():
    sums = [exp.eval_fn(params, exp.global_batch(b)) for b in batches]
  for loss, weight in jax.device_get(sums):
    loss_sum, weight_sum = loss_sum + float(loss), weight_sum + float(weight)
  mean = loss_sum / max(weight_sum, 1.0)
  return {"eval_loss": mean, "eval_perplexity": math.exp(min(mean, 700.0)),
          "eval_tokens": int(weight_sum)}


def train(exp: Experiment, *, metrics_path: pathlib.Path | None = None,
          progress: Progress | None = None) -> Result:
  run = exp.run
  cfg = run.trainer
  progress = progress or Progress(cfg.max_steps, enabled=False)
  writer = MetricsWriter(metrics_path)
  process = dict(process_index=jax.process_index(), process_count=jax.process_count())
  data = exp.source.train_iterator(**process)
  eval_batches = exp.source.eval_batches(batch_size=run.eval.batch_size,
                                         num_batches=run.eval.num_batches, **process)
  tokens_per_step = exp.source.batch_size * exp.source.seq_len

  timer = Timer()
  state = exp.init()
  eval_loss = None
  with exp.context():
    state, metrics = exp.step_fn(state, exp.global_batch(next(data)))
    jax.block_until_ready(state)
    first_step_s = timer.lap()
    progress.message(f"compiled and ran step 1 in {first_step_s:.1f}s "
                     f"({exp.num_params:,} parameters, mesh {dict(exp.mesh.shape)})")
    last_logged = 0
    for step in range(1, cfg.max_steps + 1):
      if step > 1:
        state, metrics = exp.step_fn(state, exp.global_batch(next(data)))
      if step % cfg.log_every == 0 or step == cfg.max_steps:
        host = jax.device_get(metrics)  # the only host sync of a logging step
        elapsed = timer.lap() if step > 1 else first_step_s
        steps = max(step - max(last_logged, 1), 1) if step > 1 else 1
        record = {"step": step, **{k: float(v) for k, v in host.items()},
                  "tokens_per_sec": tokens_per_step * steps / max(elapsed, 1e-9),
                  "step_time_s": elapsed / steps, **exp.source.metrics()}
        last_logged = step
        writer.write(record)
        progress.step(record)
      if (run.eval.every_steps and step % run.eval.every_steps == 0) or step == cfg.max_steps:
        result = evaluate(exp, state.params, eval_batches)
        eval_loss = result["eval_loss"]
        writer.write({"step": step, **result})
        progress.message(f"step {step}: eval_loss {eval_loss:.4f} "
                         f"(perplexity {result['eval_perplexity']:.2f})")
        timer.lap()  # evaluation time is not step time
  writer.close()
  progress.close()
  return Result(records=writer.records, final_eval_loss=eval_loss,
                time_to_first_step_s=first_step_s, state=state)


def initial_eval_loss(exp: Experiment) -> float:
  """Held-out loss of freshly initialised parameters (for tests and reports)."""
  process = dict(process_index=jax.process_index(), process_count=jax.process_count())
  batches = exp.source.eval_batches(batch_size=exp.run.eval.batch_size,
                                    num_batches=exp.run.eval.num_batches, **process)
  return evaluate(exp, exp.init().params, batches)["eval_loss"]



