"""Activation names are declared once (modules/mlp.py:ACTIVATIONS): every ffn kind with an
`activation` field accepts exactly those names, and each name reaches the layer."""

from __future__ import annotations

import dataclasses
import math
import typing

import flax.linen as nn
import jax
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from core.registry import ConfigError
from modules.mlp import ACTIVATIONS, FFN, Activation

WITH_ACTIVATION = [k for k in FFN.kinds()
                   if "activation" in {f.name for f in dataclasses.fields(FFN.entry(k).config_cls)}]
FIELDS = {"moe": {"num_experts": 2, "top_k": 1}}  # what a kind needs beside hidden_dim

# Each activation's formula, written here from its definition (float64, one number at a time).
FORMULAS = {
    "silu": lambda x: x / (1 + math.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi)
                                                    * (x + 0.044715 * x ** 3))),
    "relu": lambda x: max(x, 0.0),
    "relu2": lambda x: max(x, 0.0) ** 2,  # Primer (So et al. 2021): relu(x) squared
}


def layer(kind: str, activation: str):
  node = FFN.node(kind, hidden_dim=16, activation=activation, init_std=1.0,
                  **FIELDS.get(kind, {}))
  return FFN.build(FFN.parse(node, "model.block.ffn"), dim=8)


def test_every_ffn_kind_with_an_activation_takes_the_declared_names():
  assert {"mlp", "moe"} <= set(WITH_ACTIVATION)
  assert typing.get_args(Activation) == tuple(ACTIVATIONS)
  for kind in WITH_ACTIVATION:
    assert typing.get_type_hints(FFN.entry(kind).config_cls)["activation"] == Activation, kind


def test_every_activation_has_a_formula():
  assert set(FORMULAS) == set(ACTIVATIONS)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_each_activation_is_its_formula_in_the_mlp(name, gated):
  """The mlp layer computes act(x W_i) [* (x W_u)] W_o with the activation's formula."""
  x = jax.random.normal(jax.random.key(0), (2, 4, 8))
  node = FFN.node("mlp", hidden_dim=16, activation=name, gated=gated, init_std=1.0)
  mlp = FFN.build(FFN.parse(node, "model.block.ffn"), dim=8)
  params = jax.tree.map(lambda p: np.asarray(p, np.float64),
                        nn.meta.unbox(mlp.init(jax.random.key(1), x)["params"]))
  xs = np.asarray(x, np.float64)
  hidden = np.vectorize(FORMULAS[name])(xs @ params["wi"])
  if gated:
    hidden = hidden * (xs @ params["wu"])
  np.testing.assert_allclose(np.asarray(mlp.apply({"params": params}, x)),
                             hidden @ params["wo"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", WITH_ACTIVATION)
def test_each_activation_reaches_the_layer(kind):
  x = jax.random.normal(jax.random.key(0), (2, 4, 8))
  params = layer(kind, "silu").init(jax.random.key(1), x)
  outputs = {name: np.asarray(layer(kind, name).apply(params, x)) for name in ACTIVATIONS}
  for a in ACTIVATIONS:
    for b in ACTIVATIONS:
      assert a == b or np.abs(outputs[a] - outputs[b]).max() > 1e-4, (kind, a, b)


@pytest.mark.parametrize("kind", WITH_ACTIVATION)
def test_an_unknown_activation_is_refused_with_the_choices(kind):
  with pytest.raises(ConfigError) as e:
    layer(kind, "gelu_tan")
  assert str(e.value) == (f"model.block.ffn.activation: 'gelu_tan' is not one of "
                          f"{', '.join(ACTIVATIONS)} (did you mean 'gelu_tanh'?)")
