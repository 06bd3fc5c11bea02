"""What every config in configs/ chooses, as sorted `key: value` text, compared with a golden
file; and one command-line kind switch per registry on configs/tiny.py (the switched node's
lines).

A golden file holds a config's choices (core/choices.py): every `kind`, every required
field and every value that differs from its field's default. A new field with a default
changes no golden file; a changed default or a config that sets a new value does, as a
reviewable diff. `--print_config` prints the whole resolved config, which is the golden
choices with every other field at its kind's default (test_print_config_is_the_golden_
choices_with_defaults).

Regenerate after an intended change with `UPDATE_GOLDEN=1 make test` (or `make golden`)
and review the diff.
"""

from __future__ import annotations

import ast
import importlib
import os
import pathlib
import re

import pytest

from core.registry import ConfigError
from launcher import config_loading, flat
from tests.conftest import ROOT
from trainer import config as config_lib

GOLDEN = ROOT / "tests" / "testdata" / "golden"
# registry -> (path of the switched node, overrides on configs/tiny.py). tests/test_kind_switch.py
# trains each of them.
SWITCHES = {
    "model": ("model", ["--config.model.kind=decoder_lm"]),
    "block": ("model.block", ["--config.model.block.kind=parallel"]),
    "attention": ("model.block.attention", ["--config.model.block.attention.kind=attention"]),
    "position": ("model.block.attention.position",
                 ["--config.model.block.attention.position.kind=rope_llama3"]),
    "ffn": ("model.block.ffn", ["--config.model.block.ffn.kind=moe",
                                "--config.model.block.ffn.num_experts=4"]),
    "norm": ("model.block.norm", ["--config.model.block.norm.kind=layernorm"]),
    "embedding": ("model.embedding", ["--config.model.embedding.kind=token"]),
    "position_embedding": ("model.position_embedding",
                           ["--config.model.position_embedding.kind=learned"]),
    "optimizer": ("optimizer", ["--config.optimizer.kind=sgd"]),
    "schedule": ("optimizer.schedule", ["--config.optimizer.schedule.kind=constant"]),
    "data": ("data", ["--config.data.kind=jsonl", "--config.data.path=corpus.jsonl"]),
    "tokenizer": ("data.tokenizer", ["--config.data.tokenizer.kind=huggingface",
                                     "--config.data.tokenizer.path=tokenizer.json"]),
}


def _variants(path: pathlib.Path) -> list[str]:
  """`key=value` for every value of each argument that the config declares in `CHOICES`."""
  choices = getattr(importlib.import_module(f"configs.{path.stem}"), "CHOICES", {})
  return [f"{key}={value}" for key, values in choices.items() for value in values]


def _needs_argument(path: pathlib.Path) -> bool:
  """Whether the config refuses to load without its argument (core/config_args.py:Needed)."""
  try:
    importlib.import_module(f"configs.{path.stem}").get_config()
  except ConfigError as e:
    return "this config needs its argument" in str(e)
  return False


def _example(path: pathlib.Path) -> str:
  """The argument of the command in the config's docstring (`--config=configs/NAME.py:ARG`)."""
  doc = importlib.import_module(f"configs.{path.stem}").__doc__ or ""
  return re.search(rf"--config=configs/{path.name}:(\S+)", doc)[1]


def _cases():
  """Every config file of configs/, with no argument (or, for one that needs an argument, the
  one its docstring's command gives) and with each declared variant."""
  for path in sorted((ROOT / "configs").glob("*.py")):
    if "def get_config" not in path.read_text():
      continue
    first = _example(path) if _needs_argument(path) else None
    variants = _variants(path)
    for arg in ([first] if first not in variants else []) + variants:
      yield path.name, arg


CASES = list(_cases())


IDS = [f"{n}:{a}" if a else n for n, a in CASES]


def _load(name: str, arg: str | None):
  value = str(pathlib.Path("configs") / name) + (f":{arg}" if arg else "")
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    return value, config_loading.load(value)
  finally:
    os.chdir(cwd)


def _golden(name: str, arg: str | None) -> pathlib.Path:
  return GOLDEN / (pathlib.Path(name).stem + (f"_{arg.replace('=', '-')}" if arg else "") + ".txt")


@pytest.mark.parametrize("name,arg", CASES, ids=IDS)
def test_golden(name, arg):
  value, cfg = _load(name, arg)
  compare(flat.chosen_text(cfg), _golden(name, arg), value)


def parse_golden(text: str) -> dict:
  """The nested choices written in a golden file (the inverse of flat.chosen_text)."""
  root: dict = {}
  for line in text.splitlines():
    if not line or line.startswith("#"):
      continue
    key, _, raw = line.partition(": ")
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      value = raw  # a string, written without quotes
    node = root
    parts = key.split(".")
    for part in parts[:-1]:
      m = re.fullmatch(r"(\w+)\[(\d+)\]", part)
      if m:  # a list of nodes: data.sources[0].kind
        items = node.setdefault(m[1], [])
        items.extend({} for _ in range(int(m[2]) + 1 - len(items)))
        node = items[int(m[2])]
      else:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
  return root


@pytest.mark.parametrize("name,arg", CASES, ids=IDS)
def test_print_config_is_the_golden_choices_with_defaults(name, arg):
  """The resolved config (what --print_config prints before its # lines) is the golden
  file's choices with every other field at its default in the registries: derived from the
  config classes, not a second list."""
  _, cfg = _load(name, arg)
  choices = parse_golden(_golden(name, arg).read_text())
  assert flat.flat_text(config_lib.with_defaults(choices)) == flat.flat_text(cfg)


def test_print_config_prints_the_resolved_config(capsys):
  from launcher import main as main_lib
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    assert main_lib.main(["axtrain", "--config=configs/tiny.py", "--print_config"]) == 0
  finally:
    os.chdir(cwd)
  out = capsys.readouterr().out
  printed = "".join(line + "\n" for line in out.splitlines() if not line.startswith("#"))
  assert printed == flat.flat_text(config_lib.with_defaults(
      parse_golden((GOLDEN / "tiny.txt").read_text())))


@pytest.mark.parametrize("registry", sorted(SWITCHES))
def test_golden_kind_switch(registry):
  path, overrides = SWITCHES[registry]
  text = flat.chosen_text(config_loading.load(str(ROOT / "configs" / "tiny.py"), *overrides))
  lines = "".join(line for line in text.splitlines(keepends=True) if line.startswith(path + "."))
  compare(f"# configs/tiny.py {' '.join(overrides)}\n{lines}", GOLDEN / "switch" / f"{registry}.txt",
          " ".join(overrides))


def compare(text: str, golden: pathlib.Path, what: str) -> None:
  if os.environ.get("UPDATE_GOLDEN"):
    golden.parent.mkdir(parents=True, exist_ok=True)
    golden.write_text(text)
  assert golden.exists(), f"no golden file {golden}; run UPDATE_GOLDEN=1 make test"
  assert text == golden.read_text(), (
      f"{what} changed; review and regenerate with UPDATE_GOLDEN=1 make test")


def test_every_golden_file_has_a_config():
  expected = {(pathlib.Path(n).stem + (f"_{a.replace('=', '-')}" if a else "") + ".txt")
              for n, a in CASES}
  assert {p.name for p in GOLDEN.glob("*.txt")} <= expected
  assert {p.stem for p in (GOLDEN / "switch").glob("*.txt")} <= set(SWITCHES)


def test_a_new_field_with_a_default_changes_no_golden_file_and_no_old_run(monkeypatch, tmp_path):
  """The upgrade path: a field added later with its default (here to attention) leaves every
  golden file as it is, and a run directory written before it existed is still the same run
  (its config.json lacks the key); a value other than the default is a difference."""
  import dataclasses
  import json

  from core.registry import Component, registry
  from launcher.errors import UserError
  from launcher.run_dir import RunDir, identity
  tiny = str(ROOT / "configs" / "tiny.py")
  before = json.loads(config_loading.load(tiny).to_json_best_effort())
  attention = registry("attention")
  old = attention.entry("attention")

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class Newer(old.config_cls):
    added_later: float = 1.5  # a new option, off at its default

  monkeypatch.setitem(attention._entries, "attention",  # pylint: disable=protected-access
                      Component("attention", Newer, old.target))
  for name, arg in CASES:
    value, cfg = _load(name, arg)
    block = cfg.model.block
    for attention in ([block.attention] if "attention" in block else
                      [member.attention for member in block.blocks.values()]):  # a block group
      assert attention.added_later == 1.5
    assert flat.chosen_text(cfg) == _golden(name, arg).read_text(), value
  after = json.loads(config_loading.load(tiny).to_json_best_effort())
  run = RunDir(tmp_path / "run")
  run.path.mkdir()
  (run.path / "config.json").write_text(json.dumps(identity(before)))
  (run.path / "run.json").write_text(json.dumps({  # as an older axtrain wrote it
      "status": "completed", "command": "axtrain --config=configs/tiny.py",
      "versions": {"axtrain": "0.1.0"}}))
  assert run.prepare(after, overwrite=False) == "completed"
  after["model"]["block"]["attention"]["added_later"] = 2.0
  with pytest.raises(UserError, match=r"another model \(.*model.block.attention.added_later "
                                      r"unset -> 2.0\)"):
    run.prepare(after, overwrite=False)
