"""QK-norm (attention.norm): each head's queries and keys normalised before RoPE, off by default."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import modules  # noqa: F401  (registers the layer library)
from core.registry import registry
from modules.attention import ATTENTION


def _attention(norm=None, position="rope"):
  r = registry
  node = r("attention").node("attention", num_heads=4, num_kv_heads=2, head_dim=8,
                             position=r("position").node(position), norm=norm)
  return ATTENTION.build(ATTENTION.parse(node, "attention"), dim=32)


def _inputs(scale=1.0):
  x = jax.random.normal(jax.random.key(0), (2, 12, 32)) * scale
  return x, jnp.broadcast_to(jnp.arange(12), (2, 12))


def _params(module, x, pos, seed=1):
  """Random parameters, the norm scales too (so that they are tested), unboxed."""
  params = nn.meta.unbox(module.init(jax.random.key(seed), x, pos, None)["params"])
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(tree, [jax.random.normal(k, v.shape) * 0.3
                                   for k, v in zip(keys, leaves)])


def test_off_by_default_and_the_parameters_are_unchanged():
  off = _attention()
  x, pos = _inputs()
  assert off.cfg.norm is None
  assert set(off.init(jax.random.key(0), x, pos, None)["params"]) == {"q", "k", "v", "o"}
  on = _attention(registry("norm").node("rmsnorm", eps=1e-6))
  params = jax.tree.map(jnp.shape, _params(on, x, pos))
  assert params["q_norm"] == {"scale": (8,)} and params["k_norm"] == {"scale": (8,)}


def test_rmsnorm_of_each_head_before_rope_by_hand():
  """The output equals attention computed by hand: per head q / rms(q) * scale (same for k),
  then RoPE, then causal softmax attention."""
  eps = 1e-6
  module = _attention(registry("norm").node("rmsnorm", eps=eps))
  x, pos = _inputs()
  p = _params(module, x, pos)
  got = module.apply({"params": p}, x, pos, None)

  def rms(y, scale):
    return y / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + eps) * scale

  def rope(y):  # rotate pairs (i, i + K/2) by position * theta^(-2i/K), theta 10000
    half = y.shape[-1] // 2
    angle = np.asarray(pos)[..., None, None] * 10_000.0 ** (-np.arange(half) / half)
    a, b = y[..., :half], y[..., half:]
    return np.concatenate([a * np.cos(angle) - b * np.sin(angle),
                           a * np.sin(angle) + b * np.cos(angle)], axis=-1)

  xs = np.asarray(x, np.float64)
  q = rope(rms(np.einsum("bld,dhk->blhk", xs, p["q"]), p["q_norm"]["scale"]))
  k = rope(rms(np.einsum("bld,dhk->blhk", xs, p["k"]), p["k_norm"]["scale"]))
  v = np.einsum("bld,dhk->blhk", xs, p["v"])
  k, v = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)  # each kv head serves 2 query heads
  logits = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(8)
  logits = np.where(np.tril(np.ones((12, 12), bool)), logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  want = np.einsum("bhqs,bshk,hkd->bqd", weights, v, p["o"])
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-5)


def test_scaled_inputs_scale_the_output_only_through_the_values():
  """With q and k normalised the attention weights ignore the input's scale, so 100 x gives
  100 times the output; without QK-norm the logits grow 10^4-fold and the weights change."""
  x, pos = _inputs()
  for norm, equal in ((registry("norm").node("rmsnorm", eps=1e-6), True), (None, False)):
    module = _attention(norm, position="none")
    p = {"params": _params(module, x, pos)}
    small, big = module.apply(p, x, pos, None), module.apply(p, x * 100, pos, None)
    assert np.allclose(np.asarray(big), 100 * np.asarray(small), rtol=1e-3, atol=1e-3) == equal


def test_on_and_off_from_the_command_line():
  from launcher import config_loading
  from tests.conftest import ROOT
  from trainer import config as config_lib
  tiny = str(ROOT / "configs" / "tiny.py")
  path = "model.block.attention.norm"
  cfg = config_loading.load(tiny, f"--config.{path}.kind=rmsnorm", f"--config.{path}.eps=1e-6")
  assert config_lib.parse(cfg).model.block.attention.norm.eps == 1e-6
  assert config_loading.load(tiny).model.block.attention.norm is None
