"""Each schedule against its formula, written here in plain Python; bad values are refused."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from core.registry import ConfigError, registry
from trainer import schedules
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


def rsqrt_cooled(step, w=10, timescale=30, cooldown=0.0):
  """big_vision's rsqrt (Zhai et al. 2022) as it writes it: 1 / sqrt(1 + (s - w) / timescale)
  after the warm-up, times min(1, (T - s) / L) over the last L = cooldown * T steps."""
  length = round(cooldown * TOTAL)
  ramp = min(1.0, max(TOTAL - step, 0) / length) if length else 1.0
  return warm(step, w, PEAK / math.sqrt(1 + (step - w) / timescale) * ramp)


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
    "rsqrt no warm-up": (dict(warmup_steps=0), lambda s: PEAK / math.sqrt(max(s, 1))),
    "rsqrt timescale": (dict(warmup_steps=10, timescale=30), rsqrt_cooled),
    "rsqrt cooldown": (dict(warmup_steps=10, timescale=30, cooldown_fraction=0.2),
                       lambda s: rsqrt_cooled(s, cooldown=0.2)),
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
    ("rsqrt", dict(timescale=0), 100, "timescale: 0 is outside the allowed range [1, inf)"),
    ("rsqrt", dict(cooldown_fraction=1.5), 100,
     "cooldown_fraction: 1.5 is outside the allowed range [0, 1]"),
])
def test_bad_values_are_refused(kind, fields, total, words):
  prefix = "" if words.startswith("optimizer.") else "optimizer.schedule."
  with pytest.raises(ConfigError, match="^" + re.escape(prefix + words)):
    build(kind, total, **fields)


def parsed(kind: str, **fields):
  return SCHEDULES.parse(registry("schedule").node(kind, **fields), "optimizer.schedule")


# A run shorter than its warm-up (or, for wsd, than its warm-up and decay) runs: the warm-up
# shrinks to a tenth of the run, never past wsd's decay; a decay_steps beyond the run, to it.
SHORT = {
    "cosine 5 steps": ("warmup_cosine", dict(warmup_steps=20), 5,
                       lambda s: cosine(s, w=0, decay=5), "shrinks to 0 steps (10% of the run)"),
    "cosine 50 steps": ("warmup_cosine", dict(warmup_steps=100, decay_steps=200), 50,
                        lambda s: cosine(s, w=5, decay=50),
                        "shrinks to 5 steps (10% of the run), and optimizer.schedule.decay_steps"
                        " 200 to the end of the run"),
    "wsd 20 steps": ("wsd", dict(warmup_steps=100), 20,
                     lambda s: warm(s, 2, PEAK * (1 - math.sqrt(min(max((s - 16) / 4, 0), 1)))),
                     "does not fit in trainer.max_steps 20 (16 steps before wsd's decay): the "
                     "warm-up shrinks to 2 steps (10% of the run)"),
    "wsd overlapping": ("wsd", dict(warmup_steps=50, decay_fraction=0.95), 100,
                        lambda s: warm(s, 5, PEAK * (1 - math.sqrt(min(max((s - 5) / 95, 0), 1)))),
                        "shrinks to 5 steps (every step before the decay)"),
    "constant 3 steps": ("constant", dict(warmup_steps=10), 3, lambda s: PEAK,
                         "shrinks to 0 steps"),
    "rsqrt 10 steps": ("rsqrt", dict(warmup_steps=16), 10, lambda s: rsqrt(s, w=1),
                       "shrinks to 1 step"),
    "rsqrt cooldown 20 steps": ("rsqrt", dict(warmup_steps=18, cooldown_fraction=0.5), 20,
                                lambda s: warm(s, 2, PEAK * math.sqrt(2 / max(s, 2))
                                               * min(1, max(20 - s, 0) / 10)),
                                "(10 steps before rsqrt's decay): the warm-up shrinks to 2"),
}


@pytest.mark.parametrize("case", SHORT)
def test_a_run_shorter_than_its_warmup_shrinks_it(case):
  kind, fields, total, formula, note = SHORT[case]
  schedule = SCHEDULES.build(parsed(kind, **fields), peak=PEAK, total_steps=total)
  steps = range(total + 2)
  np.testing.assert_allclose([float(schedule(np.int32(s))) for s in steps],
                             [formula(s) for s in steps], rtol=1e-6, atol=PEAK * 1e-6)
  text = schedules.fit_note(parsed(kind, **fields), total_steps=total)
  assert text.startswith(f"optimizer.schedule.warmup_steps {fields['warmup_steps']} does not "
                         f"fit in trainer.max_steps {total}") and note in text, text


def test_a_schedule_that_fits_is_left_alone():
  cfg = parsed("warmup_cosine", warmup_steps=20, decay_steps=400)
  assert cfg.fitted(300) is cfg and schedules.fit_note(cfg, total_steps=300) is None
  assert schedules.fit_note(parsed("wsd", warmup_steps=10), total_steps=100) is None


def test_extension_note_names_what_changes():
  cos = parsed("warmup_cosine", warmup_steps=20)
  text = schedules.extension_note(cos, cos, peak=PEAK, old_total=300, new_total=400,
                                  at_step=300)
  # The old schedule had ended (end_ratio 0.1); the new one is at step 300 of its 400.
  assert text == (f"learning-rate schedule warmup_cosine: cosine decay until step 400 (was: "
                  f"cosine decay until step 300); the learning rate of step 301 is "
                  f"{cosine(300, w=20, decay=400):.3g} (was {PEAK * 0.1:.3g})")
  wsd = parsed("wsd", warmup_steps=10)
  assert "decay over steps 321-400 (was: decay over steps 241-300)" in schedules.extension_note(
      wsd, wsd, peak=PEAK, old_total=300, new_total=400, at_step=240)
  cooled = parsed("rsqrt", warmup_steps=10, cooldown_fraction=0.1)
  assert "cooldown over steps 361-400 (was: cooldown over steps 271-300)" in (
      schedules.extension_note(cooled, cooled, peak=PEAK, old_total=300, new_total=400,
                               at_step=300))
  flat = parsed("constant", warmup_steps=0)
  assert "its shape does not depend on trainer.max_steps" in schedules.extension_note(
      flat, flat, peak=PEAK, old_total=10, new_total=20, at_step=10)
