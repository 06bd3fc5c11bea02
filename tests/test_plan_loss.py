"""The chunked cross-entropy (trainer.loss_chunk_size) equals the whole-sequence loss."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs.tiny
from modules import llama
from modules.decoder import MODELS
from trainer import config as config_lib
from trainer.step import loss_sums


@pytest.mark.parametrize("tied", [False, True])
def test_chunked_loss_and_gradients_match_unchunked(tied):
  cfg = configs.tiny.get_config()
  cfg.model = llama.model_node("test")  # 2 layers, dim 64, byte vocabulary
  cfg.model.tie_embeddings = tied
  model = MODELS.build(config_lib.parse(cfg).model)
  b, length = 2, 64
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 256, (b, length)), jnp.int32)
  batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1),
           "weights": jnp.asarray(rng.random((b, length)) > 0.2, jnp.float32)}
  params = jax.jit(model.init)(jax.random.key(0), tokens)["params"]

  def loss(chunk):
    fn = functools.partial(loss_sums, model=model, compute_dtype=jnp.float32,
                           loss_chunk_size=chunk)
    return jax.jit(jax.value_and_grad(lambda p: fn(p, batch)[0]))(params)

  (whole, grads), (chunked, chunked_grads) = loss(0), loss(16)
  np.testing.assert_allclose(chunked, whole, rtol=1e-5)
  for a, c in zip(jax.tree.leaves(grads), jax.tree.leaves(chunked_grads)):
    # Chunks sum in another order: equal to 1e-5 of the gradient's scale.
    np.testing.assert_allclose(c, a, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(a))))
  assert float(whole) > 0
