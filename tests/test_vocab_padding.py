"""Vocabulary padding (model.vocab_multiple): pad rows change shapes, never the loss.

The padded model, given the unpadded model's weights in its real rows and noise in its pad
rows, has the same loss and the same gradients on the real weights, whether the LM head is
tied or not and whether the cross-entropy runs whole or in chunks; the pad rows get no
gradient through the loss. Tensor parallelism over GPT-2's 50,257 ids: tests/test_ep_sharding.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from core.registry import ConfigError
from modules import llama
from modules.decoder import MODELS
from tests.test_modules import random_params
from trainer.step import loss_sums

VOCAB, PADDED, SEQ = 200, 256, 16


def _model(tied: bool, multiple: int):
  node = llama.model_node("test")
  node.vocab_size, node.vocab_multiple, node.tie_embeddings = VOCAB, multiple, tied
  return MODELS.build(MODELS.parse(node, "model"))


def _pad(params, rng):
  """The unpadded tree with noise rows (head columns) appended up to PADDED."""
  out = dict(params)
  table = params["embedding"]["embedding"]
  out["embedding"] = {"embedding": jnp.concatenate(
      [table, rng.normal(0, 3, (PADDED - VOCAB, table.shape[1])).astype(np.float32)])}
  if "head" in params:
    out["head"] = jnp.concatenate(
        [params["head"], rng.normal(0, 3, (params["head"].shape[0], PADDED - VOCAB)
                                    ).astype(np.float32)], axis=1)
  return out


def _close(got, want):
  """Equal up to float32 reordering: the padded softmax sums over more (zero) terms."""
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(want))))


@pytest.mark.parametrize("tied,chunk", [(False, 0), (True, 8)])  # whole logits; chunked loss
def test_padded_loss_and_gradients_equal_the_unpadded(tied, chunk):
  rng = np.random.default_rng(0)
  plain, padded = _model(tied, 1), _model(tied, 128)
  assert padded.cfg.padded_vocab_size == PADDED and plain.cfg.padded_vocab_size == VOCAB
  tokens = rng.integers(0, VOCAB, (2, SEQ + 1))
  batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
           "weights": jnp.ones((2, SEQ), jnp.float32)}
  params = random_params(plain, batch["inputs"])
  padded_params = _pad(params, rng)

  def loss(model, p):
    return loss_sums(p, batch, model=model, compute_dtype=jnp.float32, loss_chunk_size=chunk)[0]

  want, want_grads = jax.jit(jax.value_and_grad(functools.partial(loss, plain)))(params)
  got, got_grads = jax.jit(jax.value_and_grad(functools.partial(loss, padded)))(padded_params)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  _close(got_grads["embedding"]["embedding"][:VOCAB], want_grads["embedding"]["embedding"])
  if tied:  # the tied table's pad rows are logits only: masked
    assert np.all(got_grads["embedding"]["embedding"][VOCAB:] == 0)
  else:
    _close(got_grads["head"][:, :VOCAB], want_grads["head"])
    assert np.all(got_grads["head"][:, VOCAB:] == 0)
    assert np.all(got_grads["embedding"]["embedding"][VOCAB:] == 0)  # never looked up
  for a, b in zip(jax.tree.leaves(got_grads["layers"]), jax.tree.leaves(want_grads["layers"])):
    _close(a, b)


def test_logits_of_pad_ids_are_the_lowest_float():
  model = _model(False, 128)
  tokens = jnp.zeros((1, 4), jnp.int32)
  params = random_params(model, tokens)
  logits = np.asarray(jax.jit(model.apply)({"params": params}, tokens))
  assert logits.shape == (1, 4, PADDED)
  assert np.all(logits[..., VOCAB:] == np.finfo(np.float32).min)
  assert np.all(np.isfinite(logits[..., :VOCAB])) and np.all(logits[..., :VOCAB] > -1e6)


@pytest.mark.parametrize("multiple", [0, -128])
def test_vocab_multiple_must_be_positive(multiple):
  node = llama.model_node("test")
  node.vocab_multiple = multiple
  with pytest.raises(ConfigError, match="model.vocab_multiple must be positive"):
    MODELS.build(MODELS.parse(node, "model"))
