"""CSV files with a header row: one document per row, its text in the column `column`
(`data.kind=csv`). Read as UTF-8 with Python's csv module (RFC 4180 quoting: a quoted cell
may hold commas and newlines); a document's place is the line its row starts on."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import pathlib

from core.registry import ConfigError
from trainer.data.base import DATA
from trainer.data.config import DocumentFilesConfig
from trainer.data.corpus import DocumentSource


@dataclasses.dataclass(frozen=True, kw_only=True)
class CsvConfig(DocumentFilesConfig):
  kind: str = "csv"
  column: str = "text"  # header name of the column holding the document text


@contextlib.contextmanager
def _no_cell_limit():
  """csv refuses cells over 128 KiB by default; a document may be longer. The limit is
  process-wide, so it is lifted only while a file is read."""
  old = csv.field_size_limit(2 ** 31 - 1)
  try:
    yield
  finally:
    csv.field_size_limit(old)


@DATA.register("csv", CsvConfig)
class CsvSource(DocumentSource):
  SUFFIXES = (".csv",)

  @staticmethod
  def write(directory, texts):
    path = directory / "example.csv"
    with open(path, "w", newline="", encoding="utf-8") as out:
      csv.writer(out).writerows([("text",), *((t,) for t in texts)])
    return str(path)

  @staticmethod
  def documents(cfg, files, *, errors):
    for path in files:
      data = pathlib.Path(path).read_bytes()
      nul = data.find(b"\0")
      if nul >= 0:
        raise ConfigError(f"{path}: not a CSV file (NUL byte at offset {nul})")
      try:
        text = data.decode("utf-8-sig")  # a byte-order mark (Excel's UTF-8 export) is dropped
      except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); data.kind=csv reads UTF-8 "
                          f"CSV") from None
      with _no_cell_limit():
        yield from _rows(path, text, cfg.column, errors)


def _rows(path: str, text: str, column: str, errors):
  reader = csv.reader(text.splitlines(keepends=True), strict=True)  # bad quoting: refused
  try:
    header = next(reader, None)
    if not header:
      raise ConfigError(f"{path}: no header row; data.kind=csv wants the column names on the "
                        f"first line")
    if column not in header:
      raise ConfigError(f"{path}: no column '{column}' (columns: {', '.join(header)}); "
                        f"set data.column")
    index = header.index(column)
    while True:
      start = reader.line_num + 1
      row = next(reader, None)
      if row is None:
        return
      if not row:
        continue  # a blank line
      where = f"{path}:{start}"
      if index >= len(row):
        errors.bad(where, f"the row has {len(row)} cells, none in column '{column}' "
                          f"(number {index + 1} of the header)")
        continue
      yield path, f":{start}", row[index]
  except csv.Error as e:
    raise ConfigError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None
