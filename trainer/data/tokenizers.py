"""Tokenizers (the `tokenizer` registry): bytes, SentencePiece, Hugging Face tokenizer.json.

Each turns a list of documents into a list of int32 id arrays, adding BOS/EOS
ids when asked. Loading problems (missing file, not a model, no EOS id)
raise ConfigError naming the file.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import numpy as np

from core.registry import REQUIRED, ConfigError, Registry
from trainer import disk

TOKENIZERS = Registry("tokenizer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BytesConfig:
  kind: str = "bytes"
  add_bos: bool = False  # prepend BOS (STX, 2) to each document
  add_eos: bool = True  # append EOS (ETX, 3) to each document (the packing separator)
  SHARED: ClassVar = ("add_bos", "add_eos")  # kept by a switch to another tokenizer


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelFileConfig:
  kind: str = "sentencepiece"
  path: str = REQUIRED  # model file: SentencePiece .model, Hugging Face tokenizer.json
  add_bos: bool = False  # prepend the model's BOS id to each document
  add_eos: bool = True  # append the model's EOS id to each document (the packing separator)
  SHARED: ClassVar = ("add_bos", "add_eos")  # not path: a .model is not a tokenizer.json

  def check(self):
    if (why := disk.not_a(self.path, "file")):
      raise ConfigError(f"tokenizer file '{self.path}' {why}")


class Tokenizer(abc.ABC):
  """Common BOS/EOS handling; subclasses set vocab_size, bos_id, eos_id and _encode."""
  vocab_size: int
  bos_id: int | None
  eos_id: int | None
  name: str

  def __init__(self, cfg: BytesConfig | ModelFileConfig):
    self.cfg = cfg

  def _check_specials(self):
    for flag, tid, what in ((self.cfg.add_bos, self.bos_id, "BOS"),
                            (self.cfg.add_eos, self.eos_id, "EOS")):
      if flag and tid is None:
        raise ConfigError(f"tokenizer {self.name} has no {what} token; set "
                          f"data.tokenizer.add_{what.lower()}=False")

  def encode(self, docs: list) -> list[np.ndarray]:
    """ids of each document (str or UTF-8 bytes), with BOS/EOS as configured."""
    out = []
    dtype = self.dtype
    pre = np.asarray([self.bos_id] if self.cfg.add_bos else [], dtype)
    post = np.asarray([self.eos_id] if self.cfg.add_eos else [], dtype)
    for ids in self._encode(docs):
      ids = np.asarray(ids, dtype)
      out.append(np.concatenate([pre, ids, post]) if len(pre) or len(post) else ids)
    return out

  @property
  def dtype(self) -> np.dtype:
    """The narrowest unsigned type that holds every id (corpora stay small in memory)."""
    return np.dtype(np.uint8 if self.vocab_size <= 256 else
                    np.uint16 if self.vocab_size <= 65536 else np.int32)

  @abc.abstractmethod
  def _encode(self, docs: list) -> list:
    """Token ids of each document, without BOS/EOS."""

  @abc.abstractmethod
  def decode(self, ids) -> str:
    """The text of a sequence of ids (undecodable bytes become U+FFFD)."""

  def describe(self) -> dict:
    return {**dataclasses.asdict(self.cfg), "vocab_size": self.vocab_size}


@TOKENIZERS.register("bytes", BytesConfig)
class BytesTokenizer(Tokenizer):
  """UTF-8 bytes; 256 ids. BOS/EOS are the ASCII control bytes STX (2) and ETX (3),
  "start/end of text", which do not occur in text, so the vocabulary stays 256."""
  vocab_size, bos_id, eos_id, name = 256, 2, 3, "bytes"

  def __init__(self, *, cfg: BytesConfig):
    super().__init__(cfg)

  def _encode(self, docs):
    return [np.frombuffer(d if isinstance(d, bytes) else d.encode("utf-8"), np.uint8)
            for d in docs]

  def decode(self, ids) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _text(doc) -> str:
  return doc.decode("utf-8") if isinstance(doc, bytes) else doc


@TOKENIZERS.register("sentencepiece", ModelFileConfig)
class SentencePieceTokenizer(Tokenizer):

  def __init__(self, *, cfg: ModelFileConfig):
    super().__init__(cfg)
    import sentencepiece  # pylint: disable=import-outside-toplevel
    self.name = f"'{cfg.path}'"
    try:
      self._sp = sentencepiece.SentencePieceProcessor(model_file=cfg.path)
    except (OSError, RuntimeError, TypeError) as e:
      raise ConfigError(f"tokenizer file '{cfg.path}' is not a SentencePiece model: "
                        f"{' '.join(str(e).split())[:160]}") from None
    self.vocab_size = self._sp.get_piece_size()
    self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else None
    self.eos_id = self._sp.eos_id() if self._sp.eos_id() >= 0 else None
    self._check_specials()

  def _encode(self, docs):
    return self._sp.encode([_text(d) for d in docs])

  def decode(self, ids) -> str:
    return self._sp.decode([int(i) for i in ids])


# Special tokens looked for in a tokenizer.json, most specific first.
_HF_BOS = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]", "<|startoftext|>")
_HF_EOS = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[SEP]", "<|im_end|>")


@TOKENIZERS.register("huggingface", ModelFileConfig)
class HuggingFaceTokenizer(Tokenizer):

  def __init__(self, *, cfg: ModelFileConfig):
    super().__init__(cfg)
    import tokenizers  # pylint: disable=import-outside-toplevel
    self.name = f"'{cfg.path}'"
    try:
      self._tok = tokenizers.Tokenizer.from_file(cfg.path)
    except Exception as e:  # pylint: disable=broad-except  (the Rust side raises plain Exception)
      raise ConfigError(f"tokenizer file '{cfg.path}' is not a Hugging Face tokenizer.json: "
                        f"{' '.join(str(e).split())[:160]}") from None
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.bos_id = self._find(_HF_BOS)
    self.eos_id = self._find(_HF_EOS)
    self._check_specials()

  def _find(self, names):
    for name in names:
      tid = self._tok.token_to_id(name)
      if tid is not None:
        return tid
    return None

  def _encode(self, docs):
    return [e.ids for e in self._tok.encode_batch([_text(d) for d in docs],
                                                  add_special_tokens=False)]

  def decode(self, ids) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def build(kind: str, **fields) -> Tokenizer:
  """The tokenizer of `kind` with `fields` (path, add_bos, add_eos), checked like a config node."""
  return TOKENIZERS.build(TOKENIZERS.parse(TOKENIZERS.node(kind, **fields), "tokenizer"))
