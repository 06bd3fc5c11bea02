"""README.md's `make demo` lines name the command and the run that `make demo` makes.

README shows the `axtrain generate` command that ends `make demo`, not the text it samples: that
text is one draw from one machine's 300-step training, which no test pins, so README quotes none.
What can drift silently is the command: README's line must be the Makefile's (prompt, length,
temperature, seed, run), the run it samples must be the 300 steps of configs/tiny.py that README
describes, and no sample text may stand under the command.
"""

from __future__ import annotations

import re
import shlex

from configs import tiny
from tests.conftest import ROOT


def _makefile_demo() -> tuple[list[str], list[str]]:
  """(the demo's training command, its generate command), as argument lists after `axtrain`."""
  text = (ROOT / "Makefile").read_text()
  prompt = re.search(r"^DEMO_PROMPT := (.*)$", text, re.M)[1]
  recipe = text.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
  commands = [line.strip().lstrip("@").replace("$(DEMO_PROMPT)", prompt)
              for line in recipe.splitlines() if "$(BIN)/axtrain" in line]
  train, generate = (shlex.split(c)[1:] for c in commands)
  return train, generate


def _sampling_section() -> str:
  return (ROOT / "README.md").read_text().split("\n## Sampling\n", 1)[1].split("\n## ", 1)[0]


def _readme_demo_block() -> tuple[list[str], list[str]]:
  """(README's generate command after `axtrain`, the lines under it in the same block)."""
  block = re.search(r"```\n(\$ axtrain generate .*?)\n```", _sampling_section(), re.S)[1]
  command, rest, pending = [], [], ""
  for line in block.splitlines():
    if command:
      rest.append(line)
    elif line.endswith("\\"):
      pending += line[:-1]
    else:
      command = shlex.split((pending + line).removeprefix("$ "))[1:]
  return command, rest


def test_readme_demo_command_is_the_one_make_demo_runs():
  train, generate = _makefile_demo()
  readme, rest = _readme_demo_block()
  assert readme == generate
  assert not [line for line in rest if line.strip()], (
      f"README quotes sampled text under the demo command, which no test checks: {rest}")
  assert "--config=configs/tiny.py" in train and "--output_dir=runs/demo" in train
  assert "--run_dir=runs/demo" in generate


def test_the_sampled_run_is_300_steps_of_tiny():
  steps = int(re.search(r"after (\d+) steps", _sampling_section())[1])
  assert steps == tiny.get_config().trainer.max_steps
