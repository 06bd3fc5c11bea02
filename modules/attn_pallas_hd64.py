"""`pallas_hd64` attention: a Pallas TPU flash-attention kernel of our own for head_dim 64.

Every recipe of ours from 125m to llm_1b has head_dim 64, where a kernel that tiles one head at a
time (splash: [positions, 64] tiles) half-fills the TPU's 128 lanes and needs the inputs
transposed to a heads-major layout. This one takes two heads a block, in the layer's own
[B, L, H, 64] layout (a [bq, 128] tile per pair of heads), with the blocks that nobody sees
skipped and the mask computed only on the blocks that need it: the layout, tables and grids
are in modules/attn_pallas_hd64_kernels.py, the two forms of the products (FORMS, chosen by
`attention.pallas_products`) in modules/attn_pallas_hd64_transposed.py (the default: the
64-wide products computed transposed, a head's 64 rows streamed through the MXU) and
modules/attn_pallas_hd64_padded.py (every product 128 lanes wide, half of it discarded). This
file sets them up, differentiates them (jax.custom_vjp: the forward kernel keeps each query's
log-sum-exp, one backward kernel gives dQ, dK and dV) and shards them.

What it takes, and refuses in one line (ConfigError) when tracing: head_dim 64; an even number of
query heads (on each device, where heads are sharded); a length that its blocks divide (blocks
of `attention.pallas_block_q` queries and `pallas_block_kv` keys, multiples of 128, each clipped
to the length). It declares packed documents (segment ids) and the sliding window (a mask option:
modules/masks.py:Spec.within and Spec.blocks, masks.BLOCKS), not the logit soft cap, context
parallelism or decoding (a decode step runs `xla`: attn_registry.REFERENCE). GQA: a pair of query
heads that share a kv head (G dividing H into an even number of query heads per kv head) reads
that head twice over, side by side in one tile (a [B, L, G x 128] copy of the keys and values);
an odd number per kv head (above one) gets each kv head repeated to every query head it serves.
Off TPU the kernels run in Pallas interpret mode (slow: for tests).

A Pallas kernel cannot be partitioned by the compiler, so under a mesh it runs under
`jax.shard_map` as splash does: each device gets its slice of the batch (`act_batch`) and heads
(`act_heads`); when the kv heads cannot be split as the query heads are, each query head gets its
own copy of its kv head first.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from core.registry import ConfigError
from modules import attn_pallas_hd64_kernels as kernels
from modules import context, masks
from modules.attn_pallas_hd64_padded import PADDED
from modules.attn_pallas_hd64_transposed import TRANSPOSED
from modules.attn_registry import IMPLEMENTATIONS, Supports
from modules.masks import Mask

NAME = "pallas_hd64"
FORMS = {form.name: form for form in (TRANSPOSED, PADDED)}  # attention.pallas_products


def block(length: int, block_size: int, what: str) -> int:
  """`block_size` clipped to `length`, which it must divide (and the 128 lanes it)."""
  b = min(block_size, length)
  if length % b or b % kernels.LANES:
    raise ConfigError(f"attention.implementation={NAME}: the length {length} must be a multiple "
                      f"of the block {b} (attention.{what}, clipped to the length), and the block "
                      f"of {kernels.LANES}")
  return b


def layout(cfg, *, batch: int, length: int, heads: int, kv_heads: int, head_dim: int,
           segments: bool, interpret: bool) -> tuple[kernels.Layout, int]:
  """(the kernels' Layout, how many times each kv head is repeated side by side) of one
  device's call; ConfigError (one line) for what the kernels cannot take."""
  if head_dim != kernels.HEAD_DIM:
    raise ConfigError(f"attention.implementation={NAME} takes head_dim {kernels.HEAD_DIM} (two "
                      f"heads fill the TPU's {kernels.LANES} lanes), not {head_dim}; use splash")
  if heads % 2:
    raise ConfigError(f"attention.implementation={NAME} attends two query heads a block: it "
                      f"needs an even number of them on each device, not {heads}; use splash")
  group = heads // kv_heads
  if group == 1:  # pair p reads kv heads 2p, 2p+1: unit p
    repeat, units, per_unit = 1, heads // 2, 1
  elif group % 2 == 0:  # pair p shares kv head p // (group / 2), twice over: unit of that head
    repeat, units, per_unit = 2, kv_heads, group // 2
  else:  # every query head its own copy of its kv head
    repeat, units, per_unit = group, heads // 2, 1
  lay = kernels.Layout(batch=batch, length=length, pairs=heads // 2, units=units,
                       per_unit=per_unit, bq=block(length, cfg.pallas_block_q, "pallas_block_q"),
                       bkv=block(length, cfg.pallas_block_kv, "pallas_block_kv"),
                       spec=masks.Spec.of(cfg), segments=segments, interpret=interpret)
  if lay.vmem_bytes(4) > kernels.VMEM_CAP:
    raise ConfigError(f"attention.implementation={NAME}: sequences of {length} positions need "
                      f"more than the {kernels.VMEM_CAP >> 20} MiB of VMEM its backward pass "
                      f"may take (it holds the gradients of the whole length); use splash")
  return lay, repeat


# The kernels' calls, traced once per layout and form (both static, compared by value): every
# layer of a model calls them with the same shapes, and tracing a Pallas call is most of an
# attention layer's trace (llm_1b's 16 layers: a quarter of its train step's). Inside the step's
# program the calls are inlined: the same kernels.
_forward = jax.jit(kernels.forward, static_argnums=(0, 1))
_backward = jax.jit(kernels.backward, static_argnums=(0, 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attend(lay, form, tabs, q2, k2, v2, seg_col, seg_row):
  return _forward(lay, form, tabs, q2, k2, v2, seg_col, seg_row)[0]


def _attend_fwd(lay, form, tabs, q2, k2, v2, seg_col, seg_row):
  out, lse = _forward(lay, form, tabs, q2, k2, v2, seg_col, seg_row)
  return out, (tabs, q2, k2, v2, seg_col, seg_row, out, lse)


def _attend_bwd(lay, form, residuals, do2):
  tabs, q2, k2, v2, seg_col, seg_row, out, lse = residuals
  b, length = q2.shape[:2]
  di = jnp.sum((out.astype(jnp.float32) * do2.astype(jnp.float32)).reshape(
      b, length, lay.pairs, 2, kernels.HEAD_DIM), axis=-1).transpose(0, 2, 3, 1)
  dq2, dk2, dv2 = _backward(lay, form, tabs, q2, k2, v2, seg_col, seg_row, lse, do2, di)
  return None, dq2, dk2, dv2, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def _local(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, cfg, *, interpret: bool):
  """One device's rows and heads: the kernels on [B, L, H, 64] queries (already scaled)."""
  b, length, h, k = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  lay, repeat = layout(cfg, batch=b, length=length, heads=h, kv_heads=g, head_dim=k,
                       segments=segment_ids_BxL is not None, interpret=interpret)
  if repeat > 1:
    k_BxLxGxK, v_BxLxGxK = (jnp.repeat(a, repeat, axis=2) for a in (k_BxLxGxK, v_BxLxGxK))
  seg_col = seg_row = None
  if segment_ids_BxL is not None:
    ids = segment_ids_BxL.astype(jnp.int32)
    seg_col = jnp.broadcast_to(ids[:, :, None], (b, length, kernels.LANES))
    seg_row = jnp.broadcast_to(ids[:, None, :], (b, kernels.SUBLANES, length))
  tabs = kernels.tables(lay, segment_ids_BxL)
  q2, k2, v2 = (a.reshape(b, length, -1) for a in (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK))
  return _attend(lay, FORMS[cfg.pallas_products], tabs, q2, k2, v2, seg_col, seg_row).reshape(
      b, length, h, k)


@IMPLEMENTATIONS.register(NAME, Supports(segments=True, context=None, decode=False,
                                         masks=masks.BLOCKS, native="tpu"))
def pallas_hd64_attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, mask: Mask, cfg):
  """Attention (softmax scale 64**-0.5) of [B, L, H, 64] queries over G kv heads under
  `mask.spec`, packed documents kept apart by `mask.segment_ids_BxL` ([B, L] ints, or None);
  returns [B, L, H, 64]."""
  if mask.explicit_Bx1xLxS is not None:
    raise ValueError(f"{NAME} attends by segment ids and its mask options, not explicit masks")
  segment_ids_BxL = mask.segment_ids_BxL
  b, _, h, k = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  mesh = jax.sharding.get_abstract_mesh()
  local = functools.partial(_local, cfg=cfg, interpret=context.platform(mesh) != "tpu")
  # 64**-0.5 is a power of two: scaling the queries in their own dtype is exact.
  q = (q_BxLxHxK * k ** -0.5).astype(q_BxLxHxK.dtype)
  if mesh.empty:
    return local(q, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL)
  batch = context.mesh_axes("act_batch", b, mesh)
  heads = context.mesh_axes("act_heads", h, mesh)
  if heads is not None and context.mesh_axes("act_heads", g, mesh) is None:
    k_BxLxGxK, v_BxLxGxK = (jnp.repeat(a, h // g, axis=2) for a in (k_BxLxGxK, v_BxLxGxK))
  split_as = jax.P(batch, None, heads, None)
  segments_as = jax.P(batch, None) if segment_ids_BxL is not None else None
  return jax.shard_map(local, in_specs=(split_as, split_as, split_as, segments_as),
                       out_specs=split_as, axis_names=context.free_axes(mesh),
                       check_vma=False)(q, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL)
