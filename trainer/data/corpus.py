"""Corpus sources: documents tokenized at start-up (or memory-mapped), packed into rows.

A corpus kind is a `CorpusSource` subclass registered in `DATA` with its config; it says
how to get its `Split` (train and held-out token corpora) and inherits the packing, the
step-indexed iterators and the held-out batches. `DocumentSource` is the base of the kinds
that read user files: a kind gives only `documents(cfg, files, errors=...)`, the documents
of its files, and its config (a `DocumentFilesConfig` with the reader's own fields). So a
file format is one file of this package: its config, its reader, its registration.
Mixtures (mixture.py) and `axtrain tokenize` find them here by walking the registry
(`corpus_kinds`, `document_kinds`).

File kinds are read and tokenized once at start-up, so every bad document is found before
the first step (and reported with its file and line).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import os
import pathlib
import zlib
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from core.registry import ConfigError
from trainer.data import documents, tokenizers
from trainer.data.base import DATA, Batch, Source, StepIndexedIterator, local_rows, process_rows
from trainer.data.config import DocumentFilesConfig, HeldOutConfig
from trainer.data.packing import PACKED_FIELDS, Packer, TokenCorpus

ENCODE_CHUNK = 512  # documents per tokenizer call


@dataclasses.dataclass
class Split:
  train: TokenCorpus
  eval: TokenCorpus
  vocab_size: int  # ids are < vocab_size
  skipped: int  # bad documents skipped (policy skip)
  # What the corpus is, for the resume check. Its "tokenizer", where the ids come from one, is
  # that tokenizer's description (Tokenizer.describe(): kind, vocab_size, ...), which a
  # mixture compares between its components (CorpusSource.ids); a corpus whose ids are of its
  # kind's own making leaves it out.
  describe: dict


def check_vocab(vocab: int, model_vocab: int, what: str) -> None:
  if vocab > model_vocab:
    raise ConfigError(f"{what} has {vocab} ids but model.vocab_size is {model_vocab}; set "
                      f"--config.model.vocab_size={vocab} (or more)")


def held_out(hashes: np.ndarray, percent: int, *, what: str) -> np.ndarray:
  """Boolean [N]: documents whose hash % 100 < percent go to evaluation.

  A small corpus may get no held-out document that way; then the one with the smallest
  hash is held out (and the largest kept for training), so both splits are never empty.
  """
  if len(hashes) < 2:
    raise ConfigError(f"{what} has {len(hashes)} document(s); holding one out for evaluation "
                      f"needs two or more, or set data.eval_path")
  bucket = hashes % 100
  mask = bucket < percent
  if not mask.any():
    mask[np.argmin(bucket)] = True
  if mask.all():
    mask[np.argmax(bucket)] = False
  return mask


def name_hashes(keys: list[str]) -> np.ndarray:
  return np.array([zlib.crc32(k.encode()) for k in keys], np.uint64)


def encode_all(docs: list, tokenizer: tokenizers.Tokenizer) -> list[np.ndarray]:
  out = []
  for i in range(0, len(docs), ENCODE_CHUNK):
    out.extend(tokenizer.encode(docs[i:i + ENCODE_CHUNK]))
  return out


def split_by_name(keys: list[str], tokens: list[np.ndarray], cfg: HeldOutConfig
                  ) -> tuple[TokenCorpus, TokenCorpus]:
  """(train, held-out) of named documents: eval_percent of them, by a hash of the name."""
  corpus = TokenCorpus.from_docs(tokens)
  mask = held_out(name_hashes(keys), cfg.eval_percent, what=f"data '{cfg.kind}'")
  return corpus.subset(np.flatnonzero(~mask)), corpus.subset(np.flatnonzero(mask))


class CorpusSource(Source):
  """Packed rows of a tokenized corpus; the batch at a step is a function of (seed, step).

  A subclass gives `load(cfg) -> Split`; mixtures hold any registered CorpusSource kind.
  """

  def __init__(self, *, cfg: HeldOutConfig, vocab_size: int, seed: int | tuple):
    self.cfg = cfg
    self.batch_size, self.seq_len = cfg.batch_size, cfg.seq_len
    split = self.load(dataclasses.replace(cfg, seq_len=1, batch_size=1))
    check_vocab(split.vocab_size, vocab_size, f"the tokenizer of data kind '{cfg.kind}'")
    self.vocab_size, self.skipped = split.vocab_size, split.skipped
    seed = tuple(seed) if isinstance(seed, tuple) else (seed,)
    self.train = Packer(split.train, seq_len=cfg.seq_len, seed=seed, shuffle=True, pad=False,
                        what=f"the training split of data '{cfg.kind}'")
    self.eval = Packer(split.eval, seq_len=cfg.seq_len, seed=seed, shuffle=False, pad=True,
                       what=f"the held-out split of data '{cfg.kind}'")
    self.stream = {**split.describe, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
                   "seed": list(seed)}

  @classmethod
  @abc.abstractmethod
  def load(cls, cfg) -> Split:
    """Train and held-out corpora of `cfg` (whose seq_len and batch_size are 1)."""

  def fields(self) -> dict:
    return dict(PACKED_FIELDS)  # documents packed into rows (trainer/data/packing.py)

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

  def ids(self) -> str:
    """What its token ids mean, which the components of a mixture must share: the tokenizer
    (kind and vocabulary size) that the corpus describes, else the data kind, whose own making
    they are (such a corpus mixes only with corpora of its kind)."""
    tokenizer = self.stream.get("tokenizer")
    if isinstance(tokenizer, dict):
      return f"the {tokenizer.get('kind')} tokenizer's {tokenizer.get('vocab_size')} ids"
    return f"the ids of data kind '{self.cfg.kind}', which describes no tokenizer"


class DocumentSource(CorpusSource):
  """A corpus read from user files (`cfg.path`, a file, glob or directory), document by
  document; a subclass gives the reader, and the endings of its files' names (`SUFFIXES`,
  lowercase), from which `axtrain tokenize` infers the kind of its input."""

  SUFFIXES: ClassVar[tuple[str, ...]] = ()

  @staticmethod
  @abc.abstractmethod
  def documents(cfg: DocumentFilesConfig, files: list[str], *,
                errors: documents.Errors) -> Iterator[documents.Doc]:
    """(file, place in the file, text) of each document of `files`, in order."""

  @staticmethod
  @abc.abstractmethod
  def write(directory: pathlib.Path, texts: list[str]) -> str:
    """Writes `texts` under `directory` in this format, each a document that `documents` gives
    back unchanged with the config's defaults (`field`, `column`...); returns the `path` to read
    them from. The example corpus of the kind (`example`), and its round-trip test."""

  @classmethod
  def example(cls, directory: pathlib.Path) -> dict:
    return {"path": cls.write(directory, documents.example_texts())}

  @classmethod
  def read(cls, cfg: DocumentFilesConfig, path: str, *, errors: documents.Errors,
           what: str) -> tuple[list[str], list[str]]:
    """(names relative to the corpus root, texts) of the documents under `path`."""
    files = documents.expand(path, what=what)
    # Names relative to the corpus root, so that moving the corpus keeps its split.
    root = os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])
    keys, docs = [], []
    for file, place, doc in cls.documents(cfg, files, errors=errors):
      keys.append(os.path.relpath(file, root or ".") + place)
      docs.append(doc)
    if not docs:
      raise ConfigError(f"{what} '{path}': no documents found"
                        + (f" (all skipped as bad; first: {errors.first})" if errors.first else ""))
    if not any(docs):  # nothing to train on; "has 1 document(s)" would hide why
      raise ConfigError(f"{what} '{path}': " + ("the file is empty" if len(docs) == 1 else
                                                 f"all {len(docs)} documents are empty"))
    return keys, docs

  @classmethod
  def load(cls, cfg: DocumentFilesConfig) -> Split:
    tokenizer = tokenizers.TOKENIZERS.build(cfg.tokenizer)
    errors = documents.Errors(cfg.on_error)
    keys, docs = cls.read(cfg, cfg.path, errors=errors, what="data.path")
    tokens = encode_all(docs, tokenizer)
    if cfg.eval_path is not None:
      _, eval_docs = cls.read(cfg, cfg.eval_path, errors=errors, what="data.eval_path")
      train, held = TokenCorpus.from_docs(tokens), TokenCorpus.from_docs(
          encode_all(eval_docs, tokenizer))
    else:
      train, held = split_by_name(keys, tokens, cfg)
    # The reader's own fields say which text was read (a checkpoint's resume check compares
    # them); `field` is always present, as in checkpoints written before other readers.
    common = {f.name for f in dataclasses.fields(DocumentFilesConfig)}
    own = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in common}
    describe = {"kind": cfg.kind, "path": cfg.path, "field": None, **own,
                "tokenizer": tokenizer.describe(), "train_docs": train.num_docs,
                "train_tokens": train.num_tokens}
    return Split(train, held, tokenizer.vocab_size, errors.skipped, describe)


def _kinds(base: type) -> list[str]:
  return [k for k in DATA.kinds() if isinstance(DATA.entry(k).target, type)
          and issubclass(DATA.entry(k).target, base)]


def corpus_kinds() -> list[str]:
  """The registered kinds a mixture can hold."""
  return _kinds(CorpusSource)


def document_kinds() -> list[str]:
  """The registered kinds that read user files (also `axtrain tokenize --kind`)."""
  return _kinds(DocumentSource)


def kinds_of(files: list[str]) -> dict[str, str | None]:
  """Each file's name ending (lowercase; '' for none) -> the document kind whose SUFFIXES hold
  it, None where no kind's do. An ending may have several parts (`.jsonl.gz`): a file's is the
  longest that a kind names, else its last suffix."""
  by_suffix = {s: k for k in document_kinds() for s in DATA.entry(k).target.SUFFIXES}
  endings = set()
  for f in files:
    name = pathlib.PurePath(f).name.lower()
    endings.add(max((s for s in by_suffix if name.endswith(s)), key=len,
                    default=pathlib.PurePath(name).suffix))
  return {e: by_suffix.get(e) for e in sorted(endings)}
