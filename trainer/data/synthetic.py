"""Uniformly random tokens, for benchmarks: no I/O, a pure function of (seed, step); with
data.mean_doc_len, packed from documents of random length like a corpus (positions and
segment_ids), so that the step compiled and run is the one training on a corpus runs.
data.tokenizer (optional) names the model's tokenizer, which synthetic data does not read:
a converted model's (`axtrain convert`), kept by a switch to a text kind and used by
`axtrain generate`."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from core.registry import ConfigError, child
from trainer.data.base import DATA, Source, StepIndexedIterator, local_rows
from trainer.data.config import BatchShape
from trainer.data.packing import PACKED_FIELDS, packed_batch


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticConfig(BatchShape):
  """Uniformly random tokens (benchmarks)."""
  kind: str = "synthetic"
  # tokens per document on average: > 0 packs rows from documents of random length, as the
  # corpus kinds pack theirs (batches carry positions and segment_ids); 0: one stream, no documents
  mean_doc_len: int = 0
  # the tokenizer of the text the model is for (synthetic data reads none): a switch to a text
  # kind carries it, `axtrain generate` encodes prompts with it; None: none named (a text kind
  # switched to then asks for one)
  tokenizer: Any = child("tokenizer", None)

  def check(self, *, vocab_size: int, seed: Any):
    super().check(vocab_size=vocab_size, seed=seed)
    if self.mean_doc_len < 0 or self.mean_doc_len == 1:
      raise ConfigError(f"data.mean_doc_len must be 0 (no documents) or at least 2 tokens, got "
                        f"{self.mean_doc_len}")


def _random_batch(seed: tuple, step, rows: slice, batch_size, seq_len, vocab_size,
                  mean_doc_len: int = 0):
  """Rows `rows` of the global batch at `step` (the same whatever the process count)."""
  rng = np.random.default_rng([*seed, step])
  tokens = rng.integers(0, vocab_size, size=(batch_size, seq_len + 1), dtype=np.int32)
  if not mean_doc_len:
    tokens = tokens[rows]
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
            "weights": np.ones((len(tokens), seq_len), np.float32)}
  # A document starts at each token with probability 1 / mean_doc_len (geometric lengths);
  # a row starts a piece, positions counting from 0, as packing cuts documents into rows.
  starts = (rng.random((batch_size, seq_len + 1)) < 1 / mean_doc_len)[rows]
  starts[:, 0] = True
  index = np.arange(seq_len + 1)
  positions = index - np.maximum.accumulate(np.where(starts, index, 0), axis=1)
  return packed_batch(tokens[rows], np.cumsum(starts, axis=1), positions)


@DATA.register("synthetic", SyntheticConfig)
class SyntheticSource(Source):

  def __init__(self, *, cfg: SyntheticConfig, vocab_size: int, seed: int):
    self.vocab_size, self.seed = vocab_size, seed
    self.batch_size, self.seq_len = cfg.batch_size, cfg.seq_len
    self.mean_doc_len = cfg.mean_doc_len

  def fields(self) -> dict:
    return dict(PACKED_FIELDS) if self.mean_doc_len else super().fields()

  def train_iterator(self, *, process_index: int, process_count: int) -> StepIndexedIterator:
    rows = local_rows(self.batch_size, process_index=process_index, process_count=process_count)
    return StepIndexedIterator(lambda step: _random_batch(
        (self.seed,), step, rows, self.batch_size, self.seq_len, self.vocab_size,
        self.mean_doc_len))

  def eval_batches(self, *, batch_size, num_batches, process_index, process_count):
    rows = local_rows(batch_size, process_index=process_index, process_count=process_count,
                      what="eval.batch_size")
    return [_random_batch((self.seed, 1), i, rows, batch_size, self.seq_len, self.vocab_size,
                          self.mean_doc_len) for i in range(num_batches)]
