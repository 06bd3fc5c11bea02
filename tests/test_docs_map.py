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


def added_lines(patch: str) -> dict[str, list[tuple[str, str]]]:
  """{file: (the hunk's context, e.g. `class AttentionConfig:`, and a line the patch adds to it)
  for each line it adds, in order}."""
  out: dict[str, list[tuple[str, str]]] = {}
  for block in re.split(r"^diff --git ", patch, flags=re.M)[1:]:
    path = re.search(r"^\+\+\+ b/(.+)$", block, flags=re.M)[1]
    hunk, lines = "", out.setdefault(path, [])
    for line in block.splitlines():
      if line.startswith("@@"):
        hunk = line.split("@@")[2].strip()
      elif line.startswith("+") and not line.startswith("+++ "):
        lines.append((hunk, line[1:]))
  return out


_CHILD_FIELD = re.compile(r"^\s+(\w+): \w+ = child\(\"(\w+)\"(, None)?")


def example_facts(patch: str) -> list[tuple]:
  """What a feature's diff adds, as facts to find in the tree whatever lines come to surround
  them: ("file", path) for each file it touches; ("field", class, name, registry, optional) for
  each child field a config class gains; ("test", path, name) for each test it defines."""
  facts = []
  for path, lines in added_lines(patch).items():
    facts.append(("file", path))
    for hunk, line in lines:
      field = _CHILD_FIELD.match(line)
      owner = re.match(r"class (\w+)", hunk)
      if field and owner:
        facts.append(("field", owner[1], field[1], field[2], bool(field[3])))
      test = re.match(r"def (test_\w+)\(", line)
      if test and path.startswith("tests/"):
        facts.append(("test", path, test[1]))
  return facts


def _config_classes() -> dict[str, list[type]]:
  """{class name: the registered config classes that are it or derive from it}."""
  out: dict[str, list[type]] = {}
  for reg in _registries().values():
    for kind in reg.kinds():
      cls = reg.entry(kind).config_cls
      for base in cls.__mro__:
        out.setdefault(base.__name__, []).append(cls)
  return out


def untrue_facts(facts: list[tuple], root: pathlib.Path) -> list[tuple]:
  """The facts of `example_facts` that the tree at `root` does not hold. A field must be a
  child field of its registry, None by default when the diff made it optional, of every
  registered config class that is or derives from the diff's class, and be named (in
  backticks) in that registry's home doc."""
  import dataclasses  # pylint: disable=import-outside-toplevel

  from core.registry import child_registry  # pylint: disable=import-outside-toplevel
  classes = _config_classes()
  out = []
  for fact in facts:
    if fact[0] == "file":
      ok = (root / fact[1]).is_file()
    elif fact[0] == "test":
      ok = (root / fact[1]).is_file() and defined(root / fact[1], fact[2])
    else:
      _, owner, name, registry, optional = fact
      fields = [{f.name: f for f in dataclasses.fields(c)}.get(name) for c in classes.get(owner, [])]
      ok = bool(fields) and all(
          f is not None and getattr(child_registry(f), "name", None) == registry
          and (f.default is None) == optional for f in fields)
      home = HOME.get(_home_registry(owner, classes))
      ok = ok and home is not None and f"`{name}`" in (root / "docs" / home).read_text()
    if not ok:
      out.append(fact)
  return out


def _home_registry(owner: str, classes: dict[str, list[type]]) -> str:
  """The registry whose kinds' configs are (or derive from) class `owner`."""
  for name, reg in _registries().items():
    if any(reg.entry(k).config_cls in classes.get(owner, []) for k in reg.kinds()):
      return name
  return ""


def _worked_example() -> tuple[str, str]:
  text = (ROOT / "docs" / "adding_a_feature.md").read_text()
  blocks = re.findall(r"```diff\n(.*?)```", text, flags=re.S)
  assert len(blocks) == 1, "docs/adding_a_feature.md shows no diff (or several)"
  return text, blocks[0]


def test_the_worked_example_is_true_of_the_tree():
  """docs/adding_a_feature.md's worked example (QK-norm) is a commit's diff. What it adds holds
  in the tree as facts, not as frozen lines (new lines around them, a new attention field in
  the same docs bullet, do not break it): its files exist, the config field it adds is a field
  of attention's config and named in docs/models.md, and its tests are defined."""
  _, patch = _worked_example()
  facts = example_facts(patch)
  assert {f[0] for f in facts} == {"file", "field", "test"}, facts
  assert ("field", "AttentionConfig", "norm", "norm", True) in facts
  assert untrue_facts(facts, ROOT) == []


def test_the_worked_example_summary_is_its_diff_stat(tmp_path):
  text, patch = _worked_example()
  path = tmp_path / "feature.diff"
  path.write_text(patch)
  stat = subprocess.run(["git", "apply", "--stat", str(path)], cwd=tmp_path,
                        capture_output=True, text=True, check=True).stdout
  assert f"```\n{stat}```" in text, f"the summary should read:\n{stat}"


def test_the_worked_example_check_fails_when_a_fact_goes(tmp_path):
  patch = ("diff --git a/modules/attention.py b/modules/attention.py\n--- a/modules/attention.py\n"
           "+++ b/modules/attention.py\n@@ -1,1 +1,3 @@ class AttentionConfig:\n a = 1\n"
           "+  norm: Any = child(\"norm\", None)\n+  gate: Any = child(\"norm\", None)\n"
           "diff --git a/tests/test_x.py b/tests/test_x.py\n--- /dev/null\n+++ b/tests/test_x.py\n"
           "@@ -0,0 +1,2 @@\n+def test_one():\n+  pass\n")
  facts = example_facts(patch)
  assert facts == [("file", "modules/attention.py"),
                   ("field", "AttentionConfig", "norm", "norm", True),
                   ("field", "AttentionConfig", "gate", "norm", True),
                   ("file", "tests/test_x.py"), ("test", "tests/test_x.py", "test_one")]
  (tmp_path / "modules").mkdir()
  (tmp_path / "modules" / "attention.py").write_text("")
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "models.md").write_text("`norm` and `gate`")
  # no field `gate` on the config; no tests/test_x.py
  assert untrue_facts(facts, tmp_path) == [facts[2], facts[3], facts[4]]
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "test_x.py").write_text("def test_two():\n  pass\n")
  assert untrue_facts(facts, tmp_path) == [facts[2], facts[4]]
  (tmp_path / "docs" / "models.md").write_text("`gate` only")  # the field, undocumented
  assert facts[1] in untrue_facts(facts, tmp_path)


# -- lists of kinds and mesh entries in the docs, against the registries --------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Where each registry's kinds are listed with their fields (a new registry picks a home here).
HOME = {"model": "models.md", "block": "models.md", "attention": "models.md",
        "position": "models.md", "ffn": "models.md", "norm": "models.md",
        "embedding": "models.md", "position_embedding": "models.md",
        "optimizer": "optimizers.md", "schedule": "optimizers.md",
        "data": "data.md", "tokenizer": "data.md", "quantization": "quantization.md"}


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


def test_every_field_of_the_optimizer_and_data_kinds_is_named_in_its_home_doc():
  """docs/optimizers.md and docs/data.md name (in backticks, alone or as `parent.field`) every
  field of every kind of the registries they are home to. (docs/models.md lists its kinds
  and some fields only, and is not held to it.)"""
  import dataclasses  # pylint: disable=import-outside-toplevel
  missing = []
  for name, reg in _registries().items():
    if HOME[name] not in ("optimizers.md", "data.md"):
      continue
    text = (ROOT / "docs" / HOME[name]).read_text()
    for kind in reg.kinds():
      for f in dataclasses.fields(reg.entry(kind).config_cls):
        if f.name != "kind" and not re.search(rf"`(?:[\w.]+\.)?{f.name}`", text):
          missing.append(f"{name} '{kind}': {f.name}")
  assert not missing, missing


def test_the_ffn_line_names_every_activation():
  from modules.mlp import ACTIVATIONS  # pylint: disable=import-outside-toplevel
  text = (ROOT / "docs" / "models.md").read_text()
  line = re.search(r"^- `model\.block\.ffn\.kind`:.*?(?=^- |^$)", text, re.M | re.S)[0]
  assert [a for a in ACTIVATIONS if not re.search(rf"\b{a}\b", line)] == [], line


def test_the_architecture_tree_names_real_slots():
  """Each `slot [registry]` of docs/ARCHITECTURE.md's tree is a child field of that registry
  (in RunConfig or in some registered kind's config)."""
  import dataclasses  # pylint: disable=import-outside-toplevel

  from core.registry import (  # pylint: disable=import-outside-toplevel
      child_registry, list_registry, map_registry)
  from trainer.config import RunConfig  # pylint: disable=import-outside-toplevel
  classes = [RunConfig] + [reg.entry(k).config_cls for reg in _registries().values()
                           for k in reg.kinds()]
  slots = set()
  for cls in classes:
    for f in dataclasses.fields(cls):
      reg = child_registry(f) or map_registry(f) or (list_registry(f) or (None,))[0]
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


def test_every_model_family_and_hugging_face_class_is_in_the_models_doc():
  """docs/models.md has a section for every family of modules/ (a size table: its file named in
  the heading), names every Hugging Face class that `axtrain convert` reads (modules/hf_maps.py:
  FAMILIES) and the file of its map: a family found by the tests with no line to add is not
  left out of its doc."""
  from modules import hf_maps  # pylint: disable=import-outside-toplevel
  from tests.test_families import FAMILIES  # pylint: disable=import-outside-toplevel
  text = (ROOT / "docs" / "models.md").read_text()
  headings = re.findall(r"^## .*$", text, re.M)
  missing = [f"section of modules/{name}.py" for name in FAMILIES
             if not any(f"(`modules/{name}.py`)" in h for h in headings)]
  missing += [f"{arch} ({family.source})" for arch, family in hf_maps.FAMILIES.items()
              if f"`{arch}`" not in text or f"`{family.source}`" not in text]
  assert len(FAMILIES) >= 4 and not missing, missing
