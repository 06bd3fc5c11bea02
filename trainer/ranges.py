"""Allowed ranges of hyperparameters, checked before anything runs.

A config class lists its ranges in a ClassVar `RANGES: {field: Interval}`; `check_ranges`
refuses a value outside its interval (NaN and infinities included) with one line that names
the field, the value and the range; a float also as float32, the precision the steps compute
in (1e308 is inf there, b2=0.99999999999 is 1.0).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from core.registry import ConfigError


@dataclasses.dataclass(frozen=True)
class Interval:
  low: float
  high: float = math.inf
  low_closed: bool = True
  high_closed: bool = False

  def __contains__(self, x: float) -> bool:
    if not math.isfinite(x):
      return False
    above = x >= self.low if self.low_closed else x > self.low
    below = x <= self.high if self.high_closed else x < self.high
    return above and below

  def __str__(self) -> str:
    high = "inf" if self.high == math.inf else f"{self.high:g}"
    return (f"{'[' if self.low_closed else '('}{self.low:g}, {high}"
            f"{']' if self.high_closed else ')'}")


POSITIVE = Interval(0, low_closed=False)
NON_NEGATIVE = Interval(0)
UNIT = Interval(0, 1)  # [0, 1): decay rates of moving averages
FRACTION = Interval(0, 1, high_closed=True)  # [0, 1]


def float32(value: float) -> float:
  """`value` rounded to float32 (inf where it overflows, 0 where it underflows)."""
  with np.errstate(over="ignore", under="ignore"):
    return float(np.float32(value))


def check_ranges(cfg, path: str) -> None:
  """ConfigError for the first field of `cfg` outside its interval, as given or (a float) as
  float32 (None = off, not checked)."""
  for name, interval in type(cfg).RANGES.items():
    value = getattr(cfg, name)
    if value is None:
      continue
    if value not in interval:
      raise ConfigError(f"{path}.{name}: {value} is outside the allowed range {interval}")
    if isinstance(value, float) and float32(value) not in interval:
      raise ConfigError(f"{path}.{name}: {value} is {float32(value):g} in float32, the precision "
                        f"the steps compute in, outside the allowed range {interval}")
