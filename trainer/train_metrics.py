"""Training metrics: what each step reports, and how a record sums up the steps since the last.

A training metric is a function of what the step computed (`StepValues`), registered with
`@train_metric(name, *summaries)`. The step (trainer/step.py:train_step) returns its value, a
float32 scalar, under `name`; each of its summaries (`SUMMARIES`) makes one key of the metrics
records, over the steps since the previous record:

    last       `name`             the logged step's own value
    mean       `name_mean`        their mean
    max, min   `name_max`, ...    their largest, smallest value
    fraction   `name_fraction`    the fraction of them where it held (the metric is a flag)

A metric that returns None is off for the run (`z_loss` without trainer.z_loss). What the
modules sow into the "metrics" collection (MoE router statistics, trainer/step.py:sown_means)
is reported the same way under its own names, as the logged step's value.

The loop holds no code of any metric: `Interval` folds each step's values on the device, in one
small compiled program dispatched after the step (no transfer, no wait), and only when a record
is written does `Summed.record` fetch the folded values and finish them (a mean divides by the
step count). A new metric is its function here, its test and its record keys in docs/observe.md
(tests/test_train_metrics.py fails until they are there).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class StepValues:
  """What one train step computed, for its metrics: float32 scalars on the device."""
  loss: jax.Array  # mean token cross-entropy of the step's batch
  aux_loss: jax.Array  # the modules' auxiliary losses (MoE load balancing), means
  z_loss: jax.Array | None  # mean log(Z)^2 of the step's tokens; None without trainer.z_loss
  grad_norm: jax.Array  # global L2 norm of the mean gradient, before clipping
  param_norm: jax.Array  # of the parameters after the step
  update_norm: jax.Array  # of the optimizer's update, before a non-finite step's skip
  learning_rate: jax.Array  # the schedule's value at the step
  clip_norm: float | None  # optimizer.clip_norm: the gradient norm clipped to (None: off)


@dataclasses.dataclass(frozen=True)
class Summary:
  """How a record sums up a metric over its steps: `fold` (so far, this step's value) -> so far,
  on the device; `finish` (the folded value, the step count) -> the record's value, on the
  host. The first step's value is the first "so far"."""
  fold: Callable
  finish: Callable[[float, int], float]


_MEAN = Summary(jnp.add, lambda total, steps: total / steps)
SUMMARIES: dict[str, Summary] = {
    "last": Summary(lambda so_far, x: x, lambda x, steps: x),
    "mean": _MEAN,
    "max": Summary(jnp.maximum, lambda x, steps: x),
    "min": Summary(jnp.minimum, lambda x, steps: x),
    "fraction": _MEAN,  # of a flag, 1.0 where it held
}


@dataclasses.dataclass(frozen=True)
class TrainMetric:
  fn: Callable[[StepValues], jax.Array | None]
  summaries: tuple[str, ...]


TRAIN_METRICS: dict[str, TrainMetric] = {}
_LOOP_KEYS = ("step", "nonfinite")  # the step's flag the loop reads; the record's own step


def record_key(name: str, summary: str) -> str:
  return name if summary == "last" else f"{name}_{summary}"


def record_keys(name: str) -> list[str]:
  """The record keys of a registered metric, one per summary."""
  return [record_key(name, s) for s in TRAIN_METRICS[name].summaries]


def train_metric(name: str, *summaries: str):
  """Registers a function of StepValues (a scalar, a flag, or None: off) as the metric `name`
  with `summaries` (default "last"); a name or record key is refused twice."""
  summaries = summaries or ("last",)
  unknown = [s for s in summaries if s not in SUMMARIES]
  if unknown:
    raise ValueError(f"train metric {name!r}: unknown summary {unknown[0]!r} "
                     f"(summaries: {', '.join(SUMMARIES)})")
  taken = {k for n in TRAIN_METRICS for k in (n, *record_keys(n))} | set(_LOOP_KEYS)
  clash = [k for k in (name, *(record_key(name, s) for s in summaries)) if k in taken]
  if clash:
    raise ValueError(f"train metric {name!r}: the key {clash[0]!r} is taken")
  if len(set(summaries)) < len(summaries):
    raise ValueError(f"train metric {name!r}: a summary is named twice")

  def register(fn: Callable) -> Callable:
    TRAIN_METRICS[name] = TrainMetric(fn, tuple(summaries))
    return fn
  return register


def of_step(values: StepValues, sown: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """{name: float32 value} of every registered metric that is on, then what the modules sowed
  (under jit, in the step)."""
  out = {}
  for name, metric in TRAIN_METRICS.items():
    value = metric.fn(values)
    if value is not None:
      out[name] = jnp.asarray(value, jnp.float32)
  clash = sorted(set(out) & set(sown))
  if clash:
    raise ValueError(f"the modules sow a metric named like a train metric: {clash[0]}")
  return {**out, **sown}


def _summaries(name: str) -> tuple[str, ...]:
  metric = TRAIN_METRICS.get(name)
  return metric.summaries if metric else ("last",)  # sown by the modules


@jax.jit
def _fold(so_far: dict, values: dict) -> dict:
  """so_far {(name, summary): folded} with one more step's `values` {name: value}."""
  return {(name, s): SUMMARIES[s].fold(x, values[name]) for (name, s), x in so_far.items()}


@dataclasses.dataclass
class Summed:
  """The steps of one record: their folded values (device arrays) and how many."""
  last: dict  # {name: the last step's value}
  folded: dict  # {(name, summary): folded value}, summaries other than "last"
  steps: int

  def record(self) -> dict[str, float]:
    """The record's metric entries, fetched from the device (a host sync)."""
    last, folded = jax.device_get((self.last, self.folded))
    out = {}
    for name, value in last.items():
      for s in _summaries(name):
        got = value if s == "last" else folded[name, s]
        out[record_key(name, s)] = SUMMARIES[s].finish(float(got), self.steps)
    return out


class Interval:
  """The metrics of the steps since the last record, folded on the device as they come."""

  def __init__(self):
    self._last: dict | None = None
    self._folded: dict = {}
    self._steps = 0
    self._fold = None  # compiled at the first step, beside the train step

  def add(self, values: dict) -> None:
    """`values`: one step's metrics as the step returned them (device scalars)."""
    if self._last is None:
      self._folded = {(name, s): x for name, x in values.items() for s in _summaries(name)
                      if s != "last"}
    elif self._folded:
      self._folded = self._fold(self._folded, values)
    if self._fold is None and self._folded:
      self._fold = _fold.lower(self._folded, values).compile()
    self._last, self._steps = values, self._steps + 1

  def take(self) -> Summed:
    """The steps so far, summed; the next step starts a new interval."""
    summed = Summed(self._last or {}, self._folded, self._steps)
    self._last, self._folded, self._steps = None, {}, 0
    return summed


# -- the metrics ------------------------------------------------------------------------------

# The step's own values, as the logged step's; grad_norm also as the largest since the last record.
for _field, *_its in (("loss",), ("aux_loss",), ("z_loss",), ("grad_norm", "last", "max"),
                      ("param_norm",), ("update_norm",), ("learning_rate",)):
  train_metric(_field, *_its)(operator.attrgetter(_field))
del _field, _its


@train_metric("grad_clipped", "fraction")
def grad_clipped(v: StepValues):
  """Whether the clip scaled the gradient down (its norm above optimizer.clip_norm)."""
  return None if v.clip_norm is None else v.grad_norm > v.clip_norm
