"""The embedded demo corpus (`data.kind=stdlib`): the running Python's standard-library .py files.

No download, every Python has it. A file is held out when crc32(relative path) % 100 <
eval_percent, so the split is deterministic for a given Python version.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sysconfig
from typing import Any

from trainer.data import tokenizers
from trainer.data.base import DATA
from trainer.data.config import HeldOutConfig, tokenizer_field
from trainer.data.corpus import CorpusSource, Split, encode_all, split_by_name


@dataclasses.dataclass(frozen=True, kw_only=True)
class StdlibConfig(HeldOutConfig):
  kind: str = "stdlib"
  tokenizer: Any = tokenizer_field()


def stdlib_docs() -> tuple[list[str], list[bytes]]:
  """The running interpreter's standard-library .py files, sorted by relative path."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  paths = sorted((p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file()),
                 key=lambda p: p.relative_to(root).as_posix())
  return [p.relative_to(root).as_posix() for p in paths], [p.read_bytes() for p in paths]


@DATA.register("stdlib", StdlibConfig)
class StdlibSource(CorpusSource):

  @classmethod
  def load(cls, cfg: StdlibConfig) -> Split:
    return _load(cfg)


# The embedded corpus does not change while we run: read it once per process even when
# several experiments build it (tests).
@functools.lru_cache(maxsize=2)
def _load(cfg: StdlibConfig) -> Split:
  tokenizer = tokenizers.TOKENIZERS.build(cfg.tokenizer)
  keys, docs = stdlib_docs()
  if tokenizer.cfg.kind != "bytes":  # a few stdlib test files are deliberately not UTF-8
    docs = [d.decode("utf-8", errors="replace") for d in docs]
  train, held = split_by_name(keys, encode_all(docs, tokenizer), cfg)
  describe = {"kind": cfg.kind, "path": None, "field": None, "tokenizer": tokenizer.describe(),
              "train_docs": train.num_docs, "train_tokens": train.num_tokens}
  return Split(train, held, tokenizer.vocab_size, 0, describe)
