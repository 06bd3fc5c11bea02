"""A weighted mixture of corpus sources.

Every global batch holds a fixed number of rows from each component: the
largest-remainder rounding of weight_i * batch_size. Component i's rows at
step s are its rows s * n_i ... s * n_i + n_i - 1, so the mixture, like its
components, is a function of (seed, step); the rows are then shuffled within
the batch (seeded by step) so that each process slice holds every component.
"""

from __future__ import annotations

import numpy as np

from core.registry import ConfigError
from trainer.data.base import DATA, Batch, Source, StepIndexedIterator, local_rows
from trainer.data.config import MixtureConfig
from trainer.data.sources import CorpusSource


def allocate(weights: list[float], batch_size: int) -> list[int]:
  """Rows per component: largest-remainder rounding of the normalised weights."""
  share = np.asarray(weights, np.float64) / sum(weights) * batch_size
  counts = np.floor(share).astype(int)
  for i in np.argsort(-(share - counts), kind="stable")[:batch_size - counts.sum()]:
    counts[i] += 1
  return counts.tolist()


@DATA.register("mixture", MixtureConfig)
class MixtureSource(Source):

  def __init__(self, *, cfg: MixtureConfig, vocab_size: int, seed: int):
    self.batch_size, self.seq_len, self.seed = cfg.batch_size, cfg.seq_len, seed
    components = cfg.components()
    self.parts = [CorpusSource(cfg=part, vocab_size=vocab_size, seed=(seed, i))
                  for i, (_, part) in enumerate(components)]
    self.weights = [weight for weight, _ in components]
    self.counts = allocate(self.weights, cfg.batch_size)
    if 0 in self.counts:
      i = self.counts.index(0)
      raise ConfigError(f"data.sources[{i}] (weight {self.weights[i]}) gets no row of a "
                        f"{cfg.batch_size}-row batch; raise its weight or data.batch_size")
    for i, part in enumerate(self.parts):
      used = {k: part.stream["tokenizer"][k] for k in ("kind", "vocab_size")}
      want = {k: self.parts[0].stream["tokenizer"][k] for k in ("kind", "vocab_size")}
      if used != want:  # a pre-tokenized component brings its own tokenizer
        raise ConfigError(f"data.sources[{i}] is tokenized with {used} but data.sources[0] "
                          f"with {want}; all components must share one tokenizer")
    self.vocab_size = max(p.vocab_size for p in self.parts)
    self.stream = {"mixture": [p.stream for p in self.parts], "counts": self.counts}

  def fields(self) -> dict:
    return self.parts[0].fields()  # its rows are its components' rows

  def _batch(self, step: int, *, batch_size: int, counts: list[int], packers, shuffle: bool,
             rows: slice) -> Batch:
    parts = [packer.rows(step * n + np.arange(n)) for packer, n in zip(packers, counts)]
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = (np.random.default_rng([self.seed, step, 7]).permutation(batch_size) if shuffle
             else np.arange(batch_size))
    return {k: v[order[rows]] for k, v in batch.items()}

  def train_iterator(self, *, process_index: int, process_count: int) -> StepIndexedIterator:
    rows = local_rows(self.batch_size, process_index=process_index, process_count=process_count)
    packers = [p.train for p in self.parts]
    return StepIndexedIterator(
        lambda step: self._batch(step, batch_size=self.batch_size, counts=self.counts,
                                 packers=packers, shuffle=True, rows=rows), stream=self.stream)

  def eval_batches(self, *, batch_size, num_batches, process_index, process_count):
    rows = local_rows(batch_size, process_index=process_index, process_count=process_count,
                      what="eval.batch_size")
    counts = allocate(self.weights, batch_size)
    packers = [p.eval for p in self.parts]
    return [self._batch(i, batch_size=batch_size, counts=counts, packers=packers, shuffle=False,
                        rows=rows) for i in range(num_batches)]

  def metrics(self) -> dict:
    skipped = sum(p.skipped for p in self.parts)
    return {"data_skipped_documents": skipped} if skipped else {}
