"""Every optimizer kind trains a scanned layer stack as it trains the same layers unrolled.

With `model.scan_layers` the layers' parameters are stacked along a leading `layers` axis. An
optimizer whose update reads a statistic over a whole parameter (a norm, an RMS, Adafactor's
row and column means, a trust ratio) must take it per layer there (trainer/optimizer.py:
per_layer), or the scanned model trains otherwise than the unrolled one. The kinds come from
the registry: a new one is tested here with no list to extend.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from core.registry import registry
from modules import llama
from modules.decoder import MODELS
from tests.test_modules import random_params
from trainer.optimizer import OPTIMIZERS
from trainer.param_axes import logical_axes
from trainer.step import TrainState, train_step

STEPS, ROWS, SEQ = 3, 4, 16
# Fields that turn on more of a kind's statistics than its defaults do, tested besides the
# defaults. Adafactor: factor every matrix of two dimensions of at least 2, so that a stack's
# [layers, embed] norm scales would be factored over the layer axis, were it not set aside.
MORE_STATISTICS = {
    "adafactor": dict(min_dim_size_to_factor=2, multiply_by_parameter_scale=True, momentum=0.5),
}
CASES = [(kind, {}) for kind in OPTIMIZERS.kinds()] + list(MORE_STATISTICS.items())


def _model(scan: bool):
  node = llama.model_node("test")  # 2 layers, dim 64
  node.scan_layers = scan
  model = MODELS.build(MODELS.parse(node, "model"))
  tokens = jnp.zeros((1, SEQ), jnp.int32)
  axes = logical_axes(jax.eval_shape(model.init, jax.random.key(0), tokens)["params"])
  return model, axes


def _stacked(unrolled: dict, num_layers: int) -> dict:
  """The unrolled parameters (layers_0, layers_1, ...) in the scanned layout (layers)."""
  layers = [unrolled[f"layers_{i}"] for i in range(num_layers)]
  out = {k: v for k, v in unrolled.items() if not k.startswith("layers_")}
  out["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  return out


def _train(kind: str, fields: dict, scan: bool, params, batches):
  """(loss of each step, final parameters) of `kind` at its defaults and `fields`."""
  model, axes = _model(scan)
  node = registry("optimizer").node(kind, learning_rate=1e-2,
                                    schedule=registry("schedule").node("constant"), **fields)
  optimizer = OPTIMIZERS.build(OPTIMIZERS.parse(node, "optimizer"), total_steps=STEPS,
                               axes=axes)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=nn.meta.unbox(optimizer.tx.init(params)))
  step = jax.jit(functools.partial(train_step, model=model, optimizer=optimizer))
  losses = []
  for batch in batches:
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return np.array(losses), state.params


@pytest.mark.parametrize("kind,fields", CASES,
                         ids=[k + ("-more" if f else "") for k, f in CASES])
def test_scanned_equals_unrolled(kind, fields):
  unrolled_model, _ = _model(scan=False)
  num_layers = unrolled_model.cfg.num_layers
  params = random_params(unrolled_model, jnp.zeros((1, SEQ), jnp.int32))
  rng = np.random.default_rng(0)
  batches = []
  for _ in range(STEPS):
    tokens = rng.integers(0, 256, (ROWS, SEQ + 1))
    batches.append({"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
                    "weights": jnp.ones((ROWS, SEQ), jnp.float32)})

  want_losses, want = _train(kind, fields, False, params, batches)
  got_losses, got = _train(kind, fields, True, _stacked(params, num_layers), batches)

  np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
  assert want_losses[-1] != want_losses[0]  # the steps moved the parameters
  want = _stacked(want, num_layers)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))
