"""The Pallas TPU kernels of `pallas_hd64` attention (modules/attn_pallas_hd64.py): flash
attention forward and backward for head_dim 64, two heads a block. This file holds what both
forms of the products share (`Form`: modules/attn_pallas_hd64_padded.py and
modules/attn_pallas_hd64_transposed.py): the layout, the block tables, the grids and the
kernels' skeletons.

Layout. Queries, outputs and their gradients stay in the layer's [B, L, H x 64] layout (a free
reshape of [B, L, H, 64]): a block of `bq` positions of a pair of heads is a [bq, 128] tile
that fills the TPU's 128 lanes, head 0 of the pair in lanes 0-63 and head 1 in 64-127, so no
transpose to a heads-major layout is needed and no tile is half empty. Keys and values come as
[B, L, U x 128], U units of two kv heads' lanes (modules/attn_pallas_hd64.py arranges GQA so that
the pair p of query heads finds its kv heads in unit p // per_unit, at the same lanes).

Logits. Each head's logits are a product with a 128-wide contraction: the pair's tile with the
other head's lanes set to zero against the whole tile of the other side (the MXU is 128 x 128;
a 64-deep contraction fills half of it either way, and this needs no lane shifts).

Blocks. The grid walks blocks of `bq` queries by `bkv` keys; tables in SMEM (scalar prefetch,
`tables`) say per block whether nobody sees it (skipped, and its DMA pointed at a block that is
loaded anyway), everybody sees it (no mask computed: inside one document, below the diagonal and
within the window) or some do (the mask of modules/masks.py:Spec.within and the segment ids).

Forward: grid (B, pairs, q blocks, kv blocks), online softmax in VMEM; it writes the output and
the log-sum-exp per query and head ([B, pairs, 2, L] float32). Backward (one kernel, as splash's
fused one): grid (B, kv units, pairs of the unit, kv blocks, q blocks); it recomputes the
probabilities with keys on sublanes ([bkv, bq]: the log-sum-exp and the rows' sums of out x dout
are rows) and accumulates dK and dV of the unit and dQ of the pair in float32 VMEM over the whole
length, written once, at the end of what each sums.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from modules import masks

HEAD_DIM = 64
LANES = 128  # a pair of heads
SUBLANES = 8
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: exp(MASK_VALUE - m) is 0, not NaN
SKIP, FULL, PARTIAL = 0, 1, 2  # a block: nobody sees it, everybody does, some do
NT = (((1,), (1,)), ((), ()))  # a @ b.T
# VMEM a kernel may reserve: v5e has 128 MiB a core (its default limit, 16 MiB, is too little
# for the backward's accumulators over 2048 positions beside 512-blocks).
VMEM_CAP = 100 * 2 ** 20


@dataclasses.dataclass(frozen=True)
class Layout:
  """The static shape of one call: `batch` rows of `length` positions, `pairs` pairs of query
  heads, `units` units of kv lanes, `per_unit` pairs reading each unit; blocks of `bq` queries
  and `bkv` keys; the mask options; packed documents or not; Pallas interpret mode or not."""
  batch: int
  length: int
  pairs: int
  units: int
  per_unit: int
  bq: int
  bkv: int
  spec: masks.Spec
  segments: bool
  interpret: bool

  @property
  def nq(self) -> int:
    return self.length // self.bq

  @property
  def nk(self) -> int:
    return self.length // self.bkv

  def vmem_bytes(self, itemsize: int) -> int:
    """An upper estimate of the backward kernel's VMEM (the forward's is smaller): float32
    accumulators and double-buffered outputs over the whole length, double-buffered input tiles,
    and a dozen [bkv, bq] float32 temporaries."""
    whole = self.length * LANES * 3 * (4 + 2 * itemsize)
    tiles = 2 * LANES * (2 * self.bq + 2 * self.bkv) * itemsize + 2 * 4 * LANES * (
        self.bq + self.bkv)
    return whole + tiles + 12 * 4 * self.bq * self.bkv


class ForwardRefs(NamedTuple):
  """The forward kernel's refs. qseg and kseg: the segment ids of the q block and kv block in
  the orientation of the form's logits (None without packed documents)."""
  q: Any
  k: Any
  v: Any
  qseg: Any
  kseg: Any
  o: Any
  lse: Any
  m: Any
  l: Any
  acc: Any


class BackwardRefs(NamedTuple):
  """The backward kernel's refs: kseg [bkv, 128] and qseg [8, bq] (None without documents)."""
  q: Any
  k: Any
  v: Any
  do: Any
  lse: Any
  di: Any
  kseg: Any
  qseg: Any
  dq: Any
  dk: Any
  dv: Any
  dq_acc: Any
  dk_acc: Any
  dv_acc: Any


@dataclasses.dataclass(frozen=True)
class Form:
  """How a form of the kernels computes a block: (lay, i, j, masked, refs) steps, the writes at
  the end of what they sum, and their VMEM scratch (lay -> shapes). `keys_on_sublanes`: the
  forward's logits are [bkv, bq] (segment ids: the keys' lane-replicated, the queries' sublane-
  replicated), else [bq, bkv]."""
  name: str
  keys_on_sublanes: bool
  forward_step: Callable[..., None]
  forward_end: Callable[..., None]
  forward_scratch: Callable[[Layout], list]
  backward_step: Callable[..., None]
  backward_write_q: Callable[..., None]  # (lay, refs): dQ of the pair
  backward_write_kv: Callable[..., None]  # (lay, refs): dK and dV of the unit
  backward_scratch: Callable[[Layout], list]


def _nearest(seen):
  """[..., n] booleans -> [..., n] int32: each index where `seen`, else the last seen index
  before it, else the first after it (0 where none is seen): the block to load at each step."""
  n = seen.shape[-1]
  index = jnp.arange(n, dtype=jnp.int32)
  before = lax.cummax(jnp.where(seen, index, -1), axis=seen.ndim - 1)
  after = lax.cummin(jnp.where(seen, index, n), axis=seen.ndim - 1, reverse=True)
  return jnp.where(before >= 0, before, jnp.where(after < n, after, 0)).astype(jnp.int32)


def tables(lay: Layout, segment_ids_BxL):
  """(kind [B, nq, nk]: SKIP, FULL or PARTIAL; the kv block to load at forward step (i, j)
  [B, nq, nk]; the q block to load at backward step (j, i) [B, nk, nq]), int32, flattened for
  SMEM. Positions by modules/masks.py:Spec.blocks; documents by each block's range of segment
  ids (disjoint ranges: nobody sees the block; one id on both sides: the documents mask none)."""
  q_first = np.arange(lay.nq)[:, None] * lay.bq
  k_first = np.arange(lay.nk)[None] * lay.bkv
  some, every = (jnp.asarray(np.broadcast_to(a, (lay.nq, lay.nk)))[None] for a in lay.spec.blocks(
      q_first, q_first + lay.bq - 1, k_first, k_first + lay.bkv - 1))
  if segment_ids_BxL is not None:
    q_lo, q_hi = (f(segment_ids_BxL.reshape(lay.batch, lay.nq, lay.bq), axis=-1)[:, :, None]
                  for f in (jnp.min, jnp.max))
    k_lo, k_hi = (f(segment_ids_BxL.reshape(lay.batch, lay.nk, lay.bkv), axis=-1)[:, None, :]
                  for f in (jnp.min, jnp.max))
    some = some & (q_lo <= k_hi) & (k_lo <= q_hi)
    every = every & (q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo)
  shape = (lay.batch, lay.nq, lay.nk)
  some, every = jnp.broadcast_to(some, shape), jnp.broadcast_to(every, shape)
  kind = jnp.where(some, jnp.where(every, FULL, PARTIAL), SKIP).astype(jnp.int32)
  return (kind.reshape(-1), _nearest(some).reshape(-1),
          _nearest(some.transpose(0, 2, 1)).reshape(-1))


def dot(a, b, dims=(((1,), (0,)), ((), ()))):
  """a @ b (or by `dims`) in float32. Operands narrower than float32 multiply at the MXU's own
  precision whatever jax_default_matmul_precision says (Mosaic takes no float32 contraction of
  bfloat16 operands); float32 ones follow it."""
  precision = lax.Precision.DEFAULT if a.dtype.itemsize < 4 else None
  return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def first_head(rows: int):
  """[rows, 128] booleans: the lanes of the pair's first head."""
  return lax.broadcasted_iota(jnp.int32, (rows, LANES), 1) < HEAD_DIM


def tile_lanes(x, lanes: int):
  """[rows, 128] lane-replicated values -> [rows, lanes] (lanes a multiple of 128)."""
  return x if lanes == LANES else jnp.tile(x, (1, lanes // LANES))


def keys_major_seen(lay: Layout, i, j, qseg_ref, kseg_ref):
  """[bkv, bq] booleans of a PARTIAL block, keys on sublanes: Spec.within on the indices, and
  one document where there are segment ids (kseg_ref [bkv, 128], qseg_ref [8, bq])."""
  shape = (lay.bkv, lay.bq)
  seen = lay.spec.within(i * lay.bq + lax.broadcasted_iota(jnp.int32, shape, 1),
                         j * lay.bkv + lax.broadcasted_iota(jnp.int32, shape, 0))
  if qseg_ref is not None:
    seen = seen & (qseg_ref[:1, :] == tile_lanes(kseg_ref[...], lay.bq))
  return seen


def backward_scores(r: BackwardRefs, h: int, own, q, k, v, do, seen):
  """Head h's probabilities and their gradient, both [bkv, bq] float32 (keys on sublanes): the
  logits recomputed from the head's lanes of k and v (`own`; the other head's zeroed), masked
  where `seen` is given, exponentiated against the forward's log-sum-exp; dS = P (dP - di)."""
  zeros = jnp.zeros_like(k)
  s_t = dot(jnp.where(own, k, zeros), q, NT)
  if seen is not None:
    s_t = jnp.where(seen, s_t, MASK_VALUE)
  p_t = jnp.exp(s_t - r.lse[h:h + 1, :])
  dp_t = dot(jnp.where(own, v, zeros), do, NT)
  return p_t, p_t * (dp_t - r.di[h:h + 1, :])


def _forward_kernel(kind_ref, kv_at_ref, q_at_ref, *refs, lay: Layout, form: Form):
  """One (row, pair, q block i, kv block j) step of the forward pass."""
  del kv_at_ref, q_at_ref
  if not lay.segments:
    refs = (*refs[:3], None, None, *refs[3:])
  r = ForwardRefs(*refs)
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  kind = kind_ref[(b * lay.nq + i) * lay.nk + j]

  @pl.when(j == 0)
  def _init():
    r.m[...] = jnp.full(r.m.shape, -jnp.inf, jnp.float32)
    r.l[...] = jnp.zeros(r.l.shape, jnp.float32)
    r.acc[...] = jnp.zeros(r.acc.shape, jnp.float32)

  for value, masked in ((FULL, False), (PARTIAL, True)):
    pl.when(kind == value)(functools.partial(form.forward_step, lay, i, j, masked, r))
  pl.when(j == lay.nk - 1)(functools.partial(form.forward_end, lay, r))


def _backward_kernel(kind_ref, kv_at_ref, q_at_ref, *refs, lay: Layout, form: Form):
  """One (row, kv unit, pair of the unit s, kv block j, q block i) step of the backward pass:
  dK and dV of the unit accumulate over its pairs and the q blocks, dQ of the pair over the kv
  blocks, each written at the end of what it sums."""
  del kv_at_ref, q_at_ref
  if not lay.segments:
    refs = (*refs[:6], None, None, *refs[6:])
  r = BackwardRefs(*refs)
  b, s, j, i = pl.program_id(0), pl.program_id(2), pl.program_id(3), pl.program_id(4)
  kind = kind_ref[(b * lay.nq + i) * lay.nk + j]
  pair_starts = (j == 0) & (i == 0)

  @pl.when(pair_starts & (s == 0))
  def _init_unit():
    r.dk_acc[...] = jnp.zeros(r.dk_acc.shape, jnp.float32)
    r.dv_acc[...] = jnp.zeros(r.dv_acc.shape, jnp.float32)

  @pl.when(pair_starts)
  def _init_pair():
    r.dq_acc[...] = jnp.zeros(r.dq_acc.shape, jnp.float32)

  for value, masked in ((FULL, False), (PARTIAL, True)):
    pl.when(kind == value)(functools.partial(form.backward_step, lay, i, j, masked, r))
  pair_ends = (j == lay.nk - 1) & (i == lay.nq - 1)
  pl.when(pair_ends)(functools.partial(form.backward_write_q, lay, r))
  pl.when(pair_ends & (s == lay.per_unit - 1))(functools.partial(form.backward_write_kv, lay, r))


def _cost(lay: Layout, *, passes: float, arrays) -> pl.CostEstimate:
  """The kernel's work for XLA's scheduler: `passes` x (QK^T and PV) over the visible pairs."""
  pairs = lay.batch * lay.pairs * 2 * lay.spec.visible_pairs(lay.length)
  return pl.CostEstimate(flops=int(passes * 4 * HEAD_DIM * pairs), transcendentals=int(pairs),
                         bytes_accessed=int(sum(a.size * a.dtype.itemsize for a in arrays)))


def _params(lay: Layout, semantics: tuple[str, ...], itemsize: int) -> pltpu.CompilerParams:
  return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=min(
      VMEM_CAP, max(32 * 2 ** 20, 2 * lay.vmem_bytes(itemsize))))


def forward(lay: Layout, form: Form, tabs, q2, k2, v2, seg_col, seg_row):
  """(out [B, L, pairs x 128], log-sum-exp [B, pairs, 2, L] float32) of q2 [B, L, pairs x 128]
  (scaled) against k2, v2 [B, L, units x 128]; seg_col [B, L, 128] and seg_row [B, 8, L]: the
  segment ids replicated over lanes and sublanes (None without packed documents)."""
  nq, nk, s = lay.nq, lay.nk, lay.per_unit

  def kv_block(b, i, j, kv_at):
    return kv_at[(b * nq + i) * nk + j]

  q_spec = pl.BlockSpec((None, lay.bq, LANES), lambda b, p, i, j, *_: (b, i, p))
  kv_spec = pl.BlockSpec((None, lay.bkv, LANES),
                         lambda b, p, i, j, kind, kv, _: (b, kv_block(b, i, j, kv), p // s))
  in_specs, args = [q_spec, kv_spec, kv_spec], [q2, k2, v2]
  if lay.segments:
    q_col = pl.BlockSpec((None, lay.bq, LANES), lambda b, p, i, j, *_: (b, i, 0))
    k_row = pl.BlockSpec((None, SUBLANES, lay.bkv),
                         lambda b, p, i, j, kind, kv, _: (b, 0, kv_block(b, i, j, kv)))
    k_col = pl.BlockSpec((None, lay.bkv, LANES),
                         lambda b, p, i, j, kind, kv, _: (b, kv_block(b, i, j, kv), 0))
    q_row = pl.BlockSpec((None, SUBLANES, lay.bq), lambda b, p, i, j, *_: (b, 0, i))
    in_specs += [q_row, k_col] if form.keys_on_sublanes else [q_col, k_row]
    args += [seg_row, seg_col] if form.keys_on_sublanes else [seg_col, seg_row]
  out_shape = (jax.ShapeDtypeStruct(q2.shape, q2.dtype),
               jax.ShapeDtypeStruct((lay.batch, lay.pairs, 2, lay.length), jnp.float32))
  out_specs = (q_spec, pl.BlockSpec((None, None, 2, lay.bq), lambda b, p, i, j, *_: (b, p, 0, i)))
  return pl.pallas_call(
      functools.partial(_forward_kernel, lay=lay, form=form),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, grid=(lay.batch, lay.pairs, nq, nk), in_specs=in_specs,
          out_specs=out_specs, scratch_shapes=form.forward_scratch(lay)),
      out_shape=out_shape, interpret=lay.interpret, name=f"flash_hd64_fwd_{form.name}",
      compiler_params=_params(lay, ("parallel", "parallel", "parallel", "arbitrary"),
                              q2.dtype.itemsize),
      cost_estimate=_cost(lay, passes=1.0, arrays=[q2, k2, v2, q2]),
  )(*tabs, *args)


def backward(lay: Layout, form: Form, tabs, q2, k2, v2, seg_col, seg_row, lse, do2, di):
  """(dq2, dk2, dv2) in the layouts of q2, k2, v2; lse from `forward`, do2 the output's
  cotangent, di [B, pairs, 2, L] float32: the rows' sums of out x do per head."""
  nq, nk, per = lay.nq, lay.nk, lay.per_unit

  def q_block(b, u, s, j, i, kind, kv, q_at):
    return q_at[(b * nk + j) * nq + i]

  q_spec = pl.BlockSpec((None, lay.bq, LANES),
                        lambda b, u, s, j, i, *t: (b, q_block(b, u, s, j, i, *t), u * per + s))
  kv_spec = pl.BlockSpec((None, lay.bkv, LANES), lambda b, u, s, j, i, *_: (b, j, u))
  row_spec = pl.BlockSpec((None, None, 2, lay.bq),
                          lambda b, u, s, j, i, *t: (b, u * per + s, 0, q_block(b, u, s, j, i, *t)))
  in_specs = [q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec]
  args = [q2, k2, v2, do2, lse, di]
  if lay.segments:
    in_specs += [pl.BlockSpec((None, lay.bkv, LANES), lambda b, u, s, j, i, *_: (b, j, 0)),
                 pl.BlockSpec((None, SUBLANES, lay.bq),
                              lambda b, u, s, j, i, *t: (b, 0, q_block(b, u, s, j, i, *t)))]
    args += [seg_col, seg_row]
  whole_q = pl.BlockSpec((None, lay.length, LANES), lambda b, u, s, *_: (b, 0, u * per + s))
  whole_kv = pl.BlockSpec((None, lay.length, LANES), lambda b, u, *_: (b, 0, u))
  return pl.pallas_call(
      functools.partial(_backward_kernel, lay=lay, form=form),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, grid=(lay.batch, lay.units, per, nk, nq), in_specs=in_specs,
          out_specs=(whole_q, whole_kv, whole_kv), scratch_shapes=form.backward_scratch(lay)),
      out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q2, k2, v2)),
      interpret=lay.interpret, name=f"flash_hd64_bwd_{form.name}",
      compiler_params=_params(lay, ("parallel", "parallel", "arbitrary", "arbitrary",
                                    "arbitrary"), q2.dtype.itemsize),
      cost_estimate=_cost(lay, passes=2.5, arrays=[q2, k2, v2, do2, q2, k2, v2]),
  )(*tabs, *args)
