"""`dot_product` attention: jax.nn.dot_product_attention.

Its XLA path on every platform in jax 0.10.2 (cuDNN's needs cuDNN, docs/plan.md "GPU
entries"): float32 logits, causal by its own flag when no mask is needed, else under the
explicit mask (packed documents, a context shard, a decode step).
"""

import jax

from modules.attn_registry import IMPLEMENTATIONS, Context, Mask, Supports


@IMPLEMENTATIONS.register("dot_product", Supports(segments=True, context=Context.GATHERED,
                                                  decode=True))
def dot_product_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask: Mask, cfg):
  """jax.nn.dot_product_attention, `is_causal` when the mask is plain causal."""
  del cfg  # no setting of its own, no per-layer option
  if mask.causal_only:
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, is_causal=True)
  return jax.nn.dot_product_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK,
                                      mask=mask.array(q_BxLxHxK.shape[1]))
