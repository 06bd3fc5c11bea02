"""Which keys each query sees: every mask option defined once, in each form its users need.

A query at position q sees a key at position k when
  - k <= q (causal: these are decoder LMs);
  - k >= 0, or q < 0: a negative position is padding (an empty slot of a KV cache, the tail of
    a short prompt in a batch), which only padding sees, so that every query sees some key;
  - both carry the same segment id, where the call has segment ids (packed documents);
  - q - k < W with a sliding window of W (`attention.sliding_window`): the query and the W - 1
    positions before it (Mistral, Gemma 2's local layers; Hugging Face's `sliding_window`).

`Spec` holds a layer's mask options, made from its AttentionConfig by `Spec.of`, and gives:
  (a) `Spec.dense`: [B, 1, L, S] booleans for given query and key positions and segment ids,
      under which `xla`, `chunked` and `dot_product` attend: in training (a token's index in
      its row), on a context shard (its queries' original indices against those of the
      gathered keys, modules/context.py), in a decode step (the KV cache's slots' positions,
      modules/kv_cache.py);
  (b) `Spec.splash`: the splash kernel's mask for a block of queries against its keys
      (modules/attn_splash.py), from which the kernel skips the blocks nobody sees;
  (c) `Spec.cache_slots`: the slots a KV cache needs for sequences of a given length: the
      window, where there is one (modules/kv_cache.py keeps a ring buffer of them);
  (d) `Spec.within` and `Spec.blocks`: the rules on indices inside a kernel's block of queries
      against keys (no padding there: one training sequence), and whether a block's rectangle
      of indices holds some visible pair or only visible ones, from which a kernel skips the
      blocks nobody sees and leaves the mask off those everybody sees
      (modules/attn_pallas_hd64.py);
and, for the FLOP model and the plan, `Spec.span` (keys a query sees at most) and
`Spec.visible_pairs` (the (query, key) pairs of a row that a kernel computes).

A new mask option is a field here, the `option()` field of the same name in AttentionConfig
(modules/attention.py), its rule in `visible` and, where the kernel's masks can express it, in
`splash` (and its name in SPLASH), in `within` and `blocks` (and its name in BLOCKS).
Implementations declare the mask options they attend under (modules/attn_registry.py:
Supports.masks): DENSE (every option) for those that take `Mask.array`, SPLASH for splash, BLOCKS
for pallas_hd64; the layer refuses the rest in one line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa


@dataclasses.dataclass(frozen=True)
class Spec:
  """A layer's mask options (each an AttentionConfig field of the same name)."""
  # keys less than this many positions before the query's (itself included); None: all before
  sliding_window: int | None = None

  @classmethod
  def of(cls, cfg) -> "Spec":
    """The mask options of an AttentionConfig."""
    return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})

  @property
  def causal_only(self) -> bool:
    """No option set: plain causal attention."""
    return self == Spec()

  def visible(self, q_pos, k_pos):
    """Booleans [..., L, S]: whether the query at q_pos[..., L] sees the key at k_pos[..., S]
    (NumPy or jax arrays, broadcast against each other)."""
    q, k = q_pos[..., :, None], k_pos[..., None, :]
    return self.within(q, k) & ((k >= 0) | (q < 0))

  def within(self, q_index, k_index):
    """(d) Booleans: whether the query at q_index sees the key at k_index by the options'
    rules on positions (causal, the window), elementwise on arrays broadcast against each other
    (NumPy, jax, or a Pallas kernel's block of indices)."""
    seen = k_index <= q_index
    if self.sliding_window is not None:
      seen = seen & (q_index - k_index < self.sliding_window)
    return seen

  def blocks(self, q_first, q_last, k_first, k_last):
    """(d) For blocks of the queries q_first..q_last against the keys k_first..k_last (ends
    included; NumPy or jax arrays broadcast against each other): (whether `within` admits some
    pair of them, whether it admits every pair). The differences q - k of a block fill the
    range q_first - k_last .. q_last - k_first; `within` admits 0 .. window - 1."""
    some, every = k_first <= q_last, k_last <= q_first
    if self.sliding_window is not None:
      some = some & (q_first - k_last < self.sliding_window)
      every = every & (q_last - k_first < self.sliding_window)
    return some, every

  def dense(self, q_pos_BxL, k_pos_BxS, q_segments_BxL=None, k_segments_BxS=None):
    """(a) [B or 1, 1, L, S] booleans: `visible`, and the same segment where segment ids are
    given (both or neither)."""
    seen = self.visible(q_pos_BxL, k_pos_BxS)
    if q_segments_BxL is not None:
      seen = seen & (q_segments_BxL[:, :, None] == k_segments_BxS[:, None, :])
    return seen[:, None]

  def splash(self, shape: tuple[int, int], *, offset: int = 0):
    """(b) The splash kernel's mask of `shape` (queries, keys) for queries whose index is
    `offset` past their keys' first: CausalMask, or LocalMask with a window."""
    if self.sliding_window is None:
      return sa.CausalMask(shape, offset=offset)
    return sa.LocalMask(shape, window_size=(self.sliding_window - 1, 0), offset=offset)

  def cache_slots(self, length: int) -> int:
    """(c) KV-cache slots for sequences of up to `length` positions: every position, or the
    last `sliding_window` (a ring buffer: position p in slot p mod slots)."""
    return length if self.sliding_window is None else min(self.sliding_window, length)

  def span(self, length: int) -> int:
    """The most keys a query of a `length`-position row sees: min(window, length)."""
    return self.cache_slots(length)

  def visible_pairs(self, length: int) -> int:
    """The (query, key) pairs that `visible` admits in one row of `length` positions."""
    w = self.span(length)
    return w * (w + 1) // 2 + (length - w) * w


# The mask options, and those each form of the mask can express.
DENSE = tuple(f.name for f in dataclasses.fields(Spec))
SPLASH = ("sliding_window",)
BLOCKS = ("sliding_window",)  # `within` and `blocks`


@dataclasses.dataclass(frozen=True)
class Mask:
  """Which keys each query of an implementation's call sees: `spec`'s rules over one sequence
  (L = S, a token's index its position), packed documents kept apart by `segment_ids_BxL`
  (None: one document a row); or, where the caller has it as an array (a decode step's cache,
  a context shard's gathered keys, a block of `chunked`), `explicit_Bx1xLxS` ([B or 1, 1, L, S]
  booleans, made by `Spec.dense`), which only implementations that declare decoding or
  Context.GATHERED are given."""
  spec: Spec = Spec()
  segment_ids_BxL: Any = None
  explicit_Bx1xLxS: Any = None

  @property
  def causal_only(self) -> bool:
    """Plain causal attention: no option, no segments, no explicit mask."""
    return (self.spec.causal_only and self.segment_ids_BxL is None
            and self.explicit_Bx1xLxS is None)

  def array(self, length: int):
    """The mask as [B or 1, 1, L, S] booleans (`length`: L, the queries')."""
    if self.explicit_Bx1xLxS is not None:
      return self.explicit_Bx1xLxS
    index_1xL = jnp.arange(length)[None]
    return self.spec.dense(index_1xL, index_1xL, self.segment_ids_BxL, self.segment_ids_BxL)
