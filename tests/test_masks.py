"""modules/masks.py: each form of a layer's mask (the splash kernel's masks, the KV cache's slots,
the keys per query and (query, key) pairs the FLOP model and the plan count) agrees with the one
rule, `Spec.visible`, for every mask option at its test value (tests/test_attention_impls.py:
OPTION_VALUES) and every combination of them: a new option whose rule a form leaves out fails
here with no test of its own to write."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from modules import masks
from tests.test_attention_impls import OPTION_VALUES

OPTIONS = [f.name for f in dataclasses.fields(masks.Spec)]
SPECS = [masks.Spec(**{o: OPTION_VALUES[o] for o in chosen})
         for n in range(len(OPTIONS) + 1) for chosen in itertools.combinations(OPTIONS, n)]
LENGTHS = (1, 7, 16, 47, 48, 100, 130)  # around the test values: whole, cut and single chunks


def _seen(spec: masks.Spec, length: int) -> np.ndarray:
  index = np.arange(length)
  return np.asarray(spec.visible(index, index))


def test_every_option_has_a_test_value():
  assert set(OPTIONS) <= set(OPTION_VALUES) and len(SPECS) == 2 ** len(OPTIONS)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_pairs_span_and_cache_slots_are_the_rules(spec):
  """visible_pairs counts the pairs `visible` admits, span the most keys of a query, and the
  KV cache's ring of cache_slots slots holds every key a query sees (position p in slot p mod
  slots: a key is still there while fewer than `slots` positions came after it)."""
  for length in LENGTHS:
    seen = _seen(spec, length)
    assert spec.visible_pairs(length) == int(seen.sum()), length
    assert spec.span(length) == int(seen.sum(1).max()), length
    slots = spec.cache_slots(length)
    q, k = np.nonzero(seen)
    assert slots <= length and (q - k < slots).all(), (length, slots)


@pytest.mark.parametrize("spec", [s for s in SPECS
                                  if all(getattr(s, o) == getattr(masks.Spec(), o)
                                         for o in OPTIONS if o not in masks.SPLASH)], ids=str)
def test_the_splash_masks_are_the_rule_at_every_offset(spec):
  """The splash kernel's mask for a block of queries `offset` past their keys' first (a context
  shard's chunk, modules/attn_splash.py) is `visible` over those indices."""
  keys = 256
  for queries, offset in ((256, 0), (64, 0), (64, 64), (64, 160), (32, 224)):
    mask = spec.splash((queries, keys), offset=offset)
    got = np.asarray(mask[0:queries, 0:keys])
    want = np.asarray(spec.visible(np.arange(queries) + offset, np.arange(keys)))
    np.testing.assert_array_equal(got, want, err_msg=f"{queries} queries at {offset}")
