"""`chunked` attention: the `xla` math over blocks of `query_chunk_size` queries, one at a time.

Each block is recomputed in the backward pass, so the float32 [queries, keys] logits and
probabilities exist for one block, not the whole length (memory-efficient attention, Rabe &
Staats 2021). It supports what `xla` does: each block is an `xla` call with the same node.
"""

import jax

from modules import masks
from modules.attn_registry import IMPLEMENTATIONS, Context, Supports
from modules.attn_xla import xla_attention
from modules.masks import Mask


@IMPLEMENTATIONS.register("chunked", Supports(segments=True, context=Context.GATHERED,
                                              decode=True, options=("logit_softcap",),
                                              masks=masks.DENSE))
def chunked_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask: Mask, cfg):
  """`xla_attention` over blocks of `cfg.query_chunk_size` queries (lax.map), each block under
  jax.checkpoint. The result equals xla_attention's; a length that the chunk does not divide
  runs unchunked."""
  b, length, h, k = q_BxLxHxK.shape
  chunk = cfg.query_chunk_size
  if length <= chunk or length % chunk:
    return xla_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask, cfg)
  n = length // chunk
  mask_Bx1xLxS = mask.array(length)
  q_NxBxCxHxK = q_BxLxHxK.reshape(b, n, chunk, h, k).swapaxes(0, 1)
  mask_NxBx1xCxS = mask_Bx1xLxS.reshape(mask_Bx1xLxS.shape[0], 1, n, chunk, -1).transpose(
      2, 0, 1, 3, 4)

  @jax.checkpoint
  def block(args):
    q_BxCxHxK, mask_Bx1xCxS = args
    return xla_attention(q_BxCxHxK, k_BxSxGxK, v_BxSxGxK, Mask(explicit_Bx1xLxS=mask_Bx1xCxS),
                         cfg)

  out_NxBxCxHxK = jax.lax.map(block, (q_NxBxCxHxK, mask_NxBx1xCxS))
  return out_NxBxCxHxK.swapaxes(0, 1).reshape(b, length, h, k)
