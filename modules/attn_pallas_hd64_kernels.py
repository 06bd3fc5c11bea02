"""The Pallas TPU kernels of `pallas_hd64` attention (modules/attn_pallas_hd64.py): flash
attention forward and backward for head_dim 64, two heads a block.

Layout. Queries, outputs and their gradients stay in the layer's [B, L, H x 64] layout (a free
reshape of [B, L, H, 64]): a block of `bq` positions of a pair of heads is a [bq, 128] tile
that fills the TPU's 128 lanes, head 0 of the pair in lanes 0-63 and head 1 in 64-127, so no
transpose to a heads-major layout is needed and no tile is half empty. Keys and values come as
[B, L, U x 128], U units of two kv heads' lanes (modules/attn_pallas_hd64.py arranges GQA so that
the pair p of query heads finds its kv heads in unit p // per_unit, at the same lanes).

Matmuls. Each head's logits are a product with a 128-wide contraction: the pair's tile with the
other head's lanes set to zero, against the whole [bkv, 128] key tile (the MXU is 128 x 128; a
64-wide contraction fills half of it either way, and this needs no lane shifts). The probabilities
times the whole value tile give [bq, 128], of which the head's own lanes are kept, so that the
accumulators, outputs and gradients are lane-dense [rows, 128] arrays throughout.

Blocks. The grid walks blocks of `bq` queries by `bkv` keys; tables in SMEM (scalar prefetch,
`tables`) say per block whether nobody sees it (skipped, and its DMA pointed at a block that is
loaded anyway), everybody sees it (no mask computed: inside one document, below the diagonal and
within the window) or some do (the mask of modules/masks.py:Spec.within and the segment ids).

Forward: grid (B, pairs, q blocks, kv blocks), online softmax in VMEM; writes the output and the
log-sum-exp per query and head ([B, pairs, 2, L] float32). Backward (one kernel, as splash's
fused one): grid (B, kv units, pairs of the unit, kv blocks, q blocks); it recomputes the
probabilities transposed ([bkv, bq]: keys on sublanes, so the log-sum-exp and the output's
row sums are rows), and accumulates dK and dV of the unit and dQ of the pair in float32 VMEM over
the whole length, written once at the end.
"""

from __future__ import annotations

import dataclasses
import functools

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


def _dot(a, b, dims=(((1,), (0,)), ((), ()))):
  """a @ b (or by `dims`) in float32. Operands narrower than float32 multiply at the MXU's own
  precision whatever jax_default_matmul_precision says (Mosaic takes no float32 contraction of
  bfloat16 operands); float32 ones follow it."""
  precision = lax.Precision.DEFAULT if a.dtype.itemsize < 4 else None
  return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _first_head(rows: int):
  """[rows, 128] booleans: the lanes of the pair's first head."""
  return lax.broadcasted_iota(jnp.int32, (rows, LANES), 1) < HEAD_DIM


def _seen(lay: Layout, q_index, k_index, q_segments, k_segments):
  """Booleans of a PARTIAL block: Spec.within on the indices, and one document where there are
  segment ids (q_segments and k_segments already broadcast to the block's shape)."""
  seen = lay.spec.within(q_index, k_index)
  if q_segments is not None:
    seen = seen & (q_segments == k_segments)
  return seen


def _tile_lanes(x, lanes: int):
  """[rows, 128] lane-replicated values -> [rows, lanes] (lanes a multiple of 128)."""
  return x if lanes == LANES else jnp.tile(x, (1, lanes // LANES))


def _forward_kernel(kind_ref, kv_ref, q_at_ref, *refs, lay: Layout):
  """One (row, pair, q block i, kv block j) step of the forward pass (module docstring)."""
  del q_at_ref
  if lay.segments:
    q_ref, k_ref, v_ref, qseg_ref, kseg_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref = refs
  else:
    q_ref, k_ref, v_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref = refs
    qseg_ref = kseg_ref = None
  del kv_ref
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  bq, bkv = lay.bq, lay.bkv
  kind = kind_ref[(b * lay.nq + i) * lay.nk + j]

  @pl.when(j == 0)
  def _init():
    m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  def step(masked: bool):
    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    first = _first_head(bq)
    seen = None
    if masked:
      q_index = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bkv), 0)
      k_index = j * bkv + lax.broadcasted_iota(jnp.int32, (bq, bkv), 1)
      seen = _seen(lay, q_index, k_index,
                   None if qseg_ref is None else _tile_lanes(qseg_ref[...], bkv),
                   None if kseg_ref is None else kseg_ref[:1, :])
    alphas, outs = [], []
    for h in range(2):
      own = first if h == 0 else jnp.logical_not(first)
      s = _dot(jnp.where(own, q, jnp.zeros_like(q)), k, NT)  # [bq, bkv]
      if masked:
        s = jnp.where(seen, s, MASK_VALUE)
      m_prev = m_ref[h]  # [bq, 128], the row's running max in every lane
      m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
      p = jnp.exp(s - m_next[:, :1])
      alpha = jnp.exp(m_prev - m_next)
      l_ref[h] = alpha * l_ref[h] + jnp.sum(p, axis=1, keepdims=True)
      m_ref[h] = m_next
      outs.append(_dot(p.astype(v.dtype), v))
      alphas.append(alpha)
    acc_ref[...] = (jnp.where(first, alphas[0], alphas[1]) * acc_ref[...]
                    + jnp.where(first, outs[0], outs[1]))

  pl.when(kind == FULL)(lambda: step(False))
  pl.when(kind == PARTIAL)(lambda: step(True))

  @pl.when(j == lay.nk - 1)
  def _end():
    first = _first_head(bq)
    l = jnp.where(first, l_ref[0], l_ref[1])
    o_ref[...] = (acc_ref[...] / l).astype(o_ref.dtype)
    lse = (jnp.where(first, m_ref[0], m_ref[1]) + jnp.log(l)).T  # [128, bq]: head 0, head 1
    lse_ref[...] = jnp.concatenate([lse[:1], lse[HEAD_DIM:HEAD_DIM + 1]], axis=0)


def _cost(lay: Layout, *, passes: float, arrays) -> pl.CostEstimate:
  """The kernel's work for XLA's scheduler: `passes` x (QK^T and PV) over the visible pairs."""
  pairs = lay.batch * lay.pairs * 2 * lay.spec.visible_pairs(lay.length)
  return pl.CostEstimate(flops=int(passes * 4 * HEAD_DIM * pairs), transcendentals=int(pairs),
                         bytes_accessed=int(sum(a.size * a.dtype.itemsize for a in arrays)))


def _params(lay: Layout, semantics: tuple[str, ...], itemsize: int) -> pltpu.CompilerParams:
  return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=min(
      VMEM_CAP, max(32 * 2 ** 20, 2 * lay.vmem_bytes(itemsize))))


def forward(lay: Layout, tabs, q2, k2, v2, seg_col, seg_row):
  """(out [B, L, pairs x 128], log-sum-exp [B, pairs, 2, L] float32) of q2 [B, L, pairs x 128]
  (scaled) against k2, v2 [B, L, units x 128]; seg_col [B, L, 128] and seg_row [B, 8, L]: the
  segment ids replicated over lanes and sublanes (None without packed documents)."""
  nq, nk, s = lay.nq, lay.nk, lay.per_unit

  def at(b, i, j):
    return (b * nq + i) * nk + j

  q_spec = pl.BlockSpec((None, lay.bq, LANES), lambda b, p, i, j, *_: (b, i, p))
  kv_spec = pl.BlockSpec((None, lay.bkv, LANES),
                         lambda b, p, i, j, kind, kv, _: (b, kv[at(b, i, j)], p // s))
  in_specs, args = [q_spec, kv_spec, kv_spec], [q2, k2, v2]
  if lay.segments:
    in_specs += [pl.BlockSpec((None, lay.bq, LANES), lambda b, p, i, j, *_: (b, i, 0)),
                 pl.BlockSpec((None, SUBLANES, lay.bkv),
                              lambda b, p, i, j, kind, kv, _: (b, 0, kv[at(b, i, j)]))]
    args += [seg_col, seg_row]
  out_shape = (jax.ShapeDtypeStruct(q2.shape, q2.dtype),
               jax.ShapeDtypeStruct((lay.batch, lay.pairs, 2, lay.length), jnp.float32))
  out_specs = (q_spec, pl.BlockSpec((None, None, 2, lay.bq), lambda b, p, i, j, *_: (b, p, 0, i)))
  return pl.pallas_call(
      functools.partial(_forward_kernel, lay=lay),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, grid=(lay.batch, lay.pairs, nq, nk), in_specs=in_specs,
          out_specs=out_specs,
          scratch_shapes=[pltpu.VMEM((2, lay.bq, LANES), jnp.float32),
                          pltpu.VMEM((2, lay.bq, LANES), jnp.float32),
                          pltpu.VMEM((lay.bq, LANES), jnp.float32)]),
      out_shape=out_shape, interpret=lay.interpret, name="flash_hd64_fwd",
      compiler_params=_params(lay, ("parallel", "parallel", "parallel", "arbitrary"),
                              q2.dtype.itemsize),
      cost_estimate=_cost(lay, passes=1.0, arrays=[q2, k2, v2, q2]),
  )(*tabs, *args)


def _backward_step(lay: Layout, i, j, masked: bool, q_ref, k_ref, v_ref, do_ref, lse_ref,
                   di_ref, kseg_ref, qseg_ref, dq_acc, dk_acc, dv_acc):
  """Block (i, j) of the backward pass: the pair's probabilities recomputed transposed
  ([bkv, bq]: keys on sublanes), their gradients added to dK, dV (rows of block j) and dQ (rows
  of block i)."""
  bq, bkv = lay.bq, lay.bkv
  q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
  first_k, first_q = _first_head(bkv), _first_head(bq)
  seen = None
  if masked:
    k_index = j * bkv + lax.broadcasted_iota(jnp.int32, (bkv, bq), 0)
    q_index = i * bq + lax.broadcasted_iota(jnp.int32, (bkv, bq), 1)
    seen = _seen(lay, q_index, k_index,
                 None if qseg_ref is None else qseg_ref[:1, :],
                 None if kseg_ref is None else _tile_lanes(kseg_ref[...], bq))
  dqs, dks, dvs = [], [], []
  for h in range(2):
    own = first_k if h == 0 else jnp.logical_not(first_k)
    zeros = jnp.zeros_like(k)
    s_t = _dot(jnp.where(own, k, zeros), q, NT)  # [bkv, bq]
    if masked:
      s_t = jnp.where(seen, s_t, MASK_VALUE)
    p_t = jnp.exp(s_t - lse_ref[h:h + 1, :])
    dp_t = _dot(jnp.where(own, v, zeros), do, NT)
    ds_t = p_t * (dp_t - di_ref[h:h + 1, :])
    dvs.append(_dot(p_t.astype(do.dtype), do))
    dks.append(_dot(ds_t.astype(q.dtype), q))
    dqs.append(_dot(ds_t.T.astype(k.dtype), k))
  keys = pl.ds(pl.multiple_of(j * bkv, bkv), bkv)
  queries = pl.ds(pl.multiple_of(i * bq, bq), bq)
  dv_acc[keys, :] += jnp.where(first_k, dvs[0], dvs[1])
  dk_acc[keys, :] += jnp.where(first_k, dks[0], dks[1])
  dq_acc[queries, :] += jnp.where(first_q, dqs[0], dqs[1])


def _backward_kernel(kind_ref, kv_at_ref, q_at_ref, *refs, lay: Layout):
  """One (row, kv unit, pair of the unit, kv block j, q block i) step of the backward pass:
  dK and dV of the unit accumulate over its pairs and the q blocks, dQ of the pair over the kv
  blocks, each written once, at the end of what it sums."""
  del kv_at_ref, q_at_ref
  if not lay.segments:
    refs = (*refs[:6], None, None, *refs[6:])
  q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, kseg_ref, qseg_ref = refs[:8]
  dq_ref, dk_ref, dv_ref, dq_acc, dk_acc, dv_acc = refs[8:]
  b, s, j, i = pl.program_id(0), pl.program_id(2), pl.program_id(3), pl.program_id(4)
  kind = kind_ref[(b * lay.nq + i) * lay.nk + j]
  pair_starts = (j == 0) & (i == 0)

  @pl.when(pair_starts & (s == 0))
  def _init_unit():
    dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
    dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

  @pl.when(pair_starts)
  def _init_pair():
    dq_acc[...] = jnp.zeros(dq_acc.shape, jnp.float32)

  for value, masked in ((FULL, False), (PARTIAL, True)):
    pl.when(kind == value)(functools.partial(
        _backward_step, lay, i, j, masked, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref,
        kseg_ref, qseg_ref, dq_acc, dk_acc, dv_acc))
  pair_ends = (j == lay.nk - 1) & (i == lay.nq - 1)

  @pl.when(pair_ends)
  def _write_pair():
    dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)

  @pl.when(pair_ends & (s == lay.per_unit - 1))
  def _write_unit():
    dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def backward(lay: Layout, tabs, q2, k2, v2, seg_col, seg_row, lse, do2, di):
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
      functools.partial(_backward_kernel, lay=lay),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, grid=(lay.batch, lay.units, per, nk, nq), in_specs=in_specs,
          out_specs=(whole_q, whole_kv, whole_kv),
          scratch_shapes=[pltpu.VMEM((lay.length, LANES), jnp.float32) for _ in range(3)]),
      out_shape=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q2, k2, v2)),
      interpret=lay.interpret, name="flash_hd64_bwd",
      compiler_params=_params(lay, ("parallel", "parallel", "arbitrary", "arbitrary",
                                    "arbitrary"), q2.dtype.itemsize),
      cost_estimate=_cost(lay, passes=2.5, arrays=[q2, k2, v2, do2, q2, k2, v2]),
  )(*tabs, *args)
