"""Every config in configs/ flattened to sorted `key: value` text, compared with a golden file;
and one command-line kind switch per registry on configs/tiny.py (the switched node's lines).

Regenerate after an intended change with `UPDATE_GOLDEN=1 make test` (or `make golden`)
and review the diff.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from launcher import config_loading, flat
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "testdata" / "golden"
# Extra variants of configs that take an argument, beyond the default.
VARIANTS = {"gpt2.py": ["size=small", "size=medium", "size=large", "size=xl"],
            "llama.py": [f"size={s}" for s in ("test", "tiny", "125m", "1b", "3b", "7b", "8b", "70b")]}
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


def _cases():
  for path in sorted((ROOT / "configs").glob("*.py")):
    if "def get_config" not in path.read_text():
      continue
    yield path.name, None
    for arg in VARIANTS.get(path.name, []):
      yield path.name, arg


CASES = list(_cases())


@pytest.mark.parametrize("name,arg", CASES, ids=[f"{n}:{a}" if a else n for n, a in CASES])
def test_golden(name, arg):
  value = str(pathlib.Path("configs") / name) + (f":{arg}" if arg else "")
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    text = flat.flat_text(config_loading.load(value))
  finally:
    os.chdir(cwd)
  golden = GOLDEN / (pathlib.Path(name).stem + (f"_{arg.replace('=', '-')}" if arg else "") + ".txt")
  compare(text, golden, value)


@pytest.mark.parametrize("registry", sorted(SWITCHES))
def test_golden_kind_switch(registry):
  path, overrides = SWITCHES[registry]
  text = flat.flat_text(config_loading.load(str(ROOT / "configs" / "tiny.py"), *overrides))
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
