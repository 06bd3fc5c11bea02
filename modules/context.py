"""Context parallelism: each sequence's positions split over the mesh axes of `act_length`.

Which mesh axes those are (the `context` axis in trainer/meshes.py) comes from the logical
rules and the mesh in force (`jax.set_mesh`), as in modules/attn_splash.py; with none, or one of
size 1, nothing here changes the computation.

Layout. Under the causal mask the last positions of a sequence see the most keys. Cut into
2C chunks of L/(2C) positions, shard i of C holds chunks i and 2C-1-i (the "zig-zag" layout of
load-balanced ring/striped attention): every shard then has the same number of visible
(query, key) pairs, so a kernel that skips masked blocks (splash) does equal work on each.
`modules/decoder.py:DecoderLM` puts its tokens, positions and segment ids in this order
(`zigzag`) and its final hidden states back (`unzigzag`): RoPE and the loss see the true
positions, and everything between the two is per position except attention.

Attention. Each shard keeps its queries and all-gathers keys, values and segment ids over the
context axes inside `jax.shard_map` (the gradient of the gather is a reduce-scatter), then
attends with the implementation, if it declares `Context.GATHERED` (modules/attn_registry.py:
`xla`, `chunked`, `dot_product`), under an explicit mask: the layer's mask options
(modules/masks.py:Spec) over the original indices of the shard's queries and of the gathered
keys, and their segments: exactly the mask of the unsplit sequence.
An implementation that declares `Context.OWN` (`splash`) splits the work itself. Costs per
layer and shard: the keys and values of the whole sequence (2 x L x kv_heads x head_dim), and
[L/C, L] logits.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core.registry import ConfigError


def mesh_axes(logical: str, size: int, mesh) -> tuple[str, ...] | None:
  """The mesh axes that `logical` maps to, or None (replicated) if they do not divide `size`."""
  axes = nn.logical_to_mesh_axes((logical,))[0]
  names = (axes,) if isinstance(axes, str) else tuple(axes or ())
  names = tuple(a for a in names if a in mesh.shape)
  shards = 1
  for a in names:
    shards *= mesh.shape[a]
  return names if names and size % shards == 0 else None


def platform(mesh) -> str:
  """The platform a program is traced for: the abstract mesh's devices' (a compile-only TPU
  topology included), else JAX's default backend. A Pallas TPU kernel runs natively only on
  "tpu" (in interpret mode elsewhere)."""
  device = getattr(mesh, "abstract_device", None)
  return device.platform if device is not None else jax.default_backend()


def free_axes(mesh) -> set[str]:
  """The mesh axes not already manual: those of a shard_map inside another one (a pipeline
  stage, modules/pipeline.py) on the other axes."""
  return set(mesh.axis_names) - set(mesh.manual_axes)


def split(logical: str) -> tuple[tuple[str, ...], int]:
  """(mesh axes, shard count) that the logical rules and mesh in force split `logical` over:
  the axes of more than one device; ((), 1) when not split."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return (), 1
  axes = nn.logical_to_mesh_axes((logical,))[0]
  names = (axes,) if isinstance(axes, str) else tuple(axes or ())
  names = tuple(a for a in names if a in mesh.shape and mesh.shape[a] > 1)
  count = 1
  for a in names:
    count *= mesh.shape[a]
  return names, count


def shards() -> tuple[tuple[str, ...], int]:
  """(mesh axes, shard count) of sequence positions in force; ((), 1) when not split."""
  return split("act_length")


def check_length(length: int, count: int) -> None:
  if length % (2 * count):
    raise ConfigError(f"context parallelism over {count} shards cuts each sequence into "
                      f"2 x {count} chunks: the length {length} must be a multiple of "
                      f"{2 * count}")


def zigzag_order(length: int, count: int) -> np.ndarray:
  """[length] original indices in the load-balanced layout: shard i holds chunks i, 2C-1-i."""
  check_length(length, count)
  c = length // (2 * count)
  chunks = [k for i in range(count) for k in (i, 2 * count - 1 - i)]
  return np.concatenate([np.arange(k * c, (k + 1) * c) for k in chunks])


def zigzag(x_BxL, count: int):
  """[B, L, ...] in the natural order -> the load-balanced layout (axis 1)."""
  return jnp.take(x_BxL, zigzag_order(x_BxL.shape[1], count), axis=1)


def unzigzag(x_BxL, count: int):
  """The inverse of `zigzag`."""
  return jnp.take(x_BxL, np.argsort(zigzag_order(x_BxL.shape[1], count)), axis=1)


def attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, *, spec, attend):
  """`attend(q, k, v, mask)` on each context shard's queries against the gathered keys.

  Inputs are in the layout of `zigzag`, positions split over the context axes; `attend` takes
  [B, Q, H, K] queries, [B, S, G, K] keys and values and a [B or 1, 1, Q, S] boolean mask,
  `spec`'s (a modules/masks.py:Spec) over the original indices.
  """
  mesh = jax.sharding.get_abstract_mesh()
  axes, count = shards()
  b, length, h, _ = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  order = zigzag_order(length, count)
  local = length // count
  batch = mesh_axes("act_batch", b, mesh)
  heads = mesh_axes("act_heads", h, mesh)
  if heads is not None and mesh_axes("act_heads", g, mesh) is None:
    # Fewer kv heads than head shards: every query head gets its own copy of its kv head.
    k_BxLxGxK = jnp.repeat(k_BxLxGxK, h // g, axis=2)
    v_BxLxGxK = jnp.repeat(v_BxLxGxK, h // g, axis=2)

  def shard(q, k, v, segment_ids):
    k = jax.lax.all_gather(k, axes, axis=1, tiled=True)  # [b, L, g, K] in the layout's order
    v = jax.lax.all_gather(v, axes, axis=1, tiled=True)
    q_index = jax.lax.dynamic_slice_in_dim(jnp.asarray(order), jax.lax.axis_index(axes) * local,
                                           local)
    keys = None
    if segment_ids is not None:
      keys = jax.lax.all_gather(segment_ids, axes, axis=1, tiled=True)
    return attend(q, k, v, spec.dense(q_index[None], order[None], segment_ids, keys))

  split_as = jax.P(batch, axes, heads, None)
  segments_as = jax.P(batch, axes) if segment_ids_BxL is not None else None
  return jax.shard_map(shard, in_specs=(split_as, split_as, split_as, segments_as),
                       out_specs=split_as, axis_names=free_axes(mesh), check_vma=False)(
                           q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL)
