"""Uniformly random tokens, for benchmarks: no I/O, a pure function of (seed, step)."""

from __future__ import annotations

import dataclasses

import numpy as np

from trainer.data.base import DATA, Source, StepIndexedIterator, local_rows
from trainer.data.config import BatchShape


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticConfig(BatchShape):
  """Uniformly random tokens (benchmarks)."""
  kind: str = "synthetic"


def _random_batch(seed: tuple, step, rows: slice, batch_size, seq_len, vocab_size):
  """Rows `rows` of the global batch at `step` (the same whatever the process count)."""
  rng = np.random.default_rng([*seed, step])
  tokens = rng.integers(0, vocab_size, size=(batch_size, seq_len + 1), dtype=np.int32)[rows]
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "weights": np.ones((len(tokens), seq_len), np.float32)}


@DATA.register("synthetic", SyntheticConfig)
class SyntheticSource(Source):

  def __init__(self, *, cfg: SyntheticConfig, vocab_size: int, seed: int):
    self.vocab_size, self.seed = vocab_size, seed
    self.batch_size, self.seq_len = cfg.batch_size, cfg.seq_len

  def train_iterator(self, *, process_index: int, process_count: int) -> StepIndexedIterator:
    rows = local_rows(self.batch_size, process_index=process_index, process_count=process_count)
    return StepIndexedIterator(lambda step: _random_batch(
        (self.seed,), step, rows, self.batch_size, self.seq_len, self.vocab_size))

  def eval_batches(self, *, batch_size, num_batches, process_index, process_count):
    rows = local_rows(batch_size, process_index=process_index, process_count=process_count,
                      what="eval.batch_size")
    return [_random_batch((self.seed, 1), i, rows, batch_size, self.seq_len, self.vocab_size)
            for i in range(num_batches)]
