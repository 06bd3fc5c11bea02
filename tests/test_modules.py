"""Layer-level properties: RoPE (plain and LLaMA-3 scaled), causality, shapes, scan vs unrolled."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from modules import llama
from modules.decoder import MODELS
from modules.position import POSITIONS
from modules.registry import ConfigError, registry


def _position(kind, head_dim=64, **values):
  cfg = POSITIONS.parse(registry("position").node(kind, **values), "position")
  return POSITIONS.build(cfg, head_dim=head_dim)


def _meta_llama3_scaling(freqs, *, factor, low, high, original):
  """Meta's reference `apply_scaling` (llama-models, llama3/reference_impl/model.py), per frequency."""
  out = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < original / high:
      out.append(freq)
    elif wavelen > original / low:
      out.append(freq / factor)
    else:
      smooth = (original / wavelen - low) / (high - low)
      out.append((1 - smooth) * freq / factor + smooth * freq)
  return np.array(out)


def test_rope_llama3_matches_meta_reference():
  head_dim, theta = 64, 500_000.0
  rope = _position("rope_llama3", head_dim, theta=theta, factor=32.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position=8192)
  plain = theta ** -(np.arange(0, head_dim, 2) / head_dim)
  expected = _meta_llama3_scaling(plain, factor=32.0, low=1.0, high=4.0, original=8192)
  got = np.asarray(rope.inv_freq())
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # all three bands are exercised at this head_dim
  assert (got == np.float32(plain)).any() and (got < plain / 31).any()
  assert ((got > plain / 31) & (got < plain * 0.999)).any()


@pytest.mark.parametrize("kind", ["rope", "rope_llama3"])
def test_rope_dot_product_depends_only_on_offset(kind):
  rope = _position(kind, 16)
  key = jax.random.key(0)
  q = jax.random.normal(key, (1, 1, 1, 16))
  k = jax.random.normal(jax.random.key(1), (1, 1, 1, 16))

  def score(pq, pk):
    rq, _ = rope(q, q, jnp.array([[pq]]))
    rk, _ = rope(k, k, jnp.array([[pk]]))
    return float(jnp.sum(rq * rk))

  base = score(7, 3)
  for shift in (1, 50, 1000):
    assert score(7 + shift, 3 + shift) == pytest.approx(base, abs=1e-4)
  assert abs(score(8, 3) - base) > 1e-3  # the offset itself does change it


def test_rope_needs_even_head_dim():
  with pytest.raises(ConfigError, match="even head_dim"):
    _position("rope_llama3", 15)


def test_llama32_rows_use_scaled_rope_and_others_do_not():
  assert llama.model_node("1b").block.attention.position.kind == "rope_llama3"
  assert llama.model_node("3b").block.attention.position.factor == 32.0
  for name in ("7b", "8b", "70b"):
    assert llama.model_node(name).block.attention.position.kind == "rope"
