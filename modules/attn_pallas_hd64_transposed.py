"""`pallas_hd64`'s transposed form (attention.pallas_products=transposed, the default): the
products with a 64-wide output computed transposed, so that a head's 64 rows stream through the
MXU against a whole 128 x 128 tile held in it.

Keys on sublanes throughout. Forward: a head's logits [bkv, bq] are its keys (the other head's
lanes zeroed) against the query tile; the running max and sum are rows [1, bq]; the output is
accumulated transposed, O^T = V^T P^T ([64, bq] a head, rows 0-63 and 64-127 of one [128, bq]
accumulator), the head's 64 rows of V^T streamed against the probabilities held in the MXU, and
transposed once at the end into the pair's [bq, 128] tile. Backward: dV^T = dO^T P,
dK^T = Q^T dS and dQ^T = K^T dS^T ([64, keys or queries] a head) likewise stream 64 rows against
the probabilities or their gradients; the accumulators hold [128, positions] per block, written
transposed at the end. Only the logits and dP = dO V^T keep a 64-deep contraction: 3.5 MXU
passes of the padded form's 5 in the backward, 1.5 of 2 in the forward. Whether streaming 64
rows beats the padded form on a chip depends on how fast the MXU takes in the tiles it holds
(benchmarks/attention.py times both; docs/chip.md).
(modules/attn_pallas_hd64_kernels.py: the layout, tables and grids both forms share.)
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from modules.attn_pallas_hd64_kernels import (HEAD_DIM, LANES, MASK_VALUE, NT, Form,
                                              backward_scores, dot, first_head,
                                              keys_major_seen)


def _rows(h: int) -> slice:
  """The rows of head h of the pair in a transposed [128, ...] array."""
  return slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)


def _forward_step(lay, i, j, masked: bool, r):
  """Block (i, j): the pair's online softmax over keys on sublanes."""
  q, k, v = r.q[...], r.k[...], r.v[...]
  v_t = v.T  # [128, bkv]: head h's values in rows _rows(h)
  first = first_head(lay.bkv)
  seen = keys_major_seen(lay, i, j, r.qseg, r.kseg) if masked else None
  for h in range(2):
    own = first if h == 0 else jnp.logical_not(first)
    s_t = dot(jnp.where(own, k, jnp.zeros_like(k)), q, NT)  # [bkv, bq]
    if masked:
      s_t = jnp.where(seen, s_t, MASK_VALUE)
    m_prev = r.m[h]  # [1, bq]
    m_next = jnp.maximum(m_prev, jnp.max(s_t, axis=0, keepdims=True))
    p_t = jnp.exp(s_t - m_next)
    alpha = jnp.exp(m_prev - m_next)
    r.l[h] = alpha * r.l[h] + jnp.sum(p_t, axis=0, keepdims=True)
    r.m[h] = m_next
    r.acc[_rows(h), :] = alpha * r.acc[_rows(h), :] + dot(v_t[_rows(h)], p_t.astype(v.dtype))


def _forward_end(lay, r):
  del lay
  out_t = jnp.concatenate([r.acc[_rows(h), :] / r.l[h] for h in range(2)], axis=0)
  r.o[...] = out_t.T.astype(r.o.dtype)
  r.lse[...] = jnp.concatenate([r.m[h] + jnp.log(r.l[h]) for h in range(2)], axis=0)


def _backward_step(lay, i, j, masked: bool, r):
  """Block (i, j): the pair's probabilities recomputed [bkv, bq]; dV^T, dK^T (columns of block
  j) and dQ^T (columns of block i) added to the accumulators."""
  q, k, v, do = r.q[...], r.k[...], r.v[...], r.do[...]
  q_t, do_t, k_t = q.T, do.T, k.T  # [128, positions]: head h in rows _rows(h)
  first = first_head(lay.bkv)
  seen = keys_major_seen(lay, i, j, r.qseg, r.kseg) if masked else None
  for h in range(2):
    own = first if h == 0 else jnp.logical_not(first)
    p_t, ds_t = backward_scores(r, h, own, q, k, v, do, seen)  # [bkv, bq]
    ds_t = ds_t.astype(q.dtype)
    rows = _rows(h)
    r.dv_acc[j, rows, :] += dot(do_t[rows], p_t.astype(do.dtype), NT)  # [64, bkv]
    r.dk_acc[j, rows, :] += dot(q_t[rows], ds_t, NT)  # [64, bkv]
    r.dq_acc[i, rows, :] += dot(k_t[rows], ds_t)  # [64, bq]


def _write_q(lay, r):
  for n in range(lay.nq):
    r.dq[n * lay.bq:(n + 1) * lay.bq, :] = r.dq_acc[n].T.astype(r.dq.dtype)


def _write_kv(lay, r):
  for n in range(lay.nk):
    r.dk[n * lay.bkv:(n + 1) * lay.bkv, :] = r.dk_acc[n].T.astype(r.dk.dtype)
    r.dv[n * lay.bkv:(n + 1) * lay.bkv, :] = r.dv_acc[n].T.astype(r.dv.dtype)


TRANSPOSED = Form(
    name="transposed", keys_on_sublanes=True, forward_step=_forward_step,
    forward_end=_forward_end,
    forward_scratch=lambda lay: [pltpu.VMEM((2, 1, lay.bq), jnp.float32),
                                 pltpu.VMEM((2, 1, lay.bq), jnp.float32),
                                 pltpu.VMEM((LANES, lay.bq), jnp.float32)],
    backward_step=_backward_step, backward_write_q=_write_q, backward_write_kv=_write_kv,
    backward_scratch=lambda lay: [pltpu.VMEM((lay.nq, LANES, lay.bq), jnp.float32),
                                  pltpu.VMEM((lay.nk, LANES, lay.bkv), jnp.float32),
                                  pltpu.VMEM((lay.nk, LANES, lay.bkv), jnp.float32)])
