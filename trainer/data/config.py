"""The one config node shared by every data kind, so that a kind switch is one override.

    axtrain --config=configs/tiny.py --config.data.kind=jsonl --config.data.path=corpus.jsonl

Config nodes are locked and typed, so if each kind had its own fields the
override above could not work (the node of `stdlib` has no `path`). Every kind
registers this same dataclass instead; `check` refuses a field that the
selected kind does not use when it differs from its default, so nothing is
silently ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from core.registry import ConfigError, suggest

FILE_KINDS = ("text", "jsonl", "parquet", "arrayrecord")
TOKENIZER_FIELDS = ("tokenizer", "tokenizer_path", "add_bos", "add_eos")
_FILE_FIELDS = ("path", "eval_path", "on_error", *TOKENIZER_FIELDS)

# Fields each kind reads besides kind, seq_len and batch_size.
USES: dict[str, tuple[str, ...]] = {
    "stdlib": ("eval_percent", *TOKENIZER_FIELDS),
    "synthetic": (),
    "text": (*_FILE_FIELDS, "eval_percent"),
    "jsonl": (*_FILE_FIELDS, "eval_percent", "field"),
    "parquet": (*_FILE_FIELDS, "eval_percent", "field"),
    "arrayrecord": (*_FILE_FIELDS, "eval_percent"),
    "tokens": ("path", "eval_path", "eval_percent"),
    "mixture": ("sources", "on_error", *TOKENIZER_FIELDS),
}
# Keys a mixture component may set; the rest (tokenizer, seq_len, ...) comes from data.
COMPONENT_KEYS = ("kind", "weight", "path", "field", "eval_path", "eval_percent")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  kind: str = "stdlib"
  seq_len: int = 256  # tokens per training sequence
  batch_size: int = 32  # global batch (sequences)
  path: str | None = None  # file, glob or directory of the corpus (file kinds; `tokens`: a tokenize dir)
  field: str = "text"  # jsonl key / parquet column holding the document text
  eval_path: str | None = None  # held-out corpus of the same kind; None: hold out eval_percent
  eval_percent: int = 2  # share of documents held out for evaluation (%), by a hash of their name
  tokenizer: str = "bytes"  # bytes | sentencepiece | huggingface
  tokenizer_path: str | None = None  # SentencePiece .model or Hugging Face tokenizer.json file
  add_bos: bool = False  # prepend the tokenizer's BOS id to every document
  add_eos: bool = True  # append the tokenizer's EOS id to every document (the packing separator)
  on_error: Literal["stop", "skip"] = "stop"  # bad document: stop with an error, or skip and count
  sources: tuple = ()  # mixture: ({"kind": ..., "weight": ..., "path": ..., "field": ...}, ...)

  def check(self, *, vocab_size: int, seed: int):
    del vocab_size, seed  # the tokenizer's vocabulary is checked when it is loaded
    if self.seq_len <= 0 or self.batch_size <= 0:
      raise ConfigError(f"data.seq_len and data.batch_size must be positive, got "
                        f"{self.seq_len} and {self.batch_size}")
    uses = USES[self.kind]
    defaults = DataConfig()
    for f in dataclasses.fields(self):
      if f.name in ("kind", "seq_len", "batch_size") or f.name in uses:
        continue
      if getattr(self, f.name) != getattr(defaults, f.name):
        users = [k for k, v in USES.items() if f.name in v]
        raise ConfigError(f"data.{f.name} is not used by data kind '{self.kind}' (it is used by "
                          f"{', '.join(users)}); remove the override or change data.kind")
    if "path" in uses and self.kind != "mixture" and not self.path:
      raise ConfigError(f"data kind '{self.kind}' needs data.path (a file, glob or directory), "
                        f"e.g. --config.data.path=corpus.{_EXT.get(self.kind, 'txt')}")
    if "eval_percent" in uses:
      if self.eval_path is not None and self.eval_percent != defaults.eval_percent:
        raise ConfigError("set data.eval_path or data.eval_percent, not both")
      if not 0 < self.eval_percent < 100:
        raise ConfigError(f"data.eval_percent must be in 1..99, got {self.eval_percent}")
    if self.kind == "mixture":
      check_components(self.sources)


_EXT = {"jsonl": "jsonl", "parquet": "parquet", "arrayrecord": "array_record", "tokens": "d"}


def check_components(sources) -> None:
  if not sources:
    raise ConfigError("data kind 'mixture' needs data.sources, e.g. "
                      "({'kind': 'jsonl', 'path': 'a.jsonl', 'weight': 0.7}, "
                      "{'kind': 'text', 'path': 'b/*.txt', 'weight': 0.3})")
  for i, src in enumerate(sources):
    where = f"data.sources[{i}]"
    if not isinstance(src, dict):
      raise ConfigError(f"{where} must be a dict with kind, weight, path, got {src!r}")
    for key in src:
      if key not in COMPONENT_KEYS:
        raise ConfigError(f"{where}: unknown key '{key}'{suggest(key, COMPONENT_KEYS)}; keys: "
                          f"{', '.join(COMPONENT_KEYS)} (tokenizer and shapes come from data)")
    kind = src.get("kind")
    if kind not in USES or kind in ("mixture", "synthetic"):
      choices = [k for k in USES if k not in ("mixture", "synthetic")]
      raise ConfigError(f"{where}.kind: '{kind}' is not a corpus kind{suggest(kind, choices)}; "
                        f"choose one of {', '.join(choices)}")
    weight = src.get("weight")
    if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
      raise ConfigError(f"{where}.weight must be a positive number, got {weight!r}")


def component(cfg: DataConfig, src: dict) -> DataConfig:
  """The DataConfig of one mixture component: its own corpus keys, the mixture's tokenizer."""
  values = {k: v for k, v in src.items() if k != "weight"}
  out = dataclasses.replace(cfg, sources=(), **values)
  if out.kind in ("stdlib", "tokens"):
    out = dataclasses.replace(out, on_error=DataConfig.on_error)
  if out.kind == "tokens":
    out = dataclasses.replace(out, **{k: getattr(DataConfig, k) for k in TOKENIZER_FIELDS})
  out.check(vocab_size=0, seed=0)
  return out
