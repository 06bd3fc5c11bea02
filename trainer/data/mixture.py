"""A weighted mixture of corpus sources (`data.kind=mixture`).

Every global batch holds a fixed number of rows from each component: the
largest-remainder rounding of weight_i * batch_size. Component i's rows at
step s are its rows s * n_i ... s * n_i + n_i - 1, so the mixture, like its
components, is a function of (seed, step); the rows are then shuffled within
the batch (seeded by step) so that each process slice holds every component.

A component is the data node of any registered corpus kind (corpus.corpus_kinds: a new
source file is a component kind at once) with a `weight`, without seq_len and batch_size,
which the mixture sets for all; `component(kind, weight=..., **fields)` builds one. The
components' ids must mean the same (CorpusSource.ids): one tokenizer kind and vocabulary size,
or, for a kind that describes no tokenizer, that kind alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from core.registry import ConfigError, child_list, suggest
from trainer.data.base import DATA, Batch, Source, StepIndexedIterator, local_rows
from trainer.data.config import BatchShape
from trainer.data.corpus import corpus_kinds

SHAPE_FIELDS = ("seq_len", "batch_size")  # a mixture's components take these from the mixture
_EXAMPLE = ("(component('jsonl', path='a.jsonl', weight=0.7), component('text', "
            "path='b/*.txt', weight=0.3)) with component from trainer.data.mixture")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixtureConfig(BatchShape):
  """Weighted corpora; each component is a data node of a corpus kind with a `weight`
  (build them with `component`), and takes seq_len and batch_size from the mixture."""
  kind: str = "mixture"
  sources: tuple = child_list("data", omit=SHAPE_FIELDS, how=(
      "a tuple of weighted data nodes, which a config file sets: see configs/tiny_mixture.py"))

  def check(self, *, vocab_size: int, seed: Any):
    super().check(vocab_size=vocab_size, seed=seed)
    self.components()

  def components(self) -> list[tuple[float, Any]]:
    """(weight, parsed config) of each component."""
    if not self.sources:
      raise ConfigError(f"data kind 'mixture' needs data.sources, e.g. {_EXAMPLE}; a config "
                        f"file sets them (configs/tiny_mixture.py)")
    return [_parse_component(src, i, seq_len=self.seq_len, batch_size=self.batch_size)
            for i, src in enumerate(self.sources)]


def component(kind: str, *, weight: float, **fields) -> dict:
  """A mixture component: `kind`'s data node (every field, defaults filled) without the
  mixture's seq_len and batch_size, plus its weight."""
  _check_corpus_kind(kind, "component kind")
  node = DATA.node(kind, **fields).to_dict()
  return {"kind": kind, "weight": weight,
          **{k: v for k, v in node.items() if k not in (*SHAPE_FIELDS, "kind")}}


def _check_corpus_kind(kind: Any, where: str) -> None:
  kinds = corpus_kinds()
  if kind not in kinds:
    raise ConfigError(f"{where}: '{kind}' is not a corpus kind{suggest(kind, kinds)}; "
                      f"choose one of {', '.join(kinds)}")


def _parse_component(src: Any, i: int, *, seq_len: int, batch_size: int) -> tuple[float, Any]:
  where = f"data.sources[{i}]"
  if isinstance(src, ml_collections.ConfigDict):
    src = src.to_dict()
  if not isinstance(src, dict):
    raise ConfigError(f"{where} must be a data node with a weight (trainer.data.mixture."
                      f"component), got {src!r}")
  for key in SHAPE_FIELDS:
    if key in src:
      raise ConfigError(f"{where}.{key}: a component takes {key} from the mixture (data.{key})")
  _check_corpus_kind(src.get("kind"), f"{where}.kind")
  weight = src.get("weight")
  if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
    raise ConfigError(f"{where}.weight must be a positive number, got {weight!r}")
  node = {k: v for k, v in src.items() if k != "weight"}
  cfg = DATA.parse({**node, "seq_len": seq_len, "batch_size": batch_size}, where)
  cfg.check(vocab_size=0, seed=0)
  return float(weight), cfg


def _check_ids(parts: list) -> None:
  """Every component's ids must mean what the first one's do (CorpusSource.ids): a
  pre-tokenized corpus brings its own tokenizer, and a kind that describes none its own ids."""
  first = parts[0].ids()
  for i, part in enumerate(parts):
    if part.ids() != first:
      raise ConfigError(f"data.sources[{i}] holds {part.ids()} but data.sources[0] {first}; the "
                        f"components of a mixture must share one tokenizer (kind and vocabulary "
                        f"size), and a kind that describes none mixes only with its own kind")


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
    self.parts = [DATA.entry(part.kind).target(cfg=part, vocab_size=vocab_size, seed=(seed, i))
                  for i, (_, part) in enumerate(components)]
    self.weights = [weight for weight, _ in components]
    self.counts = allocate(self.weights, cfg.batch_size)
    if 0 in self.counts:
      i = self.counts.index(0)
      raise ConfigError(f"data.sources[{i}] (weight {self.weights[i]}) gets no row of a "
                        f"{cfg.batch_size}-row batch; raise its weight or data.batch_size")
    _check_ids(self.parts)
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

  @classmethod
  def example(cls, directory):
    """The jsonl and text kinds' examples, weighted 2 : 1."""
    (directory / "jsonl").mkdir()
    (directory / "text").mkdir()
    return {"sources": (
        component("jsonl", weight=2, **DATA.entry("jsonl").target.example(directory / "jsonl")),
        component("text", weight=1, **DATA.entry("text").target.example(directory / "text")))}
