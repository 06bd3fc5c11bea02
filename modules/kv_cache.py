"""Attention's KV cache for decoding (trainer/generate.py): a ring buffer of the slots its mask
needs.

With `decode=True` each attention layer keeps, in the flax "cache" collection, `key` and
`value` [B, S, G, K] and `position` [B, S] (each slot's key's position + 1; 0: an empty slot,
so a zero-filled cache is empty), where S = masks.Spec.cache_slots(length) for the length the
cache is made for (`model.init(..., decode=True)` on tokens of that length:
trainer/generate.py:init_cache): every position, or with a sliding window only the last
`sliding_window` (memory bounded by the window, whatever the length). Position p lives in slot
p mod S.

A call brings the keys and values of L tokens whose positions (`positions_BxL`) are
consecutive per row; a negative position is padding (a short prompt's tail in a batch), which
no other token sees (modules/masks.py) and which is not stored. Its queries attend to the
cache as it was and to the call's own keys together (S + L keys) under the layer's mask
(modules/masks.py:Spec.dense over their positions), so a prefill longer than the ring still
sees every key its window holds; then each slot takes the newest of the call's tokens that
falls in it, if any.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from modules import masks

# The cache holds keys/values like the activations they come from (same logical axes).
CACHE_AXES = ("act_batch", "act_length", "act_heads", None)
POSITION_AXES = ("act_batch", "act_length")


def ring_write(cache_BxSx, new_BxLx, positions_BxL):
  """`cache_BxSx` ([B, S, ...]) with each slot j holding the newest of the new entries
  ([B, L, ...], at consecutive positions from positions_BxL[:, 0], negative ones padding at
  the end) whose position is j mod S; slots that none of them falls in keep theirs."""
  slots, length = cache_BxSx.shape[1], new_BxLx.shape[1]
  first_Bx1 = positions_BxL[:, :1]
  last_Bx1 = first_Bx1 + jnp.sum(positions_BxL >= 0, axis=1, keepdims=True) - 1
  slot_1xS = jnp.arange(slots)[None]
  newest_BxS = last_Bx1 - (last_Bx1 - slot_1xS) % slots  # the latest position <= last in slot
  take_BxS = (last_Bx1 >= first_Bx1) & (newest_BxS >= first_Bx1)
  index_BxS = jnp.clip(newest_BxS - first_Bx1, 0, length - 1)
  extra = (1,) * (new_BxLx.ndim - 2)
  got = jnp.take_along_axis(new_BxLx, index_BxS.reshape(*index_BxS.shape, *extra), axis=1)
  return jnp.where(take_BxS.reshape(*take_BxS.shape, *extra), got.astype(cache_BxSx.dtype),
                   cache_BxSx)


class KVCache(nn.Module):
  """(keys [B, S + L, G, K], values, mask [B, 1, L, S + L]) for a call's queries to attend to;
  the cache updated with its keys and values."""
  spec: masks.Spec

  @nn.compact
  def __call__(self, k_BxLxGxK, v_BxLxGxK, positions_BxL):
    b, length, g, k = k_BxLxGxK.shape
    slots = self.spec.cache_slots(length)  # at creation, `length` is the cache's
    make = nn.with_logical_partitioning(jnp.zeros, CACHE_AXES)
    keys = self.variable("cache", "key", make, (b, slots, g, k), k_BxLxGxK.dtype)
    values = self.variable("cache", "value", make, (b, slots, g, k), v_BxLxGxK.dtype)
    ends = self.variable("cache", "position", nn.with_logical_partitioning(
        jnp.zeros, POSITION_AXES), (b, slots), jnp.int32)
    cached_BxS = ends.value - 1
    k_all = jnp.concatenate([keys.value, k_BxLxGxK.astype(keys.value.dtype)], axis=1)
    v_all = jnp.concatenate([values.value, v_BxLxGxK.astype(values.value.dtype)], axis=1)
    mask = self.spec.dense(positions_BxL, jnp.concatenate([cached_BxS, positions_BxL], axis=1))
    keys.value = nn.with_logical_constraint(
        ring_write(keys.value, k_BxLxGxK, positions_BxL), CACHE_AXES)
    values.value = nn.with_logical_constraint(
        ring_write(values.value, v_BxLxGxK, positions_BxL), CACHE_AXES)
    ends.value = ring_write(ends.value, positions_BxL + 1, positions_BxL)
    return k_all, v_all, mask
