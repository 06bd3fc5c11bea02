"""Learning-rate schedules (registry `schedule`): step -> learning rate, built from config.

Each starts with a linear warm-up from 0 (the rate at step s < warmup_steps is peak * s /
warmup_steps) and ends at `end_ratio` * peak where it ends at all. `step` counts the
optimizer steps taken before the update it scales. Formulas: docs/optimizers.md.

A run too short for its warm-up (a few steps to try a config) still runs: a warm-up that does
not fit in trainer.max_steps (before wsd's decay, for wsd) shrinks to WARMUP_SHARE of the run,
and a decay_steps beyond the run to the run (`fitted`; `fit_note` says so in one line).
`extension_note` says what raising trainer.max_steps changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Literal

import jax.numpy as jnp

from core.registry import ConfigError, Registry
from trainer.ranges import FRACTION, NON_NEGATIVE, Interval, check_ranges

SCHEDULES = Registry("schedule")
_PATH = "optimizer.schedule"


WARMUP_SHARE = 0.1  # a warm-up that does not fit in the run shrinks to this share of it


class _Checked:
  """What every schedule config shares: the checks (ranges; decay_steps against the warm-up),
  and fitting the warm-up (and decay_steps) into a run too short for them."""
  # What a switch to another schedule keeps (end_ratio is a floor in rsqrt, a final value
  # elsewhere: not shared).
  SHARED: ClassVar = ("warmup_steps", "decay_steps")

  def check(self, *, peak: float, total_steps: int):
    del peak, total_steps
    _check(self)

  def warmup_room(self, total_steps: int) -> int:
    """Steps the warm-up may take: the run (wsd: the part before its decay)."""
    return total_steps

  def fitted(self, total_steps: int):
    """This config as a run of `total_steps` uses it (itself when everything fits)."""
    room = self.warmup_room(total_steps)
    if self.warmup_steps <= room:
      return self
    changes: dict[str, Any] = {"warmup_steps": min(room, int(WARMUP_SHARE * total_steps))}
    if (getattr(self, "decay_steps", None) or 0) > total_steps:
      changes["decay_steps"] = None  # the whole run
    return dataclasses.replace(self, **changes)

  def ends(self, total_steps: int) -> str:
    """Where the schedule's length-dependent part lies, in words ('' if it has none)."""
    del total_steps
    return ""


def fit_note(cfg, *, total_steps: int) -> str | None:
  """One line when a run of `total_steps` changes schedule `cfg` (fitted), else None."""
  fitted = cfg.fitted(total_steps)
  if fitted == cfg:
    return None
  room = cfg.warmup_room(total_steps)
  where = "" if room == total_steps else f" ({_steps(room)} before {cfg.kind}'s decay)"
  share = (f"{WARMUP_SHARE:.0%} of the run" if fitted.warmup_steps < room
           else "every step before the decay")
  text = (f"{_PATH}.warmup_steps {cfg.warmup_steps} does not fit in trainer.max_steps "
          f"{total_steps}{where}: the warm-up shrinks to {_steps(fitted.warmup_steps)} ({share})")
  if getattr(fitted, "decay_steps", None) != getattr(cfg, "decay_steps", None):
    text += f", and {_PATH}.decay_steps {cfg.decay_steps} to the end of the run"
  return text


def _steps(n: int) -> str:
  return f"{n} step" if n == 1 else f"{n} steps"


def extension_note(old, new, *, peak: float, old_total: int, new_total: int,
                   at_step: int) -> str:
  """What raising trainer.max_steps from `old_total` to `new_total` (schedule configs `old`
  and `new`) changes in the learning rate of a run continuing from `at_step`."""
  before, after = old.fitted(old_total), new.fitted(new_total)
  lr_before, lr_after = (float(SCHEDULES.build(c, peak=peak, total_steps=t)(at_step))
                         for c, t in ((old, old_total), (new, new_total)))
  parts = []
  if after.ends(new_total) != before.ends(old_total):
    parts.append(f"{after.ends(new_total)} (was: {before.ends(old_total)})")
  if after.warmup_steps != before.warmup_steps:
    parts.append(f"warm-up {after.warmup_steps} steps (was {before.warmup_steps})")
  shape = "; ".join(parts) or "its shape does not depend on trainer.max_steps"
  return (f"learning-rate schedule {new.kind}: {shape}; the learning rate of step "
          f"{at_step + 1} is {lr_after:.3g} (was {lr_before:.3g})")


def _check(cfg) -> None:
  check_ranges(cfg, _PATH)
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
# decay curves: the share of (peak - end) left at progress x of the decay
_SHAPES = {
    "linear": lambda x: 1 - x,
    "cosine": lambda x: 0.5 * (1 + jnp.cos(jnp.pi * x)),
    "1-sqrt": lambda x: 1 - jnp.sqrt(x),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class _DecayConfig(_Checked):
  """The warm-up, then from the peak down to end_ratio * peak until decay_steps, along
  _SHAPES[SHAPE] of the progress (0 -> 1 at the peak, 1 -> 0 at the end)."""
  kind: str = ""
  warmup_steps: int = 100  # linear warm-up from 0 to the peak learning rate (steps)
  decay_steps: int | None = None  # end of the decay, warm-up included (steps); None = max_steps
  end_ratio: float = 0.0  # final learning rate as a fraction of the peak
  RANGES: ClassVar = {**_STEPS, "end_ratio": FRACTION}
  SHAPE: ClassVar = "linear"

  def ends(self, total_steps: int) -> str:
    return f"{self.SHAPE} decay until step {self.decay_steps or total_steps}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmupCosineConfig(_DecayConfig):
  kind: str = "warmup_cosine"
  end_ratio: float = 0.1  # final learning rate as a fraction of the peak
  SHAPE: ClassVar = "cosine"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearConfig(_DecayConfig):
  kind: str = "linear"


@SCHEDULES.register("warmup_cosine", WarmupCosineConfig)
@SCHEDULES.register("linear", LinearConfig)
def decay(*, cfg: _DecayConfig, peak: float, total_steps: int):
  cfg = cfg.fitted(total_steps)
  end, w, shape = peak * cfg.end_ratio, cfg.warmup_steps, _SHAPES[cfg.SHAPE]
  length = (cfg.decay_steps or total_steps) - w
  return _with_warmup(peak, w, lambda s: end + (peak - end) * shape(_progress(s, w, length)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConstantConfig(_Checked):
  kind: str = "constant"
  warmup_steps: int = 0  # linear warm-up from 0 to the learning rate (steps); then constant
  RANGES: ClassVar = {"warmup_steps": NON_NEGATIVE}


@SCHEDULES.register("constant", ConstantConfig)
def constant(*, cfg: ConstantConfig, peak: float, total_steps: int):
  cfg = cfg.fitted(total_steps)
  return _with_warmup(peak, cfg.warmup_steps, lambda s: jnp.full_like(s, peak))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RsqrtConfig(_Checked):
  """Inverse square root: peak / sqrt(1 + (step - W) / timescale) after the warm-up (W =
  max(warmup_steps, 1); the default timescale W gives fairseq's inverse_sqrt, peak *
  sqrt(W / step)), optionally cooled down linearly to 0 over the end of the run (Zhai et al.
  2022, "Scaling Vision Transformers"; big_vision's rsqrt schedule)."""
  kind: str = "rsqrt"
  warmup_steps: int = 100  # linear warm-up from 0 to the peak learning rate (steps)
  # floor of the inverse square root: it never falls below this fraction of the peak (the
  # cooldown, where there is one, scales the floored rate down to 0)
  end_ratio: float = 0.0
  # steps after the warm-up in which the rate falls to peak / sqrt(2); None = max(warmup_steps, 1)
  timescale: int | None = None
  # share of trainer.max_steps, at the end, over which the rate ramps linearly down to 0; 0 = none
  cooldown_fraction: float = 0.0
  RANGES: ClassVar = {"warmup_steps": NON_NEGATIVE, "end_ratio": FRACTION,
                      "timescale": Interval(1), "cooldown_fraction": FRACTION}

  def cooldown_length(self, total_steps: int) -> int:
    return round(self.cooldown_fraction * total_steps)

  def warmup_room(self, total_steps: int) -> int:
    return total_steps - self.cooldown_length(total_steps)

  def ends(self, total_steps: int) -> str:
    length = self.cooldown_length(total_steps)
    return f"cooldown over steps {total_steps - length + 1}-{total_steps}" if length else ""


@SCHEDULES.register("rsqrt", RsqrtConfig)
def rsqrt(*, cfg: RsqrtConfig, peak: float, total_steps: int):
  """max(end, peak / sqrt(1 + (max(step, W) - W) / timescale)) after the warm-up (W =
  max(warmup_steps, 1), timescale None = W: peak * sqrt(W / step)), times (T - step) / L over
  the last L = round(cooldown_fraction * T) steps."""
  cfg = cfg.fitted(total_steps)
  w = max(cfg.warmup_steps, 1)
  timescale, cooldown = cfg.timescale or w, cfg.cooldown_length(total_steps)

  def after(s):
    rate = jnp.maximum(peak * cfg.end_ratio,
                       peak / jnp.sqrt(1 + (jnp.maximum(s, w) - w) / timescale))
    return rate if not cooldown else rate * jnp.clip((total_steps - s) / cooldown, 0.0, 1.0)

  return _with_warmup(peak, cfg.warmup_steps, after)


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

  def warmup_room(self, total_steps: int) -> int:
    return total_steps - self.decay_length(total_steps)

  def ends(self, total_steps: int) -> str:
    return f"decay over steps {total_steps - self.decay_length(total_steps) + 1}-{total_steps}"


@SCHEDULES.register("wsd", WsdConfig)
def wsd(*, cfg: WsdConfig, peak: float, total_steps: int):
  cfg = cfg.fitted(total_steps)
  end, length = peak * cfg.end_ratio, cfg.decay_length(total_steps)
  shape = _SHAPES[cfg.decay_shape]
  return _with_warmup(peak, cfg.warmup_steps, lambda s: end + (peak - end) * shape(
      _progress(s, total_steps - length, length)))
