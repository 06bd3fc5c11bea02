"""No function in the tree is longer than 60 lines (the house style: small functions)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("core", "configs", "launcher", "trainer", "modules", "planner", "benchmarks", "tests")
MAX_LINES = 60


def long_functions(root: pathlib.Path, *, limit: int = MAX_LINES) -> list[str]:
  """`path:name lines` for each function or method of the folders under `root` whose
  definition, from its `def` line to its last line, spans more than `limit` lines."""
  out = []
  for folder in FOLDERS:
    for path in sorted((root / folder).rglob("*.py")):
      for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          lines = node.end_lineno - node.lineno + 1
          if lines > limit:
            out.append(f"{path.relative_to(root).as_posix()}:{node.name} {lines}")
  return out


def test_no_function_is_longer_than_60_lines():
  assert long_functions(ROOT) == []


def test_the_check_counts_from_def_to_the_last_line(tmp_path):
  (tmp_path / "core").mkdir()
  body = "".join(f"  x{i} = {i}\n" for i in range(59))
  method = "".join(f"  {line}\n" for line in body.splitlines()[1:])
  (tmp_path / "core" / "a.py").write_text(  # fits: 60 lines; over: 61, its comment counted
      f"def fits():\n{body}\n\nclass C:\n  def over(self):\n{method}    # comment\n"
      f"    pass\n")
  assert long_functions(tmp_path) == ["core/a.py:over 61"]
