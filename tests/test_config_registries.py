"""The config loader registers every component itself: a config file that imports nothing but
ml_collections (as `axtrain convert`'s config.py) takes kind switches and overrides in every
section, in a fresh process where nothing else has imported a registry."""

import json
import subprocess
import sys

from tests.conftest import ROOT, _env

# Run in a fresh interpreter: this test process has imported every registry long ago.
SCRIPT = """
import dataclasses, json, sys
from launcher import config_loading

cfg = config_loading.load(sys.argv[1], "--config.data.kind=jsonl", "--config.data.path=c.jsonl",
                          "--config.optimizer.kind=lion", "--config.optimizer.learning_rate=1e-4",
                          "--config.model.block.ffn.hidden_dim=64")
loaded = [cfg.data.kind, cfg.data.tokenizer.kind, cfg.optimizer.kind,
          cfg.optimizer.learning_rate, cfg.model.block.ffn.hidden_dim]

from core.registry import child_registry, list_registry
from trainer.config import RunConfig
missing, seen = set(), set()

def walk(cls):
  for f in dataclasses.fields(cls):
    try:
      reg = child_registry(f) or (list_registry(f) or (None,))[0]
    except KeyError as e:
      missing.add(e.args[0])
      continue
    if reg is not None and reg.name not in seen:
      seen.add(reg.name)
      for kind in reg.kinds():
        walk(reg.entry(kind).config_cls)

walk(RunConfig)
print(json.dumps({"loaded": loaded, "missing": sorted(missing), "seen": sorted(seen)}))
"""

PLAIN = '''"""A config file as `axtrain convert` writes one: plain data, no registry imported."""

import json

import ml_collections

CONFIG = {config!r}


def get_config(arg=None):
  del arg
  return ml_collections.ConfigDict(json.loads(CONFIG))
'''


def test_a_config_file_that_imports_no_registry_takes_switches_and_overrides(tmp_path):
  from launcher import config_loading  # pylint: disable=import-outside-toplevel
  tiny = config_loading.load(str(ROOT / "configs" / "tiny.py"))
  (tmp_path / "plain.py").write_text(PLAIN.format(config=tiny.to_json_best_effort()))
  done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "plain.py")], cwd=ROOT,
                        env=_env(None, None), capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.splitlines()[-1])
  assert out["loaded"] == ["jsonl", "bytes", "lion", 1e-4, 64]
  # Every registry that a run config's tree can reach exists once the loader has run (the
  # walk is not empty: it reaches the model's, the data's and the optimizer's children).
  assert out["missing"] == []
  assert {"model", "attention", "norm", "data", "tokenizer", "optimizer",
          "schedule"} <= set(out["seen"]), out["seen"]
