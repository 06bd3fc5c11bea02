"""Every registered optimizer, schedule and data kind trains through the command line.

Two steps of `configs/llama.py:size=test` per run, all runs in one process (conftest.cli_batch).
The kinds come from the registries, so a kind is covered as soon as it is registered: run i
trains the i-th kind of each registry (cycling through the shorter lists), on the data kind's
own example (trainer/data/base.py:Source.example), so max(kinds per registry) runs cover every
kind of all three.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest

import trainer.data  # noqa: F401  (registers the data sources)
from tests.conftest import cli_batch
from trainer.data.base import DATA
from trainer.optimizer import OPTIMIZERS
from trainer.schedules import SCHEDULES

KINDS = {"optimizer": OPTIMIZERS.kinds(), "optimizer.schedule": SCHEDULES.kinds(),
         "data": DATA.kinds()}
RUNS = max(len(kinds) for kinds in KINDS.values())
SMALL = ["--config.trainer.max_steps=2", "--config.data.seq_len=32", "--config.data.batch_size=4",
         "--config.eval.batch_size=4", "--config.eval.num_batches=1"]

# A data example whose fields are no command-line values (a mixture's components) is set by a
# config file, as a user sets it.
CONFIG_FILE = '''from configs import llama
from trainer.config import switch_kind


def get_config(arg=None):
  cfg = llama.get_config("size=test")
  switch_kind(cfg, "data", {kind!r})
  cfg.data.update({fields!r})
  return cfg
'''


def run_kinds(i: int) -> dict[str, str]:
  """{registry path: kind} that run `i` trains."""
  return {path: kinds[i % len(kinds)] for path, kinds in KINDS.items()}


def command(i: int, root: pathlib.Path) -> list[str]:
  kinds = run_kinds(i)
  folder = root / f"run{i}"
  folder.mkdir()
  fields = DATA.entry(kinds["data"]).target.example(folder)
  if all(isinstance(v, (str, int, float, bool)) for v in fields.values()):
    data = [f"--config.data.kind={kinds['data']}",
            *(f"--config.data.{k}={v}" for k, v in fields.items())]
    config = "configs/llama.py:size=test"
  else:
    config = str(folder / "config.py")
    pathlib.Path(config).write_text(CONFIG_FILE.format(kind=kinds["data"], fields=fields))
    data = []
  return [f"--config={config}", *data, f"--config.optimizer.kind={kinds['optimizer']}",
          f"--config.optimizer.schedule.kind={kinds['optimizer.schedule']}", *SMALL,
          f"--output_dir={folder / 'out'}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("kinds")
  commands = [command(i, root) for i in range(RUNS)]
  return [(args, result, pathlib.Path(args[-1].split("=", 1)[1]))
          for args, result in zip(commands, cli_batch(commands))]


@pytest.mark.parametrize("path,kind", [(p, k) for p, kinds in KINDS.items() for k in kinds])
def test_every_kind_trains_two_steps_through_the_cli(runs, path, kind):
  args, result, out = runs[KINDS[path].index(kind)]
  assert result.returncode == 0, (" ".join(args), result.stderr[-3000:])
  config = json.loads((out / "config.json").read_text())
  node = config
  for key in path.split("."):
    node = node[key]
  assert node["kind"] == kind
  records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_loss" in r]
  assert train[-1]["step"] == 2 and evals, records
  assert math.isfinite(train[-1]["loss"]) and math.isfinite(evals[-1]["eval_loss"])
  assert train[-1]["learning_rate"] > 0 and train[-1]["update_norm"] > 0  # the weights moved


def test_the_runs_cover_every_kind():
  covered = {path: {run_kinds(i)[path] for i in range(RUNS)} for path in KINDS}
  assert covered == {path: set(kinds) for path, kinds in KINDS.items()}
