"""What every reader of user files shares: finding the files, decoding UTF-8, bad documents.

Problems with a whole file (missing path, empty glob, not the declared format) raise
ConfigError naming the file. Problems with one document (a JSONL line that is not JSON or
lacks the field, text that is not UTF-8) go to `Errors`, which stops with the file and
line (policy `stop`) or skips the document and counts it (policy `skip`).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pathlib

from core.registry import ConfigError

# Readers yield (file, place in the file or "", text): `file + place` names the document in
# messages and, relative to the corpus root, in the hash that picks the held-out split.
Doc = tuple[str, str, str]


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


def utf8(data: bytes, where: str, errors: Errors) -> str | None:
  """`data` decoded, or None after reporting it to `errors` as not UTF-8."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    errors.bad(where, f"not UTF-8 text (byte {e.start})")
    return None


def example_texts(count: int = 64) -> list[str]:
  """Documents of varied length for the example corpora of the kinds (Source.example), with a
  comma, quotes, a line break and a non-ASCII letter, which every reader must give back."""
  return [f'document {i}: "fox", café\n' + "the quick brown fox " * (i % 9) for i in range(count)]
