"""docs/ARCHITECTURE.md names files and symbols; each must exist, so the map cannot drift.

In the map, a file is written `path/to/file.py` (or a folder `path/`) and a symbol
`path/to/file.py:name` or `path/to/file.py:Class.method`, always in backticks.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAP = ROOT / "docs" / "ARCHITECTURE.md"

_REF = re.compile(r"`((?:[\w.-]+/)+(?:[\w.-]+\.(?:py|md|json|jsonl|txt|toml))?)(?::([\w.]+))?[^`]*`")


def references(text: str) -> list[tuple[str, str | None]]:
  """(path, symbol or None) for every backticked file, folder or file:symbol in `text`."""
  out = []
  for m in _REF.finditer(text):
    path = m[1]
    if path.startswith(("runs/", "http")) or "<" in path:
      continue  # run directories are made by runs, not part of the tree
    out.append((path, m[2]))
  return out


def defined(path: pathlib.Path, symbol: str) -> bool:
  """Whether `symbol` (name or Class.name) is defined at the top of `path` or in its class."""
  tree = ast.parse(path.read_text())
  scope: list[ast.stmt] = tree.body
  for part in symbol.split("."):
    found = None
    for node in scope:
      names = []
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names = [node.name]
      elif isinstance(node, ast.Assign):
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
      elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        names = [node.target.id]
      if part in names:
        found = node
        break
    if found is None:
      return False
    scope = getattr(found, "body", [])
  return True


def missing(text: str, root: pathlib.Path) -> list[str]:
  out = []
  for path, symbol in references(text):
    target = root / path
    if not target.exists():
      out.append(path)
    elif symbol and (target.suffix != ".py" or not defined(target, symbol)):
      out.append(f"{path}:{symbol}")
  return out


def test_every_file_and_symbol_in_the_map_exists():
  text = MAP.read_text()
  refs = references(text)
  assert len(refs) >= 20, "the map names too few files to be a map"
  assert any(symbol for _, symbol in refs), "the map names no symbols"
  assert missing(text, ROOT) == []


@pytest.mark.parametrize("edit", ["rename_file", "rename_symbol"])
def test_the_check_fails_when_a_named_file_or_symbol_is_renamed(tmp_path, edit):
  text = MAP.read_text()
  path, symbol = next((p, s) for p, s in references(text) if s and p.endswith(".py"))
  copy = tmp_path / path
  copy.parent.mkdir(parents=True)
  source = (ROOT / path).read_text()
  if edit == "rename_file":
    copy.with_name("renamed_" + copy.name).write_text(source)
  else:
    head = symbol.split(".")[-1]
    copy.write_text(re.sub(rf"\b(def|class) {head}\b", rf"\1 {head}_renamed", source))
  assert f"{path}:{symbol}" in missing(f"`{path}:{symbol}`", tmp_path) or path in missing(
      f"`{path}:{symbol}`", tmp_path)


def added_lines(patch: str) -> dict[str, list[str]]:
  """{file: the lines the patch adds to it, in order}."""
  out: dict[str, list[str]] = {}
  for block in re.split(r"^diff --git ", patch, flags=re.M)[1:]:
    path = re.search(r"^\+\+\+ b/(.+)$", block, flags=re.M)[1]
    out[path] = [line[1:] for line in block.splitlines()
                 if line.startswith("+") and not line.startswith("+++ ")]
  return out


def missing_in_order(lines: list[str], text: str) -> list[str]:
  """The lines of `lines` that do not follow each other in `text` (others may come between)."""
  have, at, out = text.splitlines(), 0, []
  for line in lines:
    try:
      at = have.index(line, at) + 1
    except ValueError:
      out.append(line)
  return out


def test_the_worked_example_is_in_the_tree(tmp_path):
  """docs/adding_a_feature.md's diff: every line it adds is in the tree, in its order, and
  its summary is the diff's `git apply --stat`. Lines added around them later (a new
  attention field) do not break it; removing or changing a shown line does."""
  text = (ROOT / "docs" / "adding_a_feature.md").read_text()
  blocks = re.findall(r"```diff\n(.*?)```", text, flags=re.S)
  assert len(blocks) == 1, "docs/adding_a_feature.md shows no diff (or several)"
  for path, lines in added_lines(blocks[0]).items():
    assert lines and missing_in_order(lines, (ROOT / path).read_text()) == [], path
  patch = tmp_path / "feature.diff"
  patch.write_text(blocks[0])
  stat = subprocess.run(["git", "apply", "--stat", str(patch)], cwd=tmp_path,
                        capture_output=True, text=True, check=True).stdout
  assert f"```\n{stat}```" in text, f"the summary should read:\n{stat}"


def test_the_worked_example_check_fails_when_a_shown_line_goes():
  patch = ("diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,1 +1,3 @@\n a = 1\n"
           "+b = 2\n+c = 3\n")
  assert added_lines(patch) == {"x.py": ["b = 2", "c = 3"]}
  assert missing_in_order(["b = 2", "c = 3"], "a = 1\nb = 2\nnew = 0\nc = 3\n") == []
  assert missing_in_order(["b = 2", "c = 3"], "a = 1\nc = 3\nb = 2\n") == ["c = 3"]
  assert missing_in_order(["b = 2", "c = 3"], "a = 1\nb = 22\nc = 3\n") == ["b = 2"]


# -- lists of kinds and mesh entries in the docs, against the registries --------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Where each registry's kinds are listed with their fields (a new registry picks a home here).
HOME = {"model": "models.md", "block": "models.md", "attention": "models.md",
        "position": "models.md", "ffn": "models.md", "norm": "models.md",
        "embedding": "models.md", "position_embedding": "models.md",
        "optimizer": "optimizers.md", "schedule": "optimizers.md",
        "data": "data.md", "tokenizer": "data.md"}


def _registries():
  import configs.base  # noqa: F401  pylint: disable=import-outside-toplevel  (every registry)
  from core import registry  # pylint: disable=import-outside-toplevel
  return {name: reg for name, reg in registry._ALL.items()  # pylint: disable=protected-access
          if not name.startswith("test_")}


def test_every_registered_kind_is_listed_in_its_home_doc():
  registries = _registries()
  assert set(registries) == set(HOME), "a registry without a home doc, or a stale HOME entry"
  missing = {name: [k for k in reg.kinds()
                    if f"`{k}`" not in (ROOT / "docs" / HOME[name]).read_text()]
             for name, reg in registries.items()}
  assert not any(missing.values()), missing


def test_the_architecture_tree_names_real_slots():
  """Each `slot [registry]` of docs/ARCHITECTURE.md's tree is a child field of that registry
  (in RunConfig or in some registered kind's config)."""
  import dataclasses  # pylint: disable=import-outside-toplevel

  from core.registry import child_registry, list_registry  # pylint: disable=import-outside-toplevel
  from trainer.config import RunConfig  # pylint: disable=import-outside-toplevel
  classes = [RunConfig] + [reg.entry(k).config_cls for reg in _registries().values()
                           for k in reg.kinds()]
  slots = set()
  for cls in classes:
    for f in dataclasses.fields(cls):
      reg = child_registry(f) or (list_registry(f) or (None,))[0]
      if reg is not None:
        slots.add((f.name, reg.name))
  tree = re.search(r"children's nodes.*?```\n(.*?)```", MAP.read_text(), flags=re.S)[1]
  named = set(re.findall(r"(\w+) \[(\w+)\]", tree))
  assert len(named) >= 10 and named <= slots, named - slots


def test_kinds_and_meshes_named_in_the_docs_exist():
  """Every `--config.<path>.kind=K` and `--mesh=NAME` in README.md and docs/*.md is real."""
  from core.registry import child_registry  # pylint: disable=import-outside-toplevel
  from launcher import config_loading  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib, meshes  # pylint: disable=import-outside-toplevel
  base = config_loading.load(str(ROOT / "configs" / "tiny.py"))
  bad = []
  for doc in DOCS:
    text = doc.read_text()
    for path, kind in re.findall(r"--config\.([\w.]+)\.kind=([A-Za-z]\w*)", text):
      field = config_lib.field_at(base, path)
      reg = None if field is None else child_registry(field)
      if kind != "K" and (reg is None or kind not in reg.kinds()):
        bad.append(f"{doc.name}: --config.{path}.kind={kind}")
    for name in re.findall(r"--mesh=([a-z][\w.-]*)", text):
      if name != "auto":
        try:
          meshes.lookup(name)
        except ValueError:
          bad.append(f"{doc.name}: --mesh={name}")
  assert not bad, bad
