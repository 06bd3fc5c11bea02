"""Plain text files: each file is one document (`data.kind=text`)."""

from __future__ import annotations

import dataclasses
import pathlib

from core.registry import ConfigError
from trainer.data import documents
from trainer.data.base import DATA
from trainer.data.config import DocumentFilesConfig
from trainer.data.corpus import DocumentSource


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextConfig(DocumentFilesConfig):
  kind: str = "text"


@DATA.register("text", TextConfig)
class TextSource(DocumentSource):
  SUFFIXES = (".txt", ".text", ".md")

  @staticmethod
  def write(directory, texts):
    folder = directory / "text"
    folder.mkdir()
    for i, text in enumerate(texts):
      (folder / f"{i:05d}.txt").write_bytes(text.encode("utf-8"))
    return str(folder)

  @staticmethod
  def documents(cfg, files, *, errors):
    del cfg
    for path in files:
      data = pathlib.Path(path).read_bytes()
      nul = data.find(b"\0")
      if nul >= 0:
        raise ConfigError(f"{path}: not a text file (NUL byte at offset {nul}); data.kind=text "
                          f"reads UTF-8 text files")
      text = documents.utf8(data, path, errors)
      if text is not None:
        yield path, "", text
