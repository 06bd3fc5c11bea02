"""Reading documents from user files: text (one document per file), JSON Lines, Parquet,
ArrayRecord (one UTF-8 document per record).

Problems with a whole file (missing path, empty glob, not the declared
format) raise ConfigError naming the file. Problems with one document (a JSONL
line that is not JSON or lacks the field, text that is not UTF-8) go to
`Errors`, which stops with the file and line (policy `stop`) or skips the
document and counts it (policy `skip`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import pathlib
from collections.abc import Iterator

from core.registry import ConfigError


@dataclasses.dataclass
class Errors:
  policy: str  # "stop" | "skip"
  skipped: int = 0
  first: str | None = None  # the first skipped document's problem, for the start-up message

  def bad(self, where: str, why: str) -> None:
    if self.policy == "stop":
      raise ConfigError(f"{where}: {why} (set data.on_error=skip to skip such documents)")
    self.skipped += 1
    self.first = self.first or f"{where}: {why}"


def expand(pattern: str, *, what: str = "data.path") -> list[str]:
  """Files named by a path, a glob or a directory (all files below it), sorted."""
  pattern = os.path.expanduser(pattern)
  if glob.has_magic(pattern):
    files = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not files:
      raise ConfigError(f"{what} '{pattern}': no files match the glob")
    return files
  path = pathlib.Path(pattern)
  if path.is_dir():
    files = sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
      raise ConfigError(f"{what} '{pattern}': the directory holds no files")
    return files
  if not path.exists():
    raise ConfigError(f"{what} '{pattern}': no such file or directory")
  return [pattern]


def _utf8(data: bytes, where: str, errors: Errors) -> str | None:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    errors.bad(where, f"not UTF-8 text (byte {e.start})")
    return None


# Readers yield (file, place in the file or "", text): `file + place` names the document in
# messages and, relative to the corpus root, in the hash that picks the held-out split.
Doc = tuple[str, str, str]


def read_text(files: list[str], *, errors: Errors, field: str | None) -> Iterator[Doc]:
  del field
  for path in files:
    data = pathlib.Path(path).read_bytes()
    nul = data.find(b"\0")
    if nul >= 0:
      raise ConfigError(f"{path}: not a text file (NUL byte at offset {nul}); data.kind=text "
                        f"reads UTF-8 text files")
    text = _utf8(data, path, errors)
    if text is not None:
      yield path, "", text


def read_jsonl(files: list[str], *, errors: Errors, field: str) -> Iterator[Doc]:
  for path in files:
    with open(path, "rb") as f:
      parsed_any = False
      for number, raw in enumerate(f, 1):
        where = f"{path}:{number}"
        if not raw.strip():
          continue
        line = _utf8(raw, where, errors)
        if line is None:
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          if not parsed_any and number == 1:
            raise ConfigError(f"{where}: not a JSON Lines file (first line is not JSON: "
                              f"{e.msg}); data.kind=jsonl wants one JSON object per line") from None
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


def read_parquet(files: list[str], *, errors: Errors, field: str) -> Iterator[Doc]:
  import pyarrow  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  for path in files:
    try:
      pf = pq.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as e:
      raise ConfigError(f"{path}: not a Parquet file ({' '.join(str(e).split())[:120]})") from None
    names = pf.schema_arrow.names
    if field not in names:
      raise ConfigError(f"{path}: no column '{field}' (columns: {', '.join(names)}); "
                        f"set data.field")
    row = 0
    for batch in pf.iter_batches(columns=[field]):
      for value in batch.column(0).to_pylist():
        place = f": row {row}"
        where = path + place
        row += 1
        if isinstance(value, bytes):
          value = _utf8(value, where, errors)
          if value is None:
            continue
        if not isinstance(value, str):
          errors.bad(where, f"column '{field}' is {type(value).__name__}, not text")
          continue
        yield path, place, value


def read_arrayrecord(files: list[str], *, errors: Errors, field: str | None) -> Iterator[Doc]:
  del field
  for path in files:
    for i, record in enumerate(arrayrecord_records(path)):
      text = _utf8(record, f"{path}: record {i}", errors)
      if text is not None:
        yield path, f": record {i}", text


def arrayrecord_records(path: str) -> list[bytes]:
  import grain  # pylint: disable=import-outside-toplevel
  try:
    source = grain.sources.ArrayRecordDataSource([path])
    return source.__getitems__(list(range(len(source))))
  except (RuntimeError, OSError, ValueError) as e:
    raise ConfigError(f"{path}: not an ArrayRecord file ({' '.join(str(e).split())[:120]})") \
        from None


READERS = {"text": read_text, "jsonl": read_jsonl, "parquet": read_parquet,
           "arrayrecord": read_arrayrecord}
FILE_KINDS = tuple(READERS)  # the data kinds that read user files (also `axtrain tokenize --kind`)
