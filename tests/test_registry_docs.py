"""The docs' lists of what the registries hold (kinds, file endings, choices, defaults, allowed
ranges, mesh entries) are what planner/registry_docs.py renders from them: a kind, an ending
or a range added to the code without `python -m planner.registry_docs` fails here."""

from __future__ import annotations

import dataclasses
import difflib
from typing import ClassVar, Literal

import pytest

from core.registry import registry
from planner import registry_docs
from trainer.ranges import Interval


@pytest.mark.parametrize("path", registry_docs.DOCS, ids=lambda p: p.name)
def test_the_docs_are_what_the_registries_render_to(path):
  text = path.read_text()
  rendered = registry_docs.render(text)
  diff = "".join(difflib.unified_diff(text.splitlines(True), rendered.splitlines(True),
                                      "on disk", "rendered", n=1))
  assert rendered == text, (f"{path.name} is not what the registries render to; run "
                            f"`python -m planner.registry_docs`:\n{diff[:3000]}")


def test_the_lists_the_issue_names_are_rendered():
  """docs/data.md's file endings, docs/optimizers.md's state_dtype choices and its refused
  values, docs/models.md's kinds per slot, docs/meshes.md's tables, the model families' and
  Hugging Face maps' files in docs/ARCHITECTURE.md and docs/models.md."""
  keys = {p.name: {m[2] for m in registry_docs.FRAGMENT.finditer(p.read_text())}
          for p in registry_docs.DOCS}
  assert {"suffixes", "choices:data.on_error", "kinds:tokenizer"} <= keys["data.md"]
  assert {"choices:optimizer.state_dtype", "refused:optimizer+schedule",
          "fields:optimizer.adamw", "fields:schedule.wsd"} <= keys["optimizers.md"]
  assert {"slots:model", "hf-map-files"} <= keys["models.md"]
  assert {"mesh-table", "gpu-table"} <= keys["meshes.md"]
  assert {"family-files", "hf-map-files"} <= keys["ARCHITECTURE.md"]  # found by issue 47's probe


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Probe:
  kind: str = "probe"
  learning_rate: float = 1.0
  state_dtype: Literal["float32", "bfloat16"] = "float32"
  beta3: float = 0.5
  RANGES: ClassVar = {"beta3": Interval(0, 2)}


def test_a_kind_added_to_a_registry_changes_what_its_fragments_render(monkeypatch):
  """A new optimizer kind with a field and a range of its own: the docs no longer render to
  themselves until the command runs (the lists cannot drift)."""
  optimizers = registry("optimizer")
  monkeypatch.setattr(optimizers, "_entries", dict(optimizers._entries))  # pylint: disable=protected-access
  optimizers.register("probe", _Probe)(lambda **_: None)
  text = (registry_docs.ROOT / "docs" / "optimizers.md").read_text()
  assert "[0, 2) | `beta3` (probe)" in registry_docs.refused("optimizer+schedule")
  assert registry_docs.fields("optimizer.probe") == "`learning_rate` 1.0, `beta3` 0.5"
  assert registry_docs.render(text) != text
  monkeypatch.undo()
  assert registry_docs.render(text) == text


def test_fragments_say_what_they_list():
  assert registry_docs.kinds("tokenizer") == "`bytes`, `huggingface` or `sentencepiece`"
  assert registry_docs.choices("optimizer.state_dtype") == "`float32` or `bfloat16`"
  assert "`.jsonl`/`.ndjson` (`jsonl`)" in registry_docs.suffixes()
  assert "| `model.block.norm.kind` | `layernorm`, `rmsnorm` |" in registry_docs.slots("model")
  with pytest.raises(ValueError, match="no Literal field"):
    registry_docs.choices("optimizer.b1")


def test_an_unknown_fragment_is_refused():
  with pytest.raises(KeyError, match="no registry-docs fragment kind 'kindz'"):
    registry_docs.render("<!-- registry-docs:kindz:norm -->x<!-- /registry-docs:kindz:norm -->")


def test_check_names_a_stale_doc_and_the_command_renders_it(tmp_path, monkeypatch, capsys):
  doc = tmp_path / "x.md"
  doc.write_text("<!-- registry-docs:kinds:norm -->`rmsnorm`<!-- /registry-docs:kinds:norm -->\n")
  monkeypatch.setattr(registry_docs, "DOCS", (doc,))
  monkeypatch.setattr(registry_docs, "ROOT", tmp_path)
  assert registry_docs.main(["registry_docs", "--check"]) == 1
  assert "x.md is stale: python -m planner.registry_docs" in capsys.readouterr().err
  assert registry_docs.main(["registry_docs"]) == 0
  assert "`layernorm` or `rmsnorm`" in doc.read_text()
  assert registry_docs.main(["registry_docs", "--check"]) == 0
