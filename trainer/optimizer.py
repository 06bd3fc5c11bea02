"""Optimizers and learning-rate schedules (one registry each), built from config."""

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax

from core.registry import REQUIRED, ConfigError, Registry, child

OPTIMIZERS = Registry("optimizer")
SCHEDULES = Registry("schedule")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmupCosineConfig:
  kind: str = "warmup_cosine"
  warmup_steps: int = 100  # linear warm-up from 0 to the peak learning rate (steps)
  decay_steps: int | None = None  # cosine decay length incl. warm-up (steps); None = trainer.max_steps
  end_ratio: float = 0.1  # final learning rate as a fraction of the peak

  def check(self, *, peak: float, total_steps: int):
    if self.warmup_steps < 0 or not 0 <= self.end_ratio <= 1:
      raise ConfigError("schedule: warmup_steps must be >= 0 and end_ratio in [0, 1]")


@SCHEDULES.register("warmup_cosine", WarmupCosineConfig)
def warmup_cosine(*, cfg: WarmupCosineConfig, peak: float, total_steps: int):
  decay = max(cfg.decay_steps or total_steps, cfg.warmup_steps + 1)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=cfg.warmup_steps, decay_steps=decay,
      end_value=peak * cfg.end_ratio)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConstantConfig:
  kind: str = "constant"
  warmup_steps: int = 0  # linear warm-up from 0 (steps)


@SCHEDULES.register("constant", ConstantConfig)
def constant(*, cfg: ConstantConfig, peak: float, total_steps: int):
  del total_steps
  if not cfg.warmup_steps:
    return optax.constant_schedule(peak)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, cfg.warmup_steps), optax.constant_schedule(peak)],
      [cfg.warmup_steps])


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdamWConfig:
  kind: str = "adamw"
  learning_rate: float = REQUIRED  # peak learning rate
  b1: float = 0.9  # first-moment decay
  b2: float = 0.95  # second-moment decay
  eps: float = 1e-8  # added to the denominator
  weight_decay: float = 0.1  # decoupled; applied to matrices only (not norms or biases)
  clip_norm: float | None = 1.0  # global gradient-norm clip; None = off
  state_dtype: Literal["float32", "bfloat16"] = "float32"  # dtype of the first moment
  schedule: Any = child("schedule")

  def check(self, *, total_steps: int):
    if self.learning_rate <= 0:
      raise ConfigError(f"optimizer.learning_rate must be positive, got {self.learning_rate}")


def _decay_mask(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


@dataclasses.dataclass(frozen=True)
class Optimizer:
  tx: optax.GradientTransformation
  schedule: optax.Schedule  # step -> learning rate, for the metrics


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """optax.clip_by_global_norm as one scalar factor on every gradient.

  optax selects between the clipped and unclipped tree (lax.select), which XLA on
  CPU does not fuse into the Adam update: the optimizer step took twice as long
  (0.49 s against 0.24 s for 79M parameters). Unclipped gradients are unchanged
  (x * 1.0); clipped ones may differ from optax in the last bit.
  """
  def update(updates, state, params=None):
    del params
    norm = optax.tree.norm(updates)
    scale = jnp.where(norm < max_norm, 1.0, max_norm / norm)
    return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

  return optax.GradientTransformation(optax.init_empty_state, update)


@OPTIMIZERS.register("adamw", AdamWConfig)
def adamw(*, cfg: AdamWConfig, total_steps: int) -> Optimizer:
  schedule = SCHEDULES.build(cfg.schedule, peak=cfg.learning_rate, total_steps=total_steps)
  parts = [clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm else []
  parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=_decay_mask,
                           mu_dtype=jnp.dtype(cfg.state_dtype)))
  return Optimizer(optax.chain(*parts), schedule)
