"""The fields that data kinds share, as bases for the config of each kind.

    BatchShape           seq_len, batch_size                       every kind
    HeldOutConfig        + eval_percent                            corpora split train / held-out
    DocumentFilesConfig  + path, eval_path, on_error, tokenizer    user files, document by document

Each kind's config, reader and registration live in one file of this package (text.py,
jsonl.py, csv.py, ...); its node holds only the fields its source reads, so

    axtrain --config=configs/tiny.py --config.data.kind=jsonl --config.data.path=corpus.jsonl

switches `data` from the config file's kind to `jsonl`'s node (core/paths.py:switch_kind):
the fields both kinds share (`SHARED`: `seq_len`, `batch_size`, `eval_percent`, the
`tokenizer` node) carry over, `path` is set by the next override, and a field `jsonl` does
not read is refused by name.

A text kind's `tokenizer` (`tokenizer_field`) is bytes unless set, but a switch from a kind
that names none (`synthetic` with `tokenizer` None: the larger configs, a converted model
whose tokenizer is not known) carries None, and parse refuses it with how to name one: the
ids of such a model mean its own tokenizer's tokens, which UTF-8 bytes are not.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from core.registry import REQUIRED, ConfigError, child

DEFAULT_EVAL_PERCENT = 2

NO_TOKENIZER = ("the data kind it was switched from names no tokenizer; name the model's: "
                "--config.data.tokenizer.kind=huggingface "
                "--config.data.tokenizer.path=PATH/TO/tokenizer.json (or .kind=sentencepiece "
                "with its .model, or .kind=bytes for UTF-8 bytes)")


def tokenizer_field() -> Any:
  """The `tokenizer` child of a kind that reads text: bytes unless set; None (carried by a
  switch from a kind that names no tokenizer) is refused with how to name one."""
  return child("tokenizer", kind="bytes", how=NO_TOKENIZER)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchShape:
  seq_len: int = 256  # tokens per training sequence
  batch_size: int = 32  # global batch (sequences)
  SHARED: ClassVar = ("seq_len", "batch_size")  # a mixture's components take these from it
  # shared fields keep their meaning across kinds: a kind switch carries them (core/registry.py)

  def check(self, *, vocab_size: int, seed: Any):
    del vocab_size, seed  # a tokenizer's vocabulary is checked when it is loaded
    if self.seq_len <= 0 or self.batch_size <= 0:
      raise ConfigError(f"data.seq_len and data.batch_size must be positive, got "
                        f"{self.seq_len} and {self.batch_size}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeldOutConfig(BatchShape):
  # share of documents held out for evaluation (%), by a hash of their name
  eval_percent: int = DEFAULT_EVAL_PERCENT
  SHARED: ClassVar = (*BatchShape.SHARED, "eval_percent")

  def check(self, *, vocab_size: int, seed: Any):
    super().check(vocab_size=vocab_size, seed=seed)
    if not 0 < self.eval_percent < 100:
      raise ConfigError(f"data.eval_percent must be in 1..99, got {self.eval_percent}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DocumentFilesConfig(HeldOutConfig):
  """User files read document by document (corpus.DocumentSource); a kind adds the fields
  its reader needs (jsonl's `field`, csv's `column`)."""
  kind: str = REQUIRED
  path: str = REQUIRED  # file, glob (`**` recurses) or directory
  eval_path: str | None = None  # held-out corpus of the same kind; None: hold out eval_percent
  on_error: Literal["stop", "skip"] = "stop"  # bad document: stop with an error, or skip and count
  tokenizer: Any = tokenizer_field()
  SHARED: ClassVar = (*HeldOutConfig.SHARED, "path", "eval_path", "on_error")

  def check(self, *, vocab_size: int, seed: Any):
    super().check(vocab_size=vocab_size, seed=seed)
    if self.eval_path is not None and self.eval_percent != DEFAULT_EVAL_PERCENT:
      raise ConfigError("set data.eval_path or data.eval_percent, not both")
