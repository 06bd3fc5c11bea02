"""The config of each data kind: a dataclass with only the fields its source reads.

    axtrain --config=configs/tiny.py --config.data.kind=jsonl --config.data.path=corpus.jsonl

switches `data` from the config file's kind to `jsonl`'s node (core/paths.py:switch_kind):
`seq_len`, `batch_size`, `eval_percent` and the `tokenizer` node carry over, `path` is
set by the next override, and a field `jsonl` does not read is refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import ml_collections

from core.registry import REQUIRED, ConfigError, child, suggest
from trainer.data.base import DATA
from trainer.data.documents import FILE_KINDS

SHAPE_FIELDS = ("seq_len", "batch_size")  # a mixture's components take these from the mixture
CORPUS_KINDS = ("stdlib", *FILE_KINDS, "tokens")  # the kinds a mixture can hold
_EVAL_PERCENT = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Batches:
  seq_len: int = 256  # tokens per training sequence
  batch_size: int = 32  # global batch (sequences)

  def check(self, *, vocab_size: int, seed: int):
    del vocab_size, seed  # a tokenizer's vocabulary is checked when it is loaded
    if self.seq_len <= 0 or self.batch_size <= 0:
      raise ConfigError(f"data.seq_len and data.batch_size must be positive, got "
                        f"{self.seq_len} and {self.batch_size}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticConfig(_Batches):
  """Uniformly random tokens (benchmarks)."""
  kind: str = "synthetic"
  # tokens per document on average: > 0 packs rows from documents of random length, as the
  # corpus kinds pack theirs (batches carry positions and segment_ids); 0: one stream, no documents
  mean_doc_len: int = 0

  def check(self, *, vocab_size: int, seed: int):
    super().check(vocab_size=vocab_size, seed=seed)
    if self.mean_doc_len < 0 or self.mean_doc_len == 1:
      raise ConfigError(f"data.mean_doc_len must be 0 (no documents) or at least 2 tokens, got "
                        f"{self.mean_doc_len}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _HeldOut(_Batches):
  eval_percent: int = _EVAL_PERCENT  # share of documents held out for evaluation (%), by a hash of their name

  def check(self, *, vocab_size: int, seed: int):
    super().check(vocab_size=vocab_size, seed=seed)
    if not 0 < self.eval_percent < 100:
      raise ConfigError(f"data.eval_percent must be in 1..99, got {self.eval_percent}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Files(_HeldOut):
  path: str = REQUIRED  # file, glob (`**` recurses) or directory; tokens: an `axtrain tokenize` output
  eval_path: str | None = None  # held-out corpus of the same kind; None: hold out eval_percent

  def check(self, *, vocab_size: int, seed: int):
    super().check(vocab_size=vocab_size, seed=seed)
    if self.eval_path is not None and self.eval_percent != _EVAL_PERCENT:
      raise ConfigError("set data.eval_path or data.eval_percent, not both")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StdlibConfig(_HeldOut):
  """The running Python's standard-library .py files (the embedded demo corpus)."""
  kind: str = "stdlib"
  tokenizer: Any = child("tokenizer", kind="bytes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileConfig(_Files):
  """text (a file is a document) and arrayrecord (a record is a document)."""
  kind: str = "text"
  on_error: Literal["stop", "skip"] = "stop"  # bad document: stop with an error, or skip and count
  tokenizer: Any = child("tokenizer", kind="bytes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FieldFileConfig(FileConfig):
  """jsonl and parquet: the document is one field of a record."""
  kind: str = "jsonl"
  field: str = "text"  # jsonl key / parquet column holding the document text


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokensConfig(_Files):
  """Directories written by `axtrain tokenize` (they record their own tokenizer)."""
  kind: str = "tokens"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixtureConfig(_Batches):
  """Weighted corpora; each component is a data node of a corpus kind with a `weight`
  (build them with `component`), and takes seq_len and batch_size from the mixture."""
  kind: str = "mixture"
  sources: tuple = REQUIRED  # (component(...), ...)

  def check(self, *, vocab_size: int, seed: int):
    super().check(vocab_size=vocab_size, seed=seed)
    self.components()

  def components(self) -> list[tuple[float, Any]]:
    """(weight, parsed config) of each component."""
    if not self.sources:
      raise ConfigError("data kind 'mixture' needs data.sources, e.g. (component('jsonl', "
                        "path='a.jsonl', weight=0.7), component('text', path='b/*.txt', "
                        "weight=0.3)) from trainer.data.config")
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
  if kind not in CORPUS_KINDS:
    raise ConfigError(f"{where}: '{kind}' is not a corpus kind{suggest(kind, CORPUS_KINDS)}; "
                      f"choose one of {', '.join(CORPUS_KINDS)}")


def _parse_component(src: Any, i: int, *, seq_len: int, batch_size: int) -> tuple[float, Any]:
  where = f"data.sources[{i}]"
  if isinstance(src, ml_collections.ConfigDict):
    src = src.to_dict()
  if not isinstance(src, dict):
    raise ConfigError(f"{where} must be a data node with a weight (trainer.data.config."
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
