"""Each schedule against its formula, written here in plain Python; bad values are refused."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from core.registry import ConfigError, registry
from trainer.schedules import SCHEDULES

PEAK, TOTAL = 2e-3, 100


def build(kind: str, total: int = TOTAL, **fields):
  cfg = SCHEDULES.parse(registry("schedule").node(kind, **fields), "optimizer.schedule")
  return SCHEDULES.build(cfg, peak=PEAK, total_steps=total)


def warm(step: int, w: int, after: float) -> float:
  return PEAK * step / w if step < w else after


def cosine(step, w=10, decay=TOTAL, end=0.1):
  t = min(max((step - w) / (decay - w), 0), 1)
  return warm(step, w, PEAK * end + PEAK * (1 - end) * (1 + math.cos(math.pi * t)) / 2)


def linear(step, w=10, decay=TOTAL, end=0.0):
  t = min(max((step - w) / (decay - w), 0), 1)
  return warm(step, w, PEAK - (PEAK - PEAK * end) * t)


def rsqrt(step, w=16, end=0.0):
  return warm(step, w, max(PEAK * end, PEAK / math.sqrt(max(step, w) / w)))


def wsd(step, w=10, fraction=0.2, shape="1-sqrt", end=0.0):
  start = TOTAL - TOTAL * fraction
  x = min(max((step - start) / (TOTAL * fraction), 0), 1)
  f = {"linear": 1 - x, "cosine": (1 + math.cos(math.pi * x)) / 2, "1-sqrt": 1 - math.sqrt(x)}
  return warm(step, w, PEAK * end + (PEAK - PEAK * end) * f[shape])


STEPS = [0, 1, 5, 9, 10, 11, 37, 64, 80, 81, 90, 99, 100, 150]
CASES = {
    "warmup_cosine": (dict(warmup_steps=10), cosine),
    "warmup_cosine decay_steps": (dict(warmup_steps=10, decay_steps=60, end_ratio=0.25),
                                  lambda s: cosine(s, decay=60, end=0.25)),
    "constant": (dict(warmup_steps=10), lambda s: warm(s, 10, PEAK)),
    "constant no warm-up": (dict(warmup_steps=0), lambda s: PEAK),
    "linear": (dict(warmup_steps=10), linear),
    "linear end": (dict(warmup_steps=10, decay_steps=50, end_ratio=0.5),
                   lambda s: linear(s, decay=50, end=0.5)),
    "rsqrt": (dict(warmup_steps=16), rsqrt),
    "rsqrt floor": (dict(warmup_steps=16, end_ratio=0.45), lambda s: rsqrt(s, end=0.45)),
    "wsd 1-sqrt": (dict(warmup_steps=10), wsd),
    "wsd linear": (dict(warmup_steps=10, decay_shape="linear", decay_fraction=0.5, end_ratio=0.1),
                   lambda s: wsd(s, shape="linear", fraction=0.5, end=0.1)),
    "wsd cosine": (dict(warmup_steps=10, decay_shape="cosine", decay_fraction=0.3),
                   lambda s: wsd(s, shape="cosine", fraction=0.3)),
}


@pytest.mark.parametrize("case", CASES)
def test_schedule_matches_formula(case):
  fields, formula = CASES[case]
  schedule = build(case.split()[0], **fields)
  got = [float(schedule(np.int32(s))) for s in STEPS]
  want = [formula(s) for s in STEPS]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=PEAK * 1e-6)  # float32 rounding


def test_every_schedule_is_tested():
  assert {case.split()[0] for case in CASES} == set(SCHEDULES.kinds())


@pytest.mark.parametrize("kind,fields,total,words", [
    ("warmup_cosine", dict(warmup_steps=101), 100,
     "optimizer.schedule.warmup_steps: 101 is longer than trainer.max_steps 100"),
    ("constant", dict(warmup_steps=-1), 100, "optimizer.schedule.warmup_steps: -1 is outside"),
    ("warmup_cosine", dict(warmup_steps=20, decay_steps=10), 100,
     "optimizer.schedule.decay_steps: 10 is shorter than warmup_steps 20"),
    ("linear", dict(warmup_steps=20, decay_steps=19), 100, "decay_steps: 19 is shorter"),
    ("warmup_cosine", dict(end_ratio=1.5), 100,
     "end_ratio: 1.5 is outside the allowed range [0, 1]"),
    ("wsd", dict(decay_fraction=0.0), 100,
     "decay_fraction: 0.0 is outside the allowed range (0, 1]"),
    ("wsd", dict(decay_fraction=1.2), 100,
     "decay_fraction: 1.2 is outside the allowed range (0, 1]"),
    ("wsd", dict(decay_fraction=float("nan")), 100, "decay_fraction: nan is outside"),
    ("wsd", dict(warmup_steps=50, decay_fraction=0.6), 100,
     "decay_fraction: 0.6 of trainer.max_steps 100 is 60 decay steps, which overlap"),
])
def test_bad_values_are_refused(kind, fields, total, words):
  prefix = "" if words.startswith("optimizer.") else "optimizer.schedule."
  with pytest.raises(ConfigError, match="^" + re.escape(prefix + words)):
    build(kind, total, **fields)
