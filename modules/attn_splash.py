"""`splash` attention: JAX's Pallas TPU flash-attention kernel, sharded over batch and heads.

The kernel (jax.experimental.pallas.ops.tpu.splash_attention) computes causal attention of one
sequence over [heads, length, head_dim], skipping the key blocks the mask hides (causal, or
local with a sliding window: modules/masks.py:Spec.splash), with packed documents as segment
ids, and G < H kv heads served natively (query head h reads kv head h // (H/G)). A Pallas kernel cannot be partitioned by the compiler, so it runs under
`jax.shard_map`: each device gets its slice of the batch (`act_batch`) and heads (`act_heads`),
mapped to mesh axes by flax's logical rules and the mesh set with `jax.set_mesh`, and loops
over its rows with vmap. Off TPU the kernel runs in Pallas interpret mode (slow: for tests).

The kernel's whole setup is in this file: `block_sizes` (its tiles, from
`attention.splash_block_size`) and `_kernel` (its mask and `make_splash_mha`), which gets the
layer's AttentionConfig as every implementation does. It declares packed documents, context
parallelism (its own: `_context_kernel`, laid out by `check_context`) and the mask options its
masks express (masks.SPLASH); it cannot attend under a KV cache's mask, so a decode step runs
`xla` in its place (attn_registry.REFERENCE).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as sa

from core.registry import ConfigError
from modules import context, masks
from modules.attn_registry import IMPLEMENTATIONS, Context, Supports
from modules.masks import Mask

LANES = 128  # the kernel's key blocks are multiples of the TPU's 128 lanes


# Keys per step of the kernel's inner loop. Measured on one v5e chip (2026-12-05, fwd + bwd of
# 125m's and 1b's attention, packed rows, seq 2048): blocks of 1024 queries and keys computed 512
# keys at a time, with the fused backward kernel (dq, dk and dv in one pass), took 2.23 / 11.5 ms
# where 512-blocks with separate dq and dkv kernels took 2.82 / 15.6 ms; 2048-blocks do not fit
# the kernel's VMEM.
KV_COMPUTE = 512


def block_sizes(length: int, block: int, *, kv_length: int | None = None) -> sa.BlockSizes:
  """`block` (clipped to the lengths) for queries and keys, forward and backward, keys computed
  KV_COMPUTE at a time; one fused backward kernel."""
  kv_length = length if kv_length is None else kv_length
  bq, bkv = min(block, length), min(block, kv_length)
  if length % bq or bq % LANES or kv_length % bkv or bkv % LANES:
    raise ConfigError(f"attention.implementation=splash: the length {length} must be a multiple"
                      f" of the block {bq} (splash_block_size, clipped to the length), and the "
                      f"block of {LANES}")
  compute = math.gcd(bkv, KV_COMPUTE)
  return sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=compute, block_q_dkv=bq,
                       block_kv_dkv=bkv, block_kv_dkv_compute=compute,
                       use_fused_bwd_kernel=True)


def check_context(cfg, *, length: int, count: int) -> None:
  """Under context parallelism over `count` shards each kernel call takes one chunk of
  length / (2 x count) queries (modules/context.py's layout): it must hold whole blocks."""
  block = cfg.splash_block_size
  context.check_length(length, count)
  chunk = length // (2 * count)
  b = min(block, chunk)
  if chunk % LANES or chunk % b:
    need = (f"a multiple of {LANES} (the kernel's lanes)" if chunk % LANES else
            f"a multiple of attention.splash_block_size={block}")
    raise ConfigError(f"attention.implementation=splash with context parallelism over {count} "
                      f"shards: each shard attends in chunks of length / (2 x {count}) = {chunk} "
                      f"positions, which must be {need}; lengthen the sequence, use fewer "
                      f"context shards or change attention.splash_block_size")


def _kernel(q_BxHxQxK, k_BxGxSxK, v_BxGxSxK, segment_ids_BxQ, kv_segment_ids_BxS, cfg, *,
            spec: masks.Spec, interpret: bool, offset: int = 0):
  """The kernel on local arrays: `spec`'s mask for each local head (query i at index
  i + offset among the keys), vmapped over the rows; blocks of `cfg.splash_block_size`;
  `cfg.logit_softcap` caps the (pre-scaled) logits, cap * tanh(logits / cap), inside it."""
  _, h, q_length, _ = q_BxHxQxK.shape
  kv_length = k_BxGxSxK.shape[2]
  mask = sa.MultiHeadMask([spec.splash((q_length, kv_length), offset=offset)] * h)
  blocks = block_sizes(q_length, cfg.splash_block_size, kv_length=kv_length)
  kernel = sa.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                              attn_logits_soft_cap=cfg.logit_softcap, interpret=interpret)
  if segment_ids_BxQ is None:
    return jax.vmap(kernel)(q_BxHxQxK, k_BxGxSxK, v_BxGxSxK)
  return jax.vmap(lambda q, k, v, s, t: kernel(q, k, v, segment_ids=sa.SegmentIds(s, t)))(
      q_BxHxQxK, k_BxGxSxK, v_BxGxSxK, segment_ids_BxQ, kv_segment_ids_BxS)


def _context_kernel(q_BxHxQxK, k_BxGxQxK, v_BxGxQxK, segment_ids_BxQ, cfg, *, spec, axes,
                    count: int, interpret: bool):
  """One context shard: its two chunks of queries (zig-zag layout) against the gathered keys.

  Keys, values and their segment ids are all-gathered and put back in the natural order; each
  chunk of queries then sees the keys by `spec` from its own original index (the mask offset
  by the chunk's start). The offsets are static per shard, so every shard's pair of kernels is
  built and the shard's own chosen by its index (lax.switch).
  """
  gather = lambda x, axis: jax.lax.all_gather(x, axes, axis=axis, tiled=True)
  length = q_BxHxQxK.shape[2] * count
  natural = np.argsort(context.zigzag_order(length, count))
  k, v = gather(k_BxGxQxK, 2)[:, :, natural], gather(v_BxGxQxK, 2)[:, :, natural]
  kv_segments = None if segment_ids_BxQ is None else gather(segment_ids_BxQ, 1)[:, natural]
  c = length // (2 * count)

  def branch(i):
    def run(q, k, v, segments, kv_segments):
      outs = []
      for half, chunk in enumerate((i, 2 * count - 1 - i)):
        part = slice(half * c, (half + 1) * c)
        outs.append(_kernel(q[:, :, part], k, v,
                            None if segments is None else segments[:, part], kv_segments, cfg,
                            spec=spec, interpret=interpret, offset=chunk * c))
      return jnp.concatenate(outs, axis=2)
    return run

  return jax.lax.switch(jax.lax.axis_index(axes), [branch(i) for i in range(count)],
                        q_BxHxQxK, k, v, segment_ids_BxQ, kv_segments)


@IMPLEMENTATIONS.register("splash", Supports(segments=True, context=Context.OWN, decode=False,
                                             options=("logit_softcap",), masks=masks.SPLASH,
                                             native="tpu"),
                          check_context=check_context)
def splash_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, mask: Mask, cfg):
  """Attention (softmax scale K**-0.5) of [B, L, H, K] queries over G kv heads under
  `mask.spec`, packed documents kept apart by `mask.segment_ids_BxL` ([B, L] ints, or None);
  returns [B, L, H, K]. Under context parallelism (modules/context.py) the inputs are in its
  layout."""
  if mask.explicit_Bx1xLxS is not None:
    raise ValueError("splash attends under its own masks by segment ids, not explicit masks")
  segment_ids_BxL, spec = mask.segment_ids_BxL, mask.spec
  b, _, h, k = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  mesh = jax.sharding.get_abstract_mesh()
  q = (q_BxLxHxK * k ** -0.5).astype(q_BxLxHxK.dtype).transpose(0, 2, 1, 3)
  kk, v = k_BxLxGxK.transpose(0, 2, 1, 3), v_BxLxGxK.transpose(0, 2, 1, 3)
  interpret = context.platform(mesh) != "tpu"
  if mesh.empty:
    return _kernel(q, kk, v, segment_ids_BxL, segment_ids_BxL, cfg, spec=spec,
                   interpret=interpret).transpose(0, 2, 1, 3)
  batch = context.mesh_axes("act_batch", b, mesh)
  heads = context.mesh_axes("act_heads", h, mesh)
  if heads is not None and context.mesh_axes("act_heads", g, mesh) is None:
    # Fewer kv heads than head shards: every query head gets its own copy of its kv head.
    kk, v = jnp.repeat(kk, h // g, axis=1), jnp.repeat(v, h // g, axis=1)
  axes, count = context.shards()
  if count > 1:
    check_context(cfg, length=q.shape[2], count=count)
    attend = functools.partial(_context_kernel, cfg=cfg, spec=spec, axes=axes, count=count,
                               interpret=interpret)
  else:
    axes = None
    attend = lambda q, kk, v, s: _kernel(q, kk, v, s, s, cfg, spec=spec, interpret=interpret)
  split_as = jax.P(batch, heads, axes, None)
  segments_as = jax.P(batch, axes) if segment_ids_BxL is not None else None
  out = jax.shard_map(attend, in_specs=(split_as, split_as, split_as, segments_as),
                      out_specs=split_as,
                      axis_names=context.free_axes(mesh), check_vma=False)(
                          q, kk, v, segment_ids_BxL)
  return out.transpose(0, 2, 1, 3)
