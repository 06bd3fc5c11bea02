"""Learning-rate schedules (registry `schedule`): step -> learning rate, built from config.

Each starts with a linear warm-up from 0 (the rate at step s < warmup_steps is peak * s /
warmup_steps) and ends at `end_ratio` * peak where it ends at all. `step` counts the
optimizer steps taken before the update it scales. Formulas: docs/optimizers.md.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Literal

import jax.numpy as jnp

from core.registry import ConfigError, Registry
from trainer.ranges import FRACTION, NON_NEGATIVE, Interval, check_ranges

SCHEDULES = Registry("schedule")
_PATH = "optimizer.schedule"


class _Checked:
  """The check every schedule config shares: ranges, then the warm-up against
  trainer.max_steps and decay_steps."""
  # What a switch to another schedule keeps (end_ratio is a floor in rsqrt, a final value
  # elsewhere: not shared).
  SHARED: ClassVar = ("warmup_steps", "decay_steps")

  def check(self, *, peak: float, total_steps: int):
    del peak
    _check(self, total_steps)


def _check(cfg, total_steps: int) -> None:
  check_ranges(cfg, _PATH)
  if cfg.warmup_steps > total_steps:
    raise ConfigError(f"{_PATH}.warmup_steps: {cfg.warmup_steps} is longer than "
                      f"trainer.max_steps {total_steps}; allowed range [0, {total_steps}]")
  decay_steps = getattr(cfg, "decay_steps", None)
  if decay_steps is not None and decay_steps < cfg.warmup_steps:
    raise ConfigError(f"{_PATH}.decay_steps: {decay_steps} is shorter than warmup_steps "
                      f"{cfg.warmup_steps} (it counts the warm-up); allowed range "
                      f"[{cfg.warmup_steps}, inf) or None for trainer.max_steps")


def _with_warmup(peak: float, warmup: int, after: Callable) -> Callable:
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    return jnp.where(step < warmup, peak * step / max(warmup, 1), after(step))
  return schedule


def _progress(step, start: int, length: int):
  """0 at `start`, 1 at `start + length` and after."""
  return jnp.clip((step - start) / max(length, 1), 0.0, 1.0)


_STEPS = {"warmup_steps": NON_NEGATIVE, "decay_steps": Interval(1)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmupCosineConfig(_Checked):
  kind: str = "warmup_cosine"
  warmup_steps: int = 100  # linear warm-up from 0 to the peak learning rate (steps)
  decay_steps: int | None = None  # end of the cosine, warm-up included (steps); None = max_steps
  end_ratio: float = 0.1  # final learning rate as a fraction of the peak
  RANGES: ClassVar = {**_STEPS, "end_ratio": FRACTION}


@SCHEDULES.register("warmup_cosine", WarmupCosineConfig)
def warmup_cosine(*, cfg: WarmupCosineConfig, peak: float, total_steps: int):
  end, w = peak * cfg.end_ratio, cfg.warmup_steps
  length = (cfg.decay_steps or total_steps) - w
  return _with_warmup(peak, w, lambda s: end + (peak - end) * 0.5 * (
      1 + jnp.cos(jnp.pi * _progress(s, w, length))))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConstantConfig(_Checked):
  kind: str = "constant"
  warmup_steps: int = 0  # linear warm-up from 0 to the learning rate (steps); then constant
  RANGES: ClassVar = {"warmup_steps": NON_NEGATIVE}


@SCHEDULES.register("constant", ConstantConfig)
def constant(*, cfg: ConstantConfig, peak: float, total_steps: int):
  del total_steps
  return _with_warmup(peak, cfg.warmup_steps, lambda s: jnp.full_like(s, peak))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearConfig(_Checked):
  kind: str = "linear"
  warmup_steps: int = 100  # linear warm-up from 0 to the peak learning rate (steps)
  decay_steps: int | None = None  # end of the decay, warm-up included (steps); None = max_steps
  end_ratio: float = 0.0  # final learning rate as a fraction of the peak
  RANGES: ClassVar = {**_STEPS, "end_ratio": FRACTION}


@SCHEDULES.register("linear", LinearConfig)
def linear(*, cfg: LinearConfig, peak: float, total_steps: int):
  end, w = peak * cfg.end_ratio, cfg.warmup_steps
  length = (cfg.decay_steps or total_steps) - w
  return _with_warmup(peak, w, lambda s: peak + (end - peak) * _progress(s, w, length))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RsqrtConfig(_Checked):
  kind: str = "rsqrt"
  warmup_steps: int = 100  # linear warm-up from 0 to the peak learning rate (steps)
  end_ratio: float = 0.0  # floor: the rate never falls below this fraction of the peak
  RANGES: ClassVar = {"warmup_steps": NON_NEGATIVE, "end_ratio": FRACTION}


@SCHEDULES.register("rsqrt", RsqrtConfig)
def rsqrt(*, cfg: RsqrtConfig, peak: float, total_steps: int):
  """peak * sqrt(warmup_steps / step) after the warm-up (warmup_steps 0 counts as 1)."""
  del total_steps
  w = max(cfg.warmup_steps, 1)
  return _with_warmup(peak, cfg.warmup_steps, lambda s: jnp.maximum(
      peak * cfg.end_ratio, peak * jnp.sqrt(w / jnp.maximum(s, w))))


_SHAPES = {
    "linear": lambda x: 1 - x,
    "cosine": lambda x: 0.5 * (1 + jnp.cos(jnp.pi * x)),
    "1-sqrt": lambda x: 1 - jnp.sqrt(x),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class WsdConfig(_Checked):
  """Warm-up, stable at the peak, then a decay over the last decay_fraction of max_steps."""
  kind: str = "wsd"
  warmup_steps: int = 100  # linear warm-up from 0 to the peak learning rate (steps)
  decay_fraction: float = 0.2  # share of trainer.max_steps spent decaying, at the end; (0, 1]
  decay_shape: Literal["linear", "cosine", "1-sqrt"] = "1-sqrt"  # curve of the decay
  end_ratio: float = 0.0  # final learning rate as a fraction of the peak
  RANGES: ClassVar = {"warmup_steps": NON_NEGATIVE, "end_ratio": FRACTION,
                      "decay_fraction": Interval(0, 1, low_closed=False, high_closed=True)}

  def decay_length(self, total_steps: int) -> int:
    return max(1, round(self.decay_fraction * total_steps))

  def check(self, *, peak: float, total_steps: int):
    super().check(peak=peak, total_steps=total_steps)
    length = self.decay_length(total_steps)
    if total_steps - length < self.warmup_steps:
      raise ConfigError(
          f"{_PATH}.decay_fraction: {self.decay_fraction} of trainer.max_steps {total_steps} "
          f"is {length} decay steps, which overlap warmup_steps {self.warmup_steps}; allowed "
          f"range (0, {(total_steps - self.warmup_steps) / total_steps:g}]")


@SCHEDULES.register("wsd", WsdConfig)
def wsd(*, cfg: WsdConfig, peak: float, total_steps: int):
  end, length = peak * cfg.end_ratio, cfg.decay_length(total_steps)
  shape = _SHAPES[cfg.decay_shape]
  return _with_warmup(peak, cfg.warmup_steps, lambda s: end + (peak - end) * shape(
      _progress(s, total_steps - length, length)))
