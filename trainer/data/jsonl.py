"""JSON Lines: one document per line, its text under the key `field` (`data.kind=jsonl`).

The reader takes each file's lines from `open_lines`, so a kind whose files hold JSON Lines in
another container (compressed, say) subclasses `JsonlSource` with its own `open_lines` and
`write`."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

from core.registry import ConfigError
from trainer.data import documents
from trainer.data.base import DATA
from trainer.data.config import DocumentFilesConfig
from trainer.data.corpus import DocumentSource


@dataclasses.dataclass(frozen=True, kw_only=True)
class JsonlConfig(DocumentFilesConfig):
  kind: str = "jsonl"
  field: str = "text"  # key of each record holding the document text
  SHARED: ClassVar = (*DocumentFilesConfig.SHARED, "field")  # parquet's `field` means the same


@DATA.register("jsonl", JsonlConfig)
class JsonlSource(DocumentSource):
  SUFFIXES = (".jsonl", ".ndjson")

  @staticmethod
  def write(directory, texts):
    path = directory / "example.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)

  @staticmethod
  def open_lines(path: str):
    """The file's lines, as bytes (a context manager)."""
    return open(path, "rb")  # pylint: disable=consider-using-with

  @classmethod
  def documents(cls, cfg, files, *, errors):
    field = cfg.field
    for path in files:
      with cls.open_lines(path) as f:
        parsed_any = False
        for number, raw in enumerate(f, 1):
          where = f"{path}:{number}"
          if not raw.strip():
            continue
          line = documents.utf8(raw, where, errors)
          if line is None:
            continue
          try:
            record = json.loads(line)
          except json.JSONDecodeError as e:
            if not parsed_any and number == 1:
              raise ConfigError(f"{where}: not a JSON Lines file (first line is not JSON: "
                                f"{e.msg}); data.kind={cfg.kind} wants one JSON object per line"
                                ) from None
            errors.bad(where, f"not valid JSON ({e.msg})")
            continue
          parsed_any = True
          if not isinstance(record, dict) or field not in record:
            keys = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
            errors.bad(where, f"no field '{field}' (has: {keys}); set data.field")
            continue
          if not isinstance(record[field], str):
            errors.bad(where, f"field '{field}' is {type(record[field]).__name__}, not a string")
            continue
          yield path, f":{number}", record[field]
