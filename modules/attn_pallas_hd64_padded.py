"""`pallas_hd64`'s padded form (attention.pallas_products=padded): every product 128 lanes wide.

Forward, queries on sublanes: a head's logits [bq, bkv] are its queries (the other head's lanes
zeroed) against the whole key tile; its probabilities times the whole value tile give [bq, 128],
of which the head's own lanes are kept (the other half of that MXU pass is discarded), so the
accumulator, the output and the running max and sum ([bq, 128], a row's value in every lane)
stay lane-dense. Backward, keys on sublanes: dV, dK ([bkv, 128]) and dQ ([bq, 128]) likewise
keep the head's own lanes of whole-tile products. Every 64-wide product fills half the MXU: the
logits by their 64-deep contraction, the others by their 64-wide output.
(modules/attn_pallas_hd64_kernels.py: the layout, tables and grids both forms share.)
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from modules.attn_pallas_hd64_kernels import (HEAD_DIM, LANES, MASK_VALUE, NT, Form,
                                              backward_scores, dot, first_head,
                                              keys_major_seen, tile_lanes)


def _forward_step(lay, i, j, masked: bool, r):
  """Block (i, j): the pair's online softmax, queries on sublanes."""
  bq, bkv = lay.bq, lay.bkv
  q, k, v = r.q[...], r.k[...], r.v[...]
  first = first_head(bq)
  seen = None
  if masked:
    seen = lay.spec.within(i * bq + lax.broadcasted_iota(jnp.int32, (bq, bkv), 0),
                           j * bkv + lax.broadcasted_iota(jnp.int32, (bq, bkv), 1))
    if r.qseg is not None:
      seen = seen & (tile_lanes(r.qseg[...], bkv) == r.kseg[:1, :])
  alphas, outs = [], []
  for h in range(2):
    own = first if h == 0 else jnp.logical_not(first)
    s = dot(jnp.where(own, q, jnp.zeros_like(q)), k, NT)  # [bq, bkv]
    if masked:
      s = jnp.where(seen, s, MASK_VALUE)
    m_prev = r.m[h]  # [bq, 128], the row's running max in every lane
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - m_next[:, :1])
    alpha = jnp.exp(m_prev - m_next)
    r.l[h] = alpha * r.l[h] + jnp.sum(p, axis=1, keepdims=True)
    r.m[h] = m_next
    outs.append(dot(p.astype(v.dtype), v))
    alphas.append(alpha)
  r.acc[...] = (jnp.where(first, alphas[0], alphas[1]) * r.acc[...]
                + jnp.where(first, outs[0], outs[1]))


def _forward_end(lay, r):
  first = first_head(lay.bq)
  l = jnp.where(first, r.l[0], r.l[1])
  r.o[...] = (r.acc[...] / l).astype(r.o.dtype)
  lse = (jnp.where(first, r.m[0], r.m[1]) + jnp.log(l)).T  # [128, bq]: head 0, head 1
  r.lse[...] = jnp.concatenate([lse[:1], lse[HEAD_DIM:HEAD_DIM + 1]], axis=0)


def _backward_step(lay, i, j, masked: bool, r):
  """Block (i, j): the pair's probabilities recomputed [bkv, bq], their gradients added to dK,
  dV (rows of block j) and dQ (rows of block i)."""
  bq, bkv = lay.bq, lay.bkv
  q, k, v, do = r.q[...], r.k[...], r.v[...], r.do[...]
  first_k, first_q = first_head(bkv), first_head(bq)
  seen = keys_major_seen(lay, i, j, r.qseg, r.kseg) if masked else None
  dqs, dks, dvs = [], [], []
  for h in range(2):
    own = first_k if h == 0 else jnp.logical_not(first_k)
    p_t, ds_t = backward_scores(r, h, own, q, k, v, do, seen)  # [bkv, bq]
    dvs.append(dot(p_t.astype(do.dtype), do))
    dks.append(dot(ds_t.astype(q.dtype), q))
    dqs.append(dot(ds_t.T.astype(k.dtype), k))
  keys = pl.ds(pl.multiple_of(j * bkv, bkv), bkv)
  queries = pl.ds(pl.multiple_of(i * bq, bq), bq)
  r.dv_acc[keys, :] += jnp.where(first_k, dvs[0], dvs[1])
  r.dk_acc[keys, :] += jnp.where(first_k, dks[0], dks[1])
  r.dq_acc[queries, :] += jnp.where(first_q, dqs[0], dqs[1])


def _write_q(lay, r):
  del lay
  r.dq[...] = r.dq_acc[...].astype(r.dq.dtype)


def _write_kv(lay, r):
  del lay
  r.dk[...] = r.dk_acc[...].astype(r.dk.dtype)
  r.dv[...] = r.dv_acc[...].astype(r.dv.dtype)


PADDED = Form(
    name="padded", keys_on_sublanes=False, forward_step=_forward_step, forward_end=_forward_end,
    forward_scratch=lambda lay: [pltpu.VMEM((2, lay.bq, LANES), jnp.float32),
                                 pltpu.VMEM((2, lay.bq, LANES), jnp.float32),
                                 pltpu.VMEM((lay.bq, LANES), jnp.float32)],
    backward_step=_backward_step, backward_write_q=_write_q, backward_write_kv=_write_kv,
    backward_scratch=lambda lay: [pltpu.VMEM((lay.length, LANES), jnp.float32)
                                  for _ in range(3)])
