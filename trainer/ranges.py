"""Allowed ranges of hyperparameters, checked before anything runs.

A config class lists its ranges in a ClassVar `RANGES: {field: Interval}`; `check_ranges`
refuses a value outside its interval (NaN and infinities included) with one line that names
the field, the value and the range.
"""

from __future__ import annotations

import dataclasses
import math

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


def check_ranges(cfg, path: str) -> None:
  """ConfigError for the first field of `cfg` outside its interval (None = off, not checked)."""
  for name, interval in type(cfg).RANGES.items():
    value = getattr(cfg, name)
    if value is not None and value not in interval:
      raise ConfigError(f"{path}.{name}: {value} is outside the allowed range {interval}")
