"""Packing documents into fixed-length rows, as a pure function of (seed, row index).

Epoch e lays the documents end to end in a seeded random order (each
document already ends with the EOS separator) and cuts the stream into rows
of seq_len + 1 tokens at stride seq_len (the last token of a row is the first
of the next: every token is a target once). Row k of the endless stream is row
perm_e(k % R) of epoch e = k // R (R rows per epoch, perm_e a seeded permutation
when training, so a batch mixes windows from many documents), so any row can be computed without
reading the rows before it: that makes the data order a function of seed and
step, resume exact, and process slices independent.

Each row carries
  segment_ids  int32 >= 1, one per document piece in the row (0 = padding)
  positions    int32 position within the document piece, from 0
  weights      0 where the target belongs to another document or is padding
so attention (which honours segment ids) never crosses documents and no
token is trained to predict the next document's first token.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from core.registry import ConfigError
from trainer.data.base import TOKEN_FIELDS, Batch

# A packed batch's arrays (trainer/data/base.py:Source.fields): the tokens' and, per token, its
# document piece and its position in that piece.
PACKED_FIELDS = {**TOKEN_FIELDS, "positions": np.dtype(np.int32),
                 "segment_ids": np.dtype(np.int32)}


def packed_batch(tokens, segments, positions) -> Batch:
  """Rows of L + 1 tokens with their segment ids (0: padding) and positions -> the batch of
  L-token rows; a target in another piece than its input, or padding, has weight 0."""
  same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": same,
           "positions": positions[:, :-1], "segment_ids": segments[:, :-1]}
  return {k: v.astype(PACKED_FIELDS[k], copy=False) for k, v in batch.items()}


@dataclasses.dataclass(frozen=True)
class TokenCorpus:
  """Documents as slices of one or more token arrays (arrays may be memory-mapped)."""
  shards: tuple[np.ndarray, ...]  # 1-D integer token arrays
  doc_shard: np.ndarray  # int32 [N] shard of document i
  doc_start: np.ndarray  # int64 [N] offset of document i in its shard
  doc_len: np.ndarray  # int64 [N] tokens of document i

  @property
  def num_docs(self) -> int:
    return len(self.doc_len)

  @functools.cached_property
  def num_tokens(self) -> int:
    return int(self.doc_len.sum())

  @classmethod
  def from_docs(cls, docs: list[np.ndarray]) -> TokenCorpus:
    lengths = np.array([len(d) for d in docs], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    flat = np.concatenate(docs) if docs else np.zeros(0, np.int32)
    return cls((flat,), np.zeros(len(docs), np.int32), starts, lengths)

  def subset(self, index: np.ndarray) -> TokenCorpus:
    return TokenCorpus(self.shards, self.doc_shard[index], self.doc_start[index],
                       self.doc_len[index])

  def gather(self, doc: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Token `offset` of document `doc` (arrays of equal shape)."""
    out = np.empty(doc.shape, np.int32)
    if len(self.shards) == 1:
      out[...] = self.shards[0][self.doc_start[doc] + offset]
      return out
    shard = self.doc_shard[doc]
    for s, tokens in enumerate(self.shards):
      mask = shard == s
      out[mask] = tokens[self.doc_start[doc[mask]] + offset[mask]]
    return out


class Packer:
  """Rows of seq_len + 1 tokens from a corpus; `rows(indices)` gives a batch."""

  def __init__(self, corpus: TokenCorpus, *, seq_len: int, seed: tuple[int, ...], shuffle: bool,
               pad: bool, what: str):
    """shuffle: new seeded document order each epoch (training); else file order.
    pad: the stream ends after one epoch and its last row is padded (evaluation)."""
    if corpus.num_tokens < (2 if pad else seq_len + 1):
      raise ConfigError(f"{what} has {corpus.num_tokens} tokens in {corpus.num_docs} documents; "
                        f"a row needs {seq_len + 1}: add data or lower data.seq_len")
    self.corpus, self.seq_len, self.seed = corpus, seq_len, tuple(seed)
    self.shuffle, self.pad = shuffle, pad
    self._epochs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
    span = corpus.num_tokens - 1
    self.rows_per_epoch = -(-span // seq_len) if pad else span // seq_len

  def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(document order, start of each document in the epoch's stream (one extra = end),
    row order: which row of the stream is the epoch's k-th (None: in stream order))."""
    if epoch not in self._epochs:
      if len(self._epochs) >= 2:  # a batch spans at most two epochs
        self._epochs.pop(min(self._epochs))
      self._epochs[epoch] = self._make_epoch(epoch)
    return self._epochs[epoch]

  def _make_epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    n = self.corpus.num_docs
    rng = np.random.default_rng([*self.seed, epoch])
    order = rng.permutation(n) if self.shuffle else np.arange(n)
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(self.corpus.doc_len[order], out=starts[1:])
    # Rows are also visited in a seeded order: consecutive rows of the stream are neighbouring
    # windows of one document, and a batch of them would be one document's worth of gradient.
    row_order = rng.permutation(self.rows_per_epoch) if self.shuffle else None
    return order, starts, row_order

  def rows(self, index: np.ndarray) -> Batch:
    """Rows `index` (int array [B]) of the endless stream."""
    L = self.seq_len
    index = np.asarray(index, np.int64)
    tokens = np.zeros((len(index), L + 1), np.int32)
    piece = np.zeros((len(index), L + 1), np.int64)  # index of the document in the epoch order
    start = np.zeros((len(index), L + 1), np.int64)  # stream offset where that document starts
    valid = np.ones((len(index), L + 1), bool)
    epochs = index // self.rows_per_epoch
    if self.pad:  # one pass only: rows past the end are all padding
      valid &= (epochs == 0)[:, None]
      epochs = np.zeros_like(epochs)
    for epoch in np.unique(epochs):
      sel = epochs == epoch
      order, starts, row_order = self._epoch(int(epoch))
      row = index[sel] % self.rows_per_epoch
      row_start = (row if row_order is None else row_order[row]) * L
      p = row_start[:, None] + np.arange(L + 1)  # stream positions [b, L + 1]
      valid[sel] &= p < starts[-1]
      p = np.minimum(p, starts[-1] - 1)
      i = np.searchsorted(starts, p, side="right") - 1
      tokens[sel] = self.corpus.gather(order[i], p - starts[i])
      piece[sel] = i
      start[sel] = np.maximum(starts[i], row_start[:, None])
    segments = np.where(valid, piece - piece[:, :1] + 1, 0)
    positions = np.where(valid, np.arange(L + 1) - (start - (start[:, :1])), 0)
    return packed_batch(np.where(valid, tokens, 0), segments, positions)
