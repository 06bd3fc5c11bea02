"""Turning a data config into tokenized train/eval corpora.

File kinds are read and tokenized once at start-up, so every bad document is
found before the first step (and reported with its file and line); the
`tokens` kind memory-maps what `axtrain tokenize` wrote, for corpora too big
to tokenize on each start.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sysconfig
import zlib

import numpy as np

from core.registry import ConfigError
from trainer.data import documents, tokenizers
from trainer.data.config import FieldFileConfig, FileConfig, StdlibConfig, TokensConfig
from trainer.data.packing import TokenCorpus

META = "tokens.json"  # metadata file of a pre-tokenized directory
ENCODE_CHUNK = 512  # documents per tokenizer call


@dataclasses.dataclass
class Split:
  train: TokenCorpus
  eval: TokenCorpus
  vocab_size: int  # ids are < vocab_size
  skipped: int  # bad documents skipped (policy skip)
  describe: dict  # what the corpus is, for the resume check


def text_field(cfg: FileConfig) -> str | None:
  """The record field holding the text (jsonl, parquet), else None."""
  return cfg.field if isinstance(cfg, FieldFileConfig) else None


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


def read_docs(kind: str, path: str, *, field: str | None, errors: documents.Errors,
              what: str) -> tuple[list[str], list]:
  files = documents.expand(path, what=what)
  # Names relative to the corpus root, so that moving the corpus keeps its split.
  root = os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])
  keys, docs = [], []
  for file, place, doc in documents.READERS[kind](files, errors=errors, field=field):
    keys.append(os.path.relpath(file, root or ".") + place)
    docs.append(doc)
  if not docs:
    raise ConfigError(f"{what} '{path}': no documents found"
                      + (f" (all skipped as bad; first: {errors.first})" if errors.first else ""))
  return keys, docs


def stdlib_docs() -> tuple[list[str], list[bytes]]:
  """The running interpreter's standard-library .py files, sorted by relative path."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  paths = sorted((p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file()),
                 key=lambda p: p.relative_to(root).as_posix())
  return [p.relative_to(root).as_posix() for p in paths], [p.read_bytes() for p in paths]


def load(cfg: StdlibConfig | FileConfig | TokensConfig) -> Split:
  """Train and eval corpora for a (non-mixture) data config."""
  if isinstance(cfg, TokensConfig):
    return _load_tokens(cfg)
  tokenizer = tokenizers.TOKENIZERS.build(cfg.tokenizer)
  if isinstance(cfg, StdlibConfig):
    errors, field, path, eval_path = documents.Errors("stop"), None, None, None
    keys, docs = stdlib_docs()
    if tokenizer.cfg.kind != "bytes":  # a few stdlib test files are deliberately not UTF-8
      docs = [d.decode("utf-8", errors="replace") for d in docs]
  else:
    errors, field, path, eval_path = (documents.Errors(cfg.on_error), text_field(cfg), cfg.path,
                                      cfg.eval_path)
    keys, docs = read_docs(cfg.kind, path, field=field, errors=errors, what="data.path")
  tokens = encode_all(docs, tokenizer)
  if eval_path is not None:
    _, eval_docs = read_docs(cfg.kind, eval_path, field=field, errors=errors,
                             what="data.eval_path")
    train, held = TokenCorpus.from_docs(tokens), TokenCorpus.from_docs(
        encode_all(eval_docs, tokenizer))
  else:
    corpus = TokenCorpus.from_docs(tokens)
    mask = held_out(name_hashes(keys), cfg.eval_percent, what=f"data '{cfg.kind}'")
    train, held = corpus.subset(np.flatnonzero(~mask)), corpus.subset(np.flatnonzero(mask))
  describe = {"kind": cfg.kind, "path": path, "field": field,
              "tokenizer": tokenizer.describe(), "train_docs": train.num_docs,
              "train_tokens": train.num_tokens}
  return Split(train, held, tokenizer.vocab_size, errors.skipped, describe)


def _load_tokens(cfg: TokensConfig) -> Split:
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


def read_tokens_meta(path: str, *, what: str) -> dict:
  """The metadata of a directory written by `axtrain tokenize` (shards, dtype, tokenizer)."""
  root = pathlib.Path(path).expanduser()
  meta_path = root / META
  if not root.is_dir():
    raise ConfigError(f"{what} '{path}': no such directory (data.kind=tokens reads the output "
                      f"directory of `axtrain tokenize`)")
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
      records = documents.arrayrecord_records(str(root / f"{name}.array_record"))
      lens = np.array([len(r) // dtype.itemsize for r in records], np.int64)
      tokens = np.frombuffer(b"".join(records), dtype)
    arrays.append(tokens)
    lengths.append(np.asarray(lens, np.int64))
  doc_len = np.concatenate(lengths)
  doc_shard = np.concatenate([np.full(len(x), i, np.int32) for i, x in enumerate(lengths)])
  doc_start = np.concatenate([np.concatenate([[0], np.cumsum(x)[:-1]]).astype(np.int64)
                              for x in lengths])
  return TokenCorpus(tuple(arrays), doc_shard, doc_start, doc_len), meta
