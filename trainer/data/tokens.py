"""Pre-tokenized corpora (`data.kind=tokens`): the directories `axtrain tokenize` writes,
memory-mapped, for corpora too big to tokenize on each start. Each records its tokenizer."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from core.registry import REQUIRED, ConfigError
from trainer import disk
from trainer.data import arrayrecord, documents, tokenizers
from trainer.data.base import DATA
from trainer.data.config import DEFAULT_EVAL_PERCENT, HeldOutConfig
from trainer.data.corpus import CorpusSource, Split, held_out
from trainer.data.packing import TokenCorpus

META = "tokens.json"  # metadata file of a pre-tokenized directory


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokensConfig(HeldOutConfig):
  kind: str = "tokens"
  path: str = REQUIRED  # an `axtrain tokenize` output directory
  eval_path: str | None = None  # held-out directory, same tokenizer; None: hold out eval_percent

  def check(self, *, vocab_size, seed):
    super().check(vocab_size=vocab_size, seed=seed)
    if self.eval_path is not None and self.eval_percent != DEFAULT_EVAL_PERCENT:
      raise ConfigError("set data.eval_path or data.eval_percent, not both")


@DATA.register("tokens", TokensConfig)
class TokensSource(CorpusSource):

  @classmethod
  def load(cls, cfg: TokensConfig) -> Split:
    train, meta = read_tokens_dir(cfg.path, what="data.path")
    if cfg.eval_path is not None:
      held, eval_meta = read_tokens_dir(cfg.eval_path, what="data.eval_path")
      if eval_meta["tokenizer"] != meta["tokenizer"]:
        raise ConfigError(f"data.eval_path '{cfg.eval_path}' was tokenized with "
                          f"{eval_meta['tokenizer']}, data.path with {meta['tokenizer']}")
    else:
      # Pre-tokenized documents have no names; hash their index instead.
      index = np.arange(train.num_docs, dtype=np.uint64)
      mask = held_out((index * np.uint64(2654435761)) % np.uint64(2**32), cfg.eval_percent,
                      what=f"data.path '{cfg.path}'")
      train, held = train.subset(np.flatnonzero(~mask)), train.subset(np.flatnonzero(mask))
    describe = {"kind": "tokens", "path": cfg.path, "tokenizer": meta["tokenizer"],
                "train_docs": train.num_docs, "train_tokens": train.num_tokens}
    return Split(train, held, int(meta["tokenizer"]["vocab_size"]), 0, describe)

  @classmethod
  def example(cls, directory):
    """The example texts as `axtrain tokenize` writes them with the bytes tokenizer (one NumPy
    shard)."""
    tokenizer = tokenizers.build("bytes")
    docs = tokenizer.encode(documents.example_texts())
    root = directory / "tokens"
    root.mkdir()
    np.save(root / "shard-00000.tokens.npy", np.concatenate(docs))
    np.save(root / "shard-00000.lengths.npy", np.array([len(d) for d in docs], np.int64))
    meta = {"format": "npy", "dtype": tokenizer.dtype.name, "shards": ["shard-00000"],
            "tokenizer": tokenizer.describe(), "num_docs": len(docs),
            "num_tokens": sum(len(d) for d in docs)}
    (root / META).write_text(json.dumps(meta, indent=1) + "\n")
    return {"path": str(root)}


def read_tokens_meta(path: str, *, what: str) -> dict:
  """The metadata of a directory written by `axtrain tokenize` (shards, dtype, tokenizer)."""
  root = pathlib.Path(path).expanduser()
  meta_path = root / META
  if (why := disk.not_a(root, "directory")):
    raise ConfigError(f"{what} '{path}' {why} (data.kind=tokens reads "
                      f"the output directory of `axtrain tokenize`)")
  if not meta_path.is_file():
    raise ConfigError(f"{what} '{path}': no {META}; is it an `axtrain tokenize` output directory?")
  try:
    meta = json.loads(meta_path.read_text())
    missing = [k for k in ("shards", "dtype", "format", "tokenizer") if k not in meta]
    if missing:
      raise KeyError(missing[0])
    np.dtype(meta["dtype"])
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"{meta_path}: unreadable metadata ({e})") from None
  tokenizer = meta["tokenizer"]
  if not (isinstance(tokenizer, dict) and isinstance(tokenizer.get("kind"), str)
          and type(tokenizer.get("vocab_size")) is int and tokenizer["vocab_size"] > 0):
    raise ConfigError(f"{meta_path}: unreadable metadata (its tokenizer must name a kind and a "
                      f"positive vocab_size, got {tokenizer!r})")
  return meta


def read_tokens_dir(path: str, *, what: str) -> tuple[TokenCorpus, dict]:
  """A directory written by `axtrain tokenize` (NumPy or ArrayRecord shards)."""
  meta = read_tokens_meta(path, what=what)
  root = pathlib.Path(path).expanduser()
  shards, dtype, fmt = meta["shards"], np.dtype(meta["dtype"]), meta["format"]
  arrays, lengths = [], []
  for name in shards:
    if fmt == "npy":
      tokens_file, lengths_file = root / f"{name}.tokens.npy", root / f"{name}.lengths.npy"
      try:
        tokens = np.load(tokens_file, mmap_mode="r")
        lens = np.load(lengths_file)
      except (OSError, ValueError) as e:
        raise ConfigError(f"{tokens_file}: unreadable shard ({' '.join(str(e).split())[:120]})") \
            from None
      if tokens.dtype != dtype or int(lens.sum()) != len(tokens):
        raise ConfigError(f"{tokens_file}: does not match {lengths_file.name} and {META}; "
                          f"re-run `axtrain tokenize`")
    else:
      records = arrayrecord.records(str(root / f"{name}.array_record"))
      lens = np.array([len(r) // dtype.itemsize for r in records], np.int64)
      tokens = np.frombuffer(b"".join(records), dtype)
    arrays.append(tokens)
    lengths.append(np.asarray(lens, np.int64))
  doc_len = np.concatenate(lengths)
  doc_shard = np.concatenate([np.full(len(x), i, np.int32) for i, x in enumerate(lengths)])
  doc_start = np.concatenate([np.concatenate([[0], np.cumsum(x)[:-1]]).astype(np.int64)
                              for x in lengths])
  return TokenCorpus(tuple(arrays), doc_shard, doc_start, doc_len), meta
