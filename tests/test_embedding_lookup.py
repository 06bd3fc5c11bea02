"""modules/embedding.py: where the lookup gathers the table's embed side, traced on abstract
meshes (no devices, no compile)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType

from modules.embedding import TokenEmbedding, TokenEmbeddingConfig
from trainer import meshes


def _constraints(sizes: dict[str, int]) -> list:
  """The shardings the token lookup (forward and backward) constrains its table to on a mesh of
  `sizes` under the default rules."""
  mesh = AbstractMesh(tuple(sizes.get(a, 1) for a in meshes.AXES), meshes.AXES,
                      axis_types=(AxisType.Auto,) * len(meshes.AXES))
  module = TokenEmbedding(TokenEmbeddingConfig(), vocab_size=512, dim=64)
  table = {"params": {"embedding": jnp.zeros((512, 64), jnp.float32)}}
  tokens = jnp.zeros((16, 8), jnp.int32)
  grad = jax.grad(lambda p: jnp.sum(module.apply(p, tokens)))
  with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(meshes.DEFAULT_RULES):
    jaxpr = jax.make_jaxpr(grad)(table)
  return [e.params["sharding"] for e in jaxpr.jaxpr.eqns
          if e.primitive.name == "sharding_constraint" and e.invars[0].aval.shape == (512, 64)]


@pytest.mark.parametrize("sizes", [{"fsdp": 8}, {"fsdp": 4, "model": 2},
                                   {"fsdp": 2, "context": 2}])
def test_table_stays_split_where_the_batch_splits_over_embed_axes_alone(sizes):
  """fsdp (x model): the cotangent reaches the table's embed split by one all-to-all; a gathered
  table would hold the whole float32 table and its whole gradient on every device (llm_1b on
  tpu-v5p-128: 1.6 GB more per device)."""
  assert _constraints(sizes) == []


@pytest.mark.parametrize("sizes", [{"data": 2, "fsdp": 2, "model": 2}, {"data": 2, "expert": 4}])
def test_table_is_gathered_where_the_batch_splits_over_more_axes_than_embed(sizes):
  """data x fsdp, data x expert: otherwise XLA replicates the lookup's cotangent whole
  ('Involuntary full rematerialization', tests/test_sharding.py)."""
  shardings = _constraints(sizes)
  assert shardings and all(s.spec[1:] in ((), (None,)) for s in shardings), shardings
