"""axtrain's training loop against benchmarks/plain_jax.py on the same model, batches and start.

Rounds alternate which side runs first (ABBA), so that drift in a shared
machine's load falls on both. axtrain's figure is what its own loop logs
(`step_time_s` of its metrics record, steps 2..K); plain JAX's is the same
span timed around its loop, which also pulls batches from the same iterator.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import jax

from benchmarks import plain_jax
from trainer import loop
from trainer.experiment import Experiment


@dataclasses.dataclass
class Comparison:
  name: str
  params: int
  tokens_per_step: int
  flops_per_step: float
  ours_step_s: list[float]  # per round, steady state
  plain_step_s: list[float]
  ours_first_s: float  # time to first step: init + compile + one step
  plain_first_s: float
  ours_loss: float  # loss logged at the last step of round 1 (same start, same batches)
  plain_loss: float

  @property
  def ours_median_s(self) -> float:
    return statistics.median(self.ours_step_s)

  @property
  def plain_median_s(self) -> float:
    return statistics.median(self.plain_step_s)

  @property
  def ratio(self) -> float:
    """Throughput of axtrain over plain JAX (> 1: axtrain is faster)."""
    return self.plain_median_s / self.ours_median_s


def model_flops_per_step(exp: Experiment) -> float:
  """6 N T for the matmul parameters (not the input embedding table) + attention.

  Attention: 12 * layers * seq * dim per token (QK^T and AV, forward and
  backward), counting the full square as PaLM's MFU does.
  """
  m = exp.run.model
  n = exp.num_params - m.vocab_size * m.dim * (0 if m.tie_embeddings else 1)
  tokens = exp.source.batch_size * exp.source.seq_len
  return 6 * n * tokens + 12 * m.num_layers * exp.source.seq_len * m.dim * tokens


def plain_shape(exp: Experiment) -> plain_jax.Shape:
  m = exp.run.model
  a = m.block.attention
  if (a.num_kv_heads or a.num_heads) != a.num_heads or m.tie_embeddings:
    raise ValueError("plain_jax covers MHA with an untied head only")
  return plain_jax.Shape(vocab=m.vocab_size, dim=m.dim, layers=m.num_layers,
                         heads=a.num_heads, hidden=m.block.ffn.hidden_dim,
                         eps=m.block.norm.eps, theta=a.position.theta)


def plain_hyper(exp: Experiment) -> plain_jax.Hyper:
  o = exp.run.optimizer
  if o.kind != "adamw":
    raise ValueError("plain_jax implements adamw only")
  if o.schedule.kind != "warmup_cosine" or o.schedule.decay_steps is not None:
    raise ValueError("plain_jax implements warmup_cosine over trainer.max_steps only")
  return plain_jax.Hyper(peak_lr=o.learning_rate, warmup_steps=o.schedule.warmup_steps,
                         total_steps=max(exp.run.trainer.max_steps, o.schedule.warmup_steps + 1),
                         end_ratio=o.schedule.end_ratio,
                         b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                         decay_embeddings=o.decay_embeddings,
                         clip_norm=math.inf if o.clip_norm is None else o.clip_norm)


class _Plain:
  def __init__(self, exp: Experiment):
    self.exp = exp
    self.shape, self.hyper = plain_shape(exp), plain_hyper(exp)
    self.step = plain_jax.jitted_step(self.shape, self.hyper)

  def first(self) -> float:
    """Time to first step from nothing: own init (jitted) + compile + one step."""
    t = time.perf_counter()
    params = jax.jit(plain_jax.init_params, static_argnums=1)(jax.random.key(0), self.shape)
    data = self.exp.source.train_iterator(process_index=0, process_count=1)
    params, opt, _ = self.step(params, plain_jax.init_opt(params), next(data))
    jax.block_until_ready(params)
    return time.perf_counter() - t

  def run(self, params) -> tuple[float, float]:
    """K steps from `params` (axtrain layout): (steady-state step seconds, last loss)."""
    steps = self.exp.run.trainer.max_steps
    params = jax.device_put(plain_jax.from_axtrain(params))
    opt = plain_jax.init_opt(params)
    data = self.exp.source.train_iterator(process_index=0, process_count=1)
    params, opt, metrics = self.step(params, opt, next(data))
    jax.block_until_ready(params)
    t = time.perf_counter()
    for _ in range(steps - 1):
      params, opt, metrics = self.step(params, opt, next(data))
    loss = float(jax.device_get(metrics["loss"]))
    return (time.perf_counter() - t) / max(steps - 1, 1), loss


def compare(name: str, exp: Experiment, *, rounds: int) -> Comparison:
  """`rounds` interleaved runs of exp.run.trainer.max_steps steps on each side."""
  cfg = exp.run.trainer
  if cfg.log_every != cfg.max_steps or cfg.max_steps < 2:
    raise ValueError("compare needs trainer.log_every == trainer.max_steps >= 2")
  plain = _Plain(exp)
  ours_s, plain_s = [], []
  ours_first = plain_first = ours_loss = plain_loss = None
  for r in range(rounds):
    for side in (("ours", "plain") if r % 2 == 0 else ("plain", "ours")):
      if side == "ours":
        result = loop.train(exp)
        record = [x for x in result.records if "step_time_s" in x][-1]
        ours_s.append(record["step_time_s"])
        if ours_first is None:
          ours_first, ours_loss = result.time_to_first_step_s, record["loss"]
      else:
        if plain_first is None:
          plain_first = plain.first()
        start = jax.device_get(exp.init().params)
        seconds, loss = plain.run(start)
        plain_s.append(seconds)
        if plain_loss is None:
          plain_loss = loss
  return Comparison(name=name, params=exp.num_params,
                    tokens_per_step=exp.source.batch_size * exp.source.seq_len,
                    flops_per_step=model_flops_per_step(exp), ours_step_s=ours_s,
                    plain_step_s=plain_s, ours_first_s=ours_first, plain_first_s=plain_first,
                    ours_loss=ours_loss, plain_loss=plain_loss)

