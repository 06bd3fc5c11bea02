"""`dot_product` attention: jax.nn.dot_product_attention.

Its XLA path on every platform in jax 0.10.2 (cuDNN's needs cuDNN, docs/plan.md "GPU
entries"): float32 logits, causal by its own flag when no mask is needed, else under the
mask as an array (packed documents, a mask option, a context shard, a decode step).
"""

import jax

from modules import masks
from modules.attn_registry import IMPLEMENTATIONS, Context, Supports
from modules.masks import Mask


@IMPLEMENTATIONS.register("dot_product", Supports(segments=True, context=Context.GATHERED,
                                                  decode=True, masks=masks.DENSE))
def dot_product_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask: Mask, cfg):
  """jax.nn.dot_product_attention, `is_causal` when the mask is plain causal."""
  del cfg  # no setting of its own, no per-layer option
  if mask.causal_only:
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, is_causal=True)
  return jax.nn.dot_product_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK,
                                      mask=mask.array(q_BxLxHxK.shape[1]))
