"""The corpus sources: stdlib (the embedded demo corpus), text, jsonl, parquet, arrayrecord,
and tokens (pre-tokenized by `axtrain tokenize`). They differ only in how documents are
read (trainer/data/corpus.py); all pack documents the same way (trainer/data/packing.py).

The stdlib kind reads the running interpreter's standard-library `.py` files (no
download, every Python has it); a file is held out when crc32(relative path) % 100 <
eval_percent, so the split is deterministic for a given Python version.
"""

from __future__ import annotations

import dataclasses
import functools

from core.registry import ConfigError
from trainer.data import corpus as corpus_lib
from trainer.data.base import DATA, Batch, Source, StepIndexedIterator, local_rows, process_rows
from trainer.data.config import FieldFileConfig, FileConfig, StdlibConfig, TokensConfig
from trainer.data.packing import PACKED_FIELDS, Packer


def check_vocab(vocab: int, model_vocab: int, what: str) -> None:
  if vocab > model_vocab:
    raise ConfigError(f"{what} has {vocab} ids but model.vocab_size is {model_vocab}; set "
                      f"--config.model.vocab_size={vocab} (or more)")


CorpusConfig = StdlibConfig | FileConfig | TokensConfig


@functools.lru_cache(maxsize=2)
def _load_stdlib(cfg: StdlibConfig) -> corpus_lib.Split:
  return corpus_lib.load(cfg)


def _load(cfg: CorpusConfig) -> corpus_lib.Split:
  # The embedded corpus does not change while we run: read it once per process even when
  # several experiments build it (tests); user files are read afresh every time.
  return _load_stdlib(cfg) if isinstance(cfg, StdlibConfig) else corpus_lib.load(cfg)


class CorpusSource(Source):
  """Packed rows of a tokenized corpus; the batch at a step is a function of (seed, step)."""

  def __init__(self, *, cfg: CorpusConfig, vocab_size: int, seed: int | tuple):
    self.cfg = cfg
    self.batch_size, self.seq_len = cfg.batch_size, cfg.seq_len
    split = _load(dataclasses.replace(cfg, seq_len=1, batch_size=1))
    check_vocab(split.vocab_size, vocab_size, f"the tokenizer of data kind '{cfg.kind}'")
    self.vocab_size, self.skipped = split.vocab_size, split.skipped
    seed = tuple(seed) if isinstance(seed, tuple) else (seed,)
    self.train = Packer(split.train, seq_len=cfg.seq_len, seed=seed, shuffle=True, pad=False,
                        what=f"the training split of data '{cfg.kind}'")
    self.eval = Packer(split.eval, seq_len=cfg.seq_len, seed=seed, shuffle=False, pad=True,
                       what=f"the held-out split of data '{cfg.kind}'")
    self.stream = {**split.describe, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
                   "seed": list(seed)}

  def fields(self) -> dict:
    return dict(PACKED_FIELDS)

  def train_iterator(self, *, process_index: int, process_count: int) -> StepIndexedIterator:
    local_rows(self.batch_size, process_index=process_index,
               process_count=process_count)  # refuses a batch the processes cannot split
    rows = functools.partial(process_rows, batch_size=self.batch_size,
                             process_index=process_index, process_count=process_count)
    return StepIndexedIterator(lambda step: self.train.rows(rows(step)), stream=self.stream)

  def eval_batches(self, *, batch_size, num_batches, process_index, process_count) -> list[Batch]:
    return [self.eval.rows(process_rows(i, batch_size=batch_size, process_index=process_index,
                                        process_count=process_count, what="eval.batch_size"))
            for i in range(num_batches)]

  def metrics(self) -> dict:
    return {"data_skipped_documents": self.skipped} if self.skipped else {}


DATA.register("stdlib", StdlibConfig)(CorpusSource)
DATA.register("text", FileConfig)(CorpusSource)
DATA.register("arrayrecord", FileConfig)(CorpusSource)
DATA.register("jsonl", FieldFileConfig)(CorpusSource)
DATA.register("parquet", FieldFileConfig)(CorpusSource)
DATA.register("tokens", TokensConfig)(CorpusSource)
