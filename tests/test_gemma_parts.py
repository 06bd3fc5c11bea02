"""Gemma's layer options, each a field of the component that owns it, against its formula written
out in NumPy: RMSNorm's (1 + w) (`rmsnorm.scale_offset`), embeddings times sqrt(dim)
(`token.scale_by_sqrt_dim`), norms after each branch (`pre_norm.post_norms`), logits scaled by
query_pre_attn_scalar**-0.5 (`attention.query_pre_attn_scalar`), the final logits soft-capped
(`decoder_lm.final_logit_softcap`) and Gemma 3's linearly scaled RoPE (`rope.linear_factor`). Each
is off by default, adding no parameter."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from core.registry import ConfigError, registry
from modules import llama
from modules.decoder import MODELS

R = registry


def build(reg: str, node, **inputs):
  return R(reg).build(R(reg).parse(node, reg), **inputs)


def random_like(tree, seed=1, scale=0.5):
  """Random arrays of the shapes of `tree` (boxed or not, arrays or shapes)."""
  leaves, treedef = jax.tree.flatten(nn.meta.unbox(tree))
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape) * scale
                                      for k, x in zip(keys, leaves)])


X = jax.random.normal(jax.random.key(0), (2, 6, 16)) * 3


def test_rmsnorm_scale_offset_multiplies_by_offset_plus_the_scale():
  norm = build("norm", R("norm").node("rmsnorm", eps=1e-6, scale_offset=1.0), dim=16)
  fresh = norm.init(jax.random.key(0), X)
  assert np.all(np.asarray(nn.meta.unbox(fresh)["params"]["scale"]) == 0)  # 1 + 0: identity
  params = random_like(fresh)
  x = np.asarray(X, np.float64)
  want = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * (1 + params["params"]["scale"])
  np.testing.assert_allclose(norm.apply(params, X), want, rtol=1e-5)
  plain = build("norm", R("norm").node("rmsnorm", eps=1e-6), dim=16)
  np.testing.assert_allclose(plain.apply(params, X), want / (1 + params["params"]["scale"])
                             * params["params"]["scale"], rtol=1e-4, atol=1e-5)
  with pytest.raises(ConfigError, match="rmsnorm.scale_offset must be a finite number"):
    build("norm", R("norm").node("rmsnorm", scale_offset=float("nan")), dim=16)


def test_token_embedding_scaled_by_sqrt_dim_and_its_tied_head_not():
  tokens = jnp.array([[3, 1, 4], [1, 5, 9]])
  emb = build("embedding", R("embedding").node("token", scale_by_sqrt_dim=True),
              vocab_size=10, dim=16)
  params = emb.init(jax.random.key(0), tokens)
  table = np.asarray(nn.meta.unbox(params)["params"]["embedding"])
  np.testing.assert_allclose(emb.apply(params, tokens), table[np.asarray(tokens)] * 4.0)
  np.testing.assert_allclose(emb.apply(params, X, method="attend"),
                             np.einsum("bld,vd->blv", np.asarray(X), table), rtol=1e-5,
                             atol=1e-6)


def _block(post_norms: bool):
  node = llama.model_node("test").block
  node.post_norms = post_norms
  node.attention.position = R("position").node("none")
  return build("block", node, dim=64)


def test_post_norms_normalise_each_branch_before_the_residual():
  x = jax.random.normal(jax.random.key(0), (2, 6, 64))
  pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
  block = _block(True)
  params = random_like(jax.eval_shape(block.init, jax.random.key(0), x, pos, None))["params"]
  assert {"attention_post_norm", "ffn_post_norm"} <= set(params)
  assert not {"attention_post_norm", "ffn_post_norm"} & set(
      jax.eval_shape(_block(False).init, jax.random.key(0), x, pos, None)["params"])

  def rms(y, scale):
    return y / np.sqrt(np.mean(y * y, -1, keepdims=True) + 1e-5) * scale

  branch = lambda name, cls, h: jax.jit(cls.apply)({"params": params[name]}, h, pos, None) if (
      name == "attention") else jax.jit(cls.apply)({"params": params[name]}, h)
  plain = _block(False)
  attention = R("attention").build(plain.cfg.attention, dim=64)
  ffn = R("ffn").build(plain.cfg.ffn, dim=64)
  h = x + rms(np.asarray(branch("attention", attention,
                                rms(x, params["attention_norm"]["scale"]))),
              params["attention_post_norm"]["scale"])
  want = h + rms(np.asarray(branch("ffn", ffn, rms(h, params["ffn_norm"]["scale"]))),
                 params["ffn_post_norm"]["scale"])
  got = jax.jit(lambda p: block.apply({"params": p}, x, pos, None))(params)
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_query_pre_attn_scalar_scales_the_logits_by_its_inverse_square_root():
  node = R("attention").node("attention", num_heads=4, num_kv_heads=2, head_dim=8,
                             position=R("position").node("none"), query_pre_attn_scalar=2.0)
  attention = build("attention", node, dim=16)
  pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
  p = random_like(jax.eval_shape(attention.init, jax.random.key(0), X, pos, None))["params"]
  x = np.asarray(X, np.float64)
  q, k, v = (np.einsum("bld,dhk->blhk", x, p[n]) for n in ("q", "k", "v"))
  k, v = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
  logits = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(2.0)  # not sqrt(head_dim) = sqrt(8)
  logits = np.where(np.tril(np.ones((6, 6), bool)), logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  want = np.einsum("bhqs,bshk,hkd->bqd", w / w.sum(-1, keepdims=True), v, p["o"])
  np.testing.assert_allclose(jax.jit(attention.apply)({"params": p}, X, pos, None), want,
                             rtol=1e-4, atol=1e-4)
  with pytest.raises(ConfigError, match="query_pre_attn_scalar must be a positive number"):
    build("attention", R("attention").node("attention", num_heads=4, position=R(
        "position").node("none"), query_pre_attn_scalar=0.0), dim=16)


@pytest.mark.parametrize("tied", [False, True])
def test_final_logit_softcap_caps_every_logit_and_keeps_the_pad_ids_out(tied):
  tokens = jnp.array([[5, 17, 99, 3], [1, 2, 3, 4]])
  node = llama.model_node("test")
  node.vocab_size, node.tie_embeddings = 200, tied  # 56 pad ids (of 256 rows)
  plain = MODELS.build(MODELS.parse(node, "model"))
  params = random_like(jax.eval_shape(plain.init, jax.random.key(0), tokens), scale=2.0)
  node.final_logit_softcap = 3.0
  capped = MODELS.build(MODELS.parse(node, "model"))
  want = np.asarray(jax.jit(plain.apply)(params, tokens))[..., :200]
  got = np.asarray(jax.jit(capped.apply)(params, tokens))
  assert np.abs(want).max() > 6  # the cap bites
  np.testing.assert_allclose(got[..., :200], 3.0 * np.tanh(want / 3.0), rtol=1e-5, atol=1e-5)
  assert np.all(got[..., 200:] == np.finfo(got.dtype).min)
  chunked = jax.jit(lambda p: (lambda x, head: head.logits(x))(  # a chunked loss's head
      *capped.apply(p, tokens, head=False)))
  np.testing.assert_allclose(chunked(params), got, rtol=1e-6)


def test_rope_linear_factor_divides_the_positions():
  """RoPE with factor 4 at positions 4p is plain RoPE at positions p (HF's rope_type linear)."""
  q = jax.random.normal(jax.random.key(1), (2, 6, 4, 16))
  pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
  scaled = build("position", R("position").node("rope", theta=500.0, linear_factor=4.0),
                 head_dim=16)
  plain = build("position", R("position").node("rope", theta=500.0), head_dim=16)
  np.testing.assert_allclose(scaled.apply({}, q, q, 4 * pos)[0], plain.apply({}, q, q, pos)[0],
                             rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(scaled.apply({}, q, q, pos)[0])
                - np.asarray(plain.apply({}, q, q, pos)[0])).max() > 0.1
  with pytest.raises(ConfigError, match="rope.linear_factor must be a finite number > 0"):
    build("position", R("position").node("rope", linear_factor=0.0), head_dim=16)
