"""Imports run one way: each top-level package imports only the packages below it
(docs/ARCHITECTURE.md, "What each folder owns"), and inside a package no module imports one
that imports it back, directly or through others, at module level or inside a function."""

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


# --- no import circles --------------------------------------------------------------------

def module_imports(root: pathlib.Path, folders=tuple(RANKS)) -> dict[str, set[str]]:
  """Each module of `folders` under `root` ('planner.plan'; a package's __init__ is the
  package) -> the modules of those folders it imports anywhere in its source, inside functions
  too: `import a.b`, `from a import b` (module b, else a), `from a.b import name`, and the
  relative forms."""
  files = {}
  for folder in folders:
    for path in sorted((root / folder).rglob("*.py")):
      parts = path.relative_to(root).with_suffix("").parts
      files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  def known(name: str) -> str | None:  # the module itself, else the package that holds it
    while name and name not in files:
      name = name.rpartition(".")[0]
    return name or None
  graph = {}
  for module, path in files.items():
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
      if isinstance(node, ast.Import):
        found.update(known(a.name) for a in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(anchor + ([node.module] if node.module else []))
        found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else known(base)
                     for a in node.names)
    graph[module] = found - {None, module}
  return graph


def import_circles(root: pathlib.Path, folders=tuple(RANKS)) -> list[str]:
  """One line per group of modules that import each other, directly or through others
  ('planner/plan.py -> planner/step_memory.py -> planner/plan.py': the shortest circle through
  the group's first module)."""
  graph = module_imports(root, folders)
  reach = {m: _reachable(graph, m) for m in graph}
  out, seen = [], set()
  for module in sorted(graph):
    if module in seen or module not in reach[module]:
      continue
    group = {m for m in reach[module] if module in reach[m]}
    seen |= group
    path = _shortest(graph, module, module, within=group)
    out.append(" -> ".join(f"{m.replace('.', '/')}.py" for m in path))
  return out


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
  """The modules `start` imports, at any depth (itself only through a circle)."""
  out, todo = set(), list(graph[start])
  while todo:
    m = todo.pop()
    if m not in out:
      out.add(m)
      todo.extend(graph.get(m, ()))
  return out


def _shortest(graph: dict[str, set[str]], start: str, end: str, *, within: set[str]) -> list[str]:
  """The shortest import path from `start` to `end` through modules of `within`."""
  paths, seen = [[start]], set()
  while paths:
    path = paths.pop(0)
    for m in sorted(graph[path[-1]] & within):
      if m == end:
        return path + [m]
      if m not in seen:
        seen.add(m)
        paths.append(path + [m])
  raise AssertionError(f"no path from {start} to {end}")


def test_no_module_imports_itself_back():
  """A one-way graph in every folder, planner/ and trainer/ included: no circle of imports, not
  even through an import inside a function."""
  assert import_circles(ROOT) == []


def test_the_check_finds_circles_through_functions_and_relative_imports(tmp_path):
  for package in ("trainer", "planner"):
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
  (tmp_path / "trainer" / "config.py").write_text("from trainer import meshes\n")
  (tmp_path / "trainer" / "meshes.py").write_text(
      "import re\n\ndef switch():\n  from trainer.config import switch_kind\n")
  (tmp_path / "trainer" / "data").mkdir()
  (tmp_path / "trainer" / "data" / "__init__.py").write_text("from trainer.data.base import DATA\n")
  (tmp_path / "trainer" / "data" / "base.py").write_text("import trainer.config\n")
  (tmp_path / "planner" / "plan.py").write_text("def f():\n  from . import step_memory\n")
  (tmp_path / "planner" / "step_memory.py").write_text("from .report import gib\n")
  (tmp_path / "planner" / "report.py").write_text("from planner.plan import Plan\n")
  (tmp_path / "planner" / "sweep.py").write_text("from planner import plan, report\n")
  assert import_circles(tmp_path) == [
      "planner/plan.py -> planner/step_memory.py -> planner/report.py -> planner/plan.py",
      "trainer/config.py -> trainer/meshes.py -> trainer/config.py"]
  (tmp_path / "trainer" / "meshes.py").write_text("import re\n")
  (tmp_path / "planner" / "plan.py").write_text("from planner import sweep\n")
  assert import_circles(tmp_path) == [
      "planner/plan.py -> planner/sweep.py -> planner/plan.py"]
