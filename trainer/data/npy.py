"""Token ids in `.npy` files (`data.kind=npy`): corpora that another tool tokenized.

Each file holds one 1-D array of non-negative integer token ids (`np.save`), memory-mapped,
not copied. Documents end at `eos_id`, which stays in the document as the separator the
tokenizers append (a last piece after the final `eos_id` is a document too); with `eos_id`
None each file is one document. The files say nothing about what their ids mean, so the
config does: `tokenizer`, the one that made them (read for its vocabulary and description, not
run), or None for ids of the files' own making (vocabulary: the largest id + 1; such a corpus
mixes only with other `npy` corpora, trainer/data/mixture.py). Every file is read once at
start-up to find documents and check the ids, so a bad file stops the run before the first
step.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import numpy as np

from core.registry import REQUIRED, ConfigError, child
from trainer.data import documents, tokenizers
from trainer.data.base import DATA
from trainer.data.config import DEFAULT_EVAL_PERCENT, HeldOutConfig
from trainer.data.corpus import CorpusSource, Split, held_out, name_hashes
from trainer.data.packing import TokenCorpus


@dataclasses.dataclass(frozen=True, kw_only=True)
class NpyConfig(HeldOutConfig):
  kind: str = "npy"
  path: str = REQUIRED  # a .npy file, a glob or a directory of them: 1-D integer token ids
  eval_path: str | None = None  # held-out .npy files of the same ids; None: hold out eval_percent
  eos_id: int | None = None  # the id that ends each document (kept in it); None: a file a document
  # the tokenizer that made the ids (its vocabulary bounds them; mixtures compare it); None: ids
  # of the files' own making, vocabulary the largest id + 1
  tokenizer: Any = child("tokenizer", None)

  def check(self, *, vocab_size, seed):
    super().check(vocab_size=vocab_size, seed=seed)
    if self.eval_path is not None and self.eval_percent != DEFAULT_EVAL_PERCENT:
      raise ConfigError("set data.eval_path or data.eval_percent, not both")
    if self.eos_id is not None and self.eos_id < 0:
      raise ConfigError(f"data.eos_id must be a token id (>= 0) or None, got {self.eos_id}")


def read_ids(file: str) -> np.ndarray:
  """The file's ids, memory-mapped; ConfigError naming the file unless it is a non-empty 1-D
  array of non-negative integers."""
  try:
    ids = np.load(file, mmap_mode="r", allow_pickle=False)
  except (OSError, ValueError) as e:
    raise ConfigError(f"{file}: not a .npy array ({' '.join(str(e).split())[:100]})") from None
  if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
    raise ConfigError(f"{file}: holds a {ids.dtype} array of shape {ids.shape}; data.kind=npy "
                      f"reads 1-D integer token ids")
  if not len(ids):
    raise ConfigError(f"{file}: the array is empty")
  if ids.min() < 0:
    raise ConfigError(f"{file}: holds a negative id ({ids.min()}); token ids are >= 0")
  return ids


def read_corpus(path: str, eos_id: int | None, *, what: str) -> tuple[TokenCorpus, list[str]]:
  """The documents of the files under `path` (one shard a file) and their names (file relative
  to the corpus root, `:N` for the N-th document of a file), for the held-out hash."""
  files = documents.expand(path, what=what)
  root = os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])
  shards, doc_shard, doc_start, doc_len, names = [], [], [], [], []
  for i, file in enumerate(files):
    ids = read_ids(file)
    ends = [] if eos_id is None else list(np.flatnonzero(ids == eos_id) + 1)
    if not ends or ends[-1] != len(ids):
      ends.append(len(ids))
    starts = [0, *ends[:-1]]
    shards.append(ids)
    doc_shard += [i] * len(ends)
    doc_start += starts
    doc_len += [e - s for s, e in zip(starts, ends)]
    names += [f"{os.path.relpath(file, root or '.')}:{n}" for n in range(len(ends))]
  corpus = TokenCorpus(tuple(shards), np.array(doc_shard, np.int32),
                       np.array(doc_start, np.int64), np.array(doc_len, np.int64))
  return corpus, names


def _vocabulary(cfg: NpyConfig, corpora: list[TokenCorpus]) -> tuple[int, dict | None]:
  """(vocabulary size, the tokenizer's description or None): the tokenizer's, which every id
  must be below; without one, the largest id + 1."""
  shards = {id(shard): shard for corpus in corpora for shard in corpus.shards}  # shared: once
  top = max(int(shard.max()) for shard in shards.values())
  if cfg.tokenizer is None:
    return top + 1, None
  tokenizer = tokenizers.TOKENIZERS.build(cfg.tokenizer)
  if top >= tokenizer.vocab_size:
    raise ConfigError(f"data.path '{cfg.path}' holds id {top}, but data.tokenizer "
                      f"({tokenizer.name}) has {tokenizer.vocab_size} ids; name the tokenizer "
                      f"that made the ids, or data.tokenizer=None for ids of their own")
  return tokenizer.vocab_size, tokenizer.describe()


@DATA.register("npy", NpyConfig)
class NpySource(CorpusSource):

  @classmethod
  def load(cls, cfg: NpyConfig) -> Split:
    train, names = read_corpus(cfg.path, cfg.eos_id, what="data.path")
    if cfg.eval_path is not None:
      held, _ = read_corpus(cfg.eval_path, cfg.eos_id, what="data.eval_path")
    else:
      mask = held_out(name_hashes(names), cfg.eval_percent, what=f"data.path '{cfg.path}'")
      train, held = train.subset(np.flatnonzero(~mask)), train.subset(np.flatnonzero(mask))
    vocab, tokenizer = _vocabulary(cfg, [train, held])
    describe = {"kind": "npy", "path": cfg.path, "eos_id": cfg.eos_id,
                "train_docs": train.num_docs, "train_tokens": train.num_tokens}
    if tokenizer is not None:
      describe["tokenizer"] = tokenizer
    return Split(train, held, vocab, 0, describe)

  @classmethod
  def example(cls, directory: pathlib.Path) -> dict:
    """The example texts as UTF-8 bytes, each ended by ETX (3, the bytes tokenizer's EOS), in two
    uint16 files."""
    docs = tokenizers.build("bytes").encode(documents.example_texts())
    root = directory / "npy"
    root.mkdir()
    half = len(docs) // 2
    for n, part in enumerate((docs[:half], docs[half:])):
      np.save(root / f"ids-{n}.npy", np.concatenate(part).astype(np.uint16))
    return {"path": str(root), "eos_id": 3}
