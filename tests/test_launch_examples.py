"""Every `axtrain launch` example of README.md, docs/*.md and `axtrain launch --help` can run.

Each example's training arguments pass the checks launch makes before it writes anything
(launcher/launch/checks.py: the config, the shapes over the job's devices), and its step fits
its mesh entry: quickly, by the stored `axtrain plan` report of its config on its mesh
(planner/plan_docs.py, the train step as the docs' plans compile it); slowly (make test-slow),
by the compile and verdict that launch itself makes (checks.fit: train and eval steps).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex

import pytest

from launcher import main as main_lib
from launcher.launch import checks, command, layout as layout_lib
from planner import plan_docs
from tests.conftest import ROOT, gpu_compiler_missing
from trainer import meshes

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

_EXAMPLE = re.compile(r"^\s*(?:\$ )?axtrain launch (--backend=[a-z0-9-]+ .*)$")


@dataclasses.dataclass(frozen=True)
class Example:
  where: str
  launch: tuple[str, ...]  # launch's own flags
  train: tuple[str, ...]  # the axtrain arguments after `--`

  def flag(self, name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in self.launch if a.startswith(f"--{name}=")), None)


def examples() -> list[Example]:
  texts = {p.relative_to(ROOT).as_posix(): p.read_text()
           for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
  texts["axtrain launch --help"] = command.__doc__
  out = []
  for where, text in texts.items():
    for line in text.splitlines():
      m = _EXAMPLE.match(line)
      if m and "|" not in m[1]:  # not the usage line's alternatives
        words = shlex.split(m[1].split(" # ")[0])
        cut = words.index("--")
        out.append(Example(where, tuple(words[:cut]), tuple(words[cut + 1:])))
  return out


EXAMPLES = examples()


def _id(example: Example) -> str:
  return f"{example.where}:{example.flag('backend')}"


def test_the_examples_are_found():
  assert {e.where for e in EXAMPLES} >= {"README.md", "docs/launch.md", "axtrain launch --help"}
  assert {e.flag("backend") for e in EXAMPLES} == {"local", "slurm", "k8s", "tpu-vm"}


def _train(example: Example, monkeypatch) -> checks.Train:
  monkeypatch.chdir(ROOT)
  launch_flags = set(command._define_flags())  # pylint: disable=protected-access
  fv = checks.parse(list(example.train), main_lib.parse_flags, launch_flags=launch_flags)
  return checks.resolve(list(example.train), fv)


@pytest.mark.parametrize("example", EXAMPLES, ids=_id)
def test_each_example_passes_the_checks_before_writing_and_has_a_plan_that_fits(example,
                                                                                monkeypatch):
  train = _train(example, monkeypatch)
  def number(name):
    return None if example.flag(name) is None else int(example.flag(name))
  layout = layout_lib.resolve(train.mesh, num_processes=number("num_processes"),
                              devices_per_process=number("devices_per_process"),
                              local_platform="cpu")
  checks.layout(train, layout.num_devices, layout.platform)
  if meshes.lookup(train.mesh).num_devices is None:
    return  # a generic entry: each process checks its own devices' memory before it trains
  config = next(a.split("=", 1)[1] for a in example.train if a.startswith("--config="))
  overrides = tuple(a for a in example.train if a.startswith("--config."))
  stored = [r for r in plan_docs.REPORTS
            if (r.config, r.mesh) == (config, train.mesh) and r.flags == overrides]
  assert stored, (f"{example.where}: no stored plan of {config} on {train.mesh}; add it to "
                  f"planner/plan_docs.py:LAUNCHED and run `python -m planner.plan_docs NAME`")
  data = json.loads(stored[0].path.read_text())
  assert data["fits"], f"{example.where}: {stored[0].name} does not fit: {data['needed']} bytes"


@pytest.mark.slow  # a GPU or TPU compile of LLaMA-1B each: 15 s to 2 minutes on 2 cores
@pytest.mark.parametrize("example", [e for e in EXAMPLES if meshes.lookup(
    next(a.split("=", 1)[1] for a in e.train if a.startswith("--mesh="))).num_devices], ids=_id)
def test_each_example_fits_by_the_compile_launch_makes(example, monkeypatch):
  train = _train(example, monkeypatch)
  if train.mesh.startswith("gpu-") and (missing := gpu_compiler_missing()):
    pytest.skip(missing)
  found = checks.fit(train)
  assert found.fits, f"{example.where}: {found.command}: {found.text}"
