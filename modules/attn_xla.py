"""`xla` attention: the reference math in einsums, written for what XLA keeps in memory.

It supports everything (attn_registry.REFERENCE): packed documents, context parallelism
(explicit masks), decoding, every per-layer option, and every mask option (modules/masks.py:
it attends under the mask as an array).
"""

import jax
import jax.numpy as jnp

from modules import masks
from modules.attn_registry import IMPLEMENTATIONS, Context, Supports
from modules.masks import Mask


@IMPLEMENTATIONS.register("xla", Supports(segments=True, context=Context.GATHERED, decode=True,
                                          options=("logit_softcap",), masks=masks.DENSE))
def xla_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask: Mask, cfg):
  """Reference math; softmax in float32. G kv heads each serve R = H/G query heads.

  Heads are moved ahead of length so that both products are plain batched
  matmuls over (B, G); the R query heads of a group go one at a time (a [B, G, L, S] logits
  tensor live, not R of them: on llm_1b packed, v5e:4x4, 3.9 against 5.50 GiB of
  temporaries). The packed mask is recomputed with the layer under remat, not saved: saving
  it cost 0.36 GiB more temporaries at the same step and bytes.

  What is written to memory at [queries, keys] size is in the compute dtype: the logits as
  the first matmul leaves them (`cfg.logits_dtype`: `compute`, the inputs' dtype, or
  `float32`) and the softmax's numerators exp(logit - max), which the second matmul reads. The
  float32 max and exponent happen inside the fusions that read them; the row sums come out of
  the second matmul, from a column of ones after the values (no pass of its own over
  [queries, keys]: on llm_1b packed, 369 -> 355 GB accessed, 0.697 -> 0.672 s cost-model
  step), and the output is divided by them after it (as flash attention does), not the
  [queries, keys] weights.

  `cfg.logit_softcap` (Gemma-2): the scaled logits become cap * tanh(logits / cap), in float32,
  before the mask.
  """
  b, length, h, k = q_BxLxHxK.shape
  g = k_BxSxGxK.shape[2]
  r = h // g
  mask_Bx1xLxS = mask.array(length)
  logits_dtype = jnp.float32 if cfg.logits_dtype == "float32" else None
  scale, cap = k ** -0.5, cfg.logit_softcap
  q_RxBxGxLxK = q_BxLxHxK.reshape(b, length, g, r, k).transpose(3, 0, 2, 1, 4)
  k_BxGxSxK = k_BxSxGxK.transpose(0, 2, 1, 3)
  v_BxGxSxK = v_BxSxGxK.transpose(0, 2, 1, 3)
  ones_BxGxSx1 = jnp.ones((*v_BxGxSxK.shape[:3], 1), v_BxGxSxK.dtype)
  v_BxGxSxK1 = jnp.concatenate([v_BxGxSxK, ones_BxGxSx1], axis=-1)  # the last column: row sums
  outs = []
  for q_BxGxLxK in q_RxBxGxLxK:  # the R query heads of each kv group, one at a time
    logits = jnp.einsum("bgqk,bgsk->bgqs", q_BxGxLxK, k_BxGxSxK,
                        preferred_element_type=logits_dtype)
    if cap is not None:  # scaled, capped, then masked (Gemma-2); the scale is applied here
      logits = (cap * jnp.tanh(logits.astype(jnp.float32) * (scale / cap))).astype(logits.dtype)
    # The mask is applied in the logits' dtype, so that the matmul's fusion writes them in it
    # (a float32 cast right after the matmul would be folded into it: float32 logits in memory).
    logits_BxGxLxS = jnp.where(mask_Bx1xLxS, logits,
                               jnp.finfo(logits.dtype).min).astype(jnp.float32) * (
                                   scale if cap is None else 1.0)
    top = jax.lax.stop_gradient(jnp.max(logits_BxGxLxS, axis=-1, keepdims=True))
    exp_BxGxLxS = jnp.exp(logits_BxGxLxS - top)
    out_BxLxGxK1 = jnp.einsum("bgqs,bgsk->bqgk", exp_BxGxLxS.astype(v_BxSxGxK.dtype), v_BxGxSxK1,
                              preferred_element_type=jnp.float32)
    out, sums_BxLxGx1 = out_BxLxGxK1[..., :-1], out_BxLxGxK1[..., -1:]
    outs.append((out / sums_BxLxGx1).astype(v_BxSxGxK.dtype))
  return jnp.stack(outs, axis=3).reshape(b, length, h, k)
