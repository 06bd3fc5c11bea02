"""Splash attention: JAX's Pallas TPU flash-attention kernel, sharded over batch and heads.

The kernel (jax.experimental.pallas.ops.tpu.splash_attention) computes causal attention of one
sequence over [heads, length, head_dim], skipping the key blocks the causal mask hides, with
packed documents as segment ids, and G < H kv heads served natively (query head h reads kv head
h // (H/G)). A Pallas kernel cannot be partitioned by the compiler, so it runs under
`jax.shard_map`: each device gets its slice of the batch (`act_batch`) and heads (`act_heads`),
mapped to mesh axes by flax's logical rules and the mesh set with `jax.set_mesh`, and loops
over its rows with vmap. Off TPU the kernel runs in Pallas interpret mode (slow: for tests).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa

from core.registry import ConfigError

LANES = 128  # the kernel's key blocks are multiples of the TPU's 128 lanes


def block_sizes(length: int, block: int) -> sa.BlockSizes:
  """`block` (clipped to the length) for queries and keys, forward and backward."""
  b = min(block, length)
  if length % b or b % LANES:
    raise ConfigError(f"attention.implementation=splash: the length {length} must be a multiple"
                      f" of the block {b} (splash_block_size, clipped to the length), and the "
                      f"block of {LANES}")
  return sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                       block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)


def _kernel(q_BxHxLxK, k_BxGxLxK, v_BxGxLxK, segment_ids_BxL, *, block: int, interpret: bool):
  """The kernel on local arrays: one causal mask per local head, vmapped over the rows."""
  _, h, length, _ = q_BxHxLxK.shape
  mask = sa.MultiHeadMask([sa.CausalMask((length, length))] * h)
  kernel = sa.make_splash_mha(mask, block_sizes=block_sizes(length, block), head_shards=1,
                              q_seq_shards=1, interpret=interpret)
  if segment_ids_BxL is None:
    return jax.vmap(kernel)(q_BxHxLxK, k_BxGxLxK, v_BxGxLxK)
  return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=sa.SegmentIds(s, s)))(
      q_BxHxLxK, k_BxGxLxK, v_BxGxLxK, segment_ids_BxL)


def _mesh_axes(logical: str, size: int, mesh) -> str | tuple | None:
  """The mesh axes that `logical` maps to, or None (replicated) if they do not divide `size`."""
  axes = nn.logical_to_mesh_axes((logical,))[0]
  names = (axes,) if isinstance(axes, str) else tuple(axes or ())
  names = tuple(a for a in names if a in mesh.shape)
  shards = 1
  for a in names:
    shards *= mesh.shape[a]
  return names if names and size % shards == 0 else None


def splash_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, *, block: int):
  """Causal attention (softmax scale K**-0.5) of [B, L, H, K] queries over G kv heads, packed
  documents kept apart by `segment_ids_BxL` ([B, L] ints, or None); returns [B, L, H, K]."""
  b, _, h, k = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  mesh = jax.sharding.get_abstract_mesh()
  device = getattr(mesh, "abstract_device", None)
  platform = device.platform if device is not None else jax.default_backend()
  q = (q_BxLxHxK * k ** -0.5).astype(q_BxLxHxK.dtype).transpose(0, 2, 1, 3)
  kk, v = k_BxLxGxK.transpose(0, 2, 1, 3), v_BxLxGxK.transpose(0, 2, 1, 3)
  attend = lambda q, kk, v, s: _kernel(q, kk, v, s, block=block, interpret=platform != "tpu")
  if mesh.empty:
    return attend(q, kk, v, segment_ids_BxL).transpose(0, 2, 1, 3)
  batch = _mesh_axes("act_batch", b, mesh)
  heads = _mesh_axes("act_heads", h, mesh)
  if heads is not None and _mesh_axes("act_heads", g, mesh) is None:
    # Fewer kv heads than head shards: every query head gets its own copy of its kv head.
    kk, v = jnp.repeat(kk, h // g, axis=1), jnp.repeat(v, h // g, axis=1)
  spec = jax.P(batch, heads, None, None)
  seg_spec = jax.P(batch, None) if segment_ids_BxL is not None else None
  out = jax.shard_map(attend, in_specs=(spec, spec, spec, seg_spec), out_specs=spec,
                      check_vma=False)(q, kk, v, segment_ids_BxL)
  return out.transpose(0, 2, 1, 3)
