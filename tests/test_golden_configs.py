"""Every config in configs/ flattened to sorted `key: value` text, compared with a golden file.

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
    text = flat.flat_text(config_loading.load_plain(value))
  finally:
    os.chdir(cwd)
  golden = GOLDEN / (pathlib.Path(name).stem + (f"_{arg.replace('=', '-')}" if arg else "") + ".txt")
  if os.environ.get("UPDATE_GOLDEN"):
    golden.parent.mkdir(parents=True, exist_ok=True)
    golden.write_text(text)
  assert golden.exists(), f"no golden file {golden}; run UPDATE_GOLDEN=1 make test"
  assert text == golden.read_text(), (
      f"{value} changed; review and regenerate with UPDATE_GOLDEN=1 make test")


def test_every_golden_file_has_a_config():
  expected = {(pathlib.Path(n).stem + (f"_{a.replace('=', '-')}" if a else "") + ".txt")
              for n, a in CASES}
  assert {p.name for p in GOLDEN.glob("*.txt")} <= expected
