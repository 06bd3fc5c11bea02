"""BENCHMARKS.md's generated sections: each between its own begin and end markers, written by the
benchmark that measures it (chip.py, whole_run.py, tpu_step.py) and left alone by the others."""

from __future__ import annotations

import pathlib

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def write_section(section: str, *, begin: str, end: str, path: pathlib.Path = BENCHMARKS) -> None:
  """Puts `section` (which starts with `begin` and ends with `end`) where the file's section
  between those markers was, or appends it."""
  text = path.read_text()
  if begin in text:
    text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
  else:
    text = text.rstrip("\n") + "\n\n" + section + "\n"
  path.write_text(text)
