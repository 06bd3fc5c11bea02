"""No import runs back up: each top-level package imports only the packages below it
(docs/ARCHITECTURE.md, "What each folder owns")."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Lowest first; a package may import any package of a lower rank, never one of its own rank or above
# (planner and configs are side by side: both build on trainer, neither needs the other).
RANKS = {"core": 0, "modules": 1, "trainer": 2, "planner": 3, "configs": 3, "launcher": 4,
         "benchmarks": 5}


def upward_imports(root: pathlib.Path) -> list[str]:
  """'file: imports package' for every import of a package at or above the file's own rank."""
  bad = []
  for package, rank in RANKS.items():
    for path in sorted((root / package).rglob("*.py")):
      for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
          names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
          names = [node.module]
        else:
          continue
        for name in names:
          top = name.split(".")[0]
          if top != package and RANKS.get(top, -1) >= rank:
            bad.append(f"{path.relative_to(root)}: imports {top}")
  return bad


def test_no_import_runs_back_up():
  assert upward_imports(ROOT) == []


def test_the_check_finds_an_upward_import(tmp_path):
  for package in RANKS:
    (tmp_path / package).mkdir()
  (tmp_path / "trainer" / "loop.py").write_text("from planner import plan\nimport core.registry\n")
  (tmp_path / "modules" / "attention.py").write_text("import trainer.step\n")
  assert upward_imports(tmp_path) == ["modules/attention.py: imports trainer",
                                      "trainer/loop.py: imports planner"]
