"""README.md's `make demo` sample names the command and the run that `make demo` makes.

The sample text itself is one draw of one machine's 300-step model (README says so and how to
reproduce it): another CPU rounds the training's float sums differently and the same seed then
draws other text, so no test pins the text. What can drift silently is the command: README's
`axtrain generate` line must be the Makefile's (prompt, length, temperature, seed, run), and
the run it samples must be the 300 steps of configs/tiny.py that README describes.
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


def _readme_sample() -> tuple[list[str], str]:
  """(README's generate command after `axtrain`, the sample text under it)."""
  text = (ROOT / "README.md").read_text()
  section = text.split("\n## Sampling\n", 1)[1].split("\n## ", 1)[0]
  block = re.search(r"```\n(\$ axtrain generate .*?)\n```", section, re.S)[1]
  command, sample, pending = [], [], ""
  for line in block.splitlines():
    if command:
      sample.append(line)
    elif line.endswith("\\"):
      pending += line[:-1]
    else:
      command = shlex.split((pending + line).removeprefix("$ "))[1:]
  return command, "\n".join(sample)


def test_readme_sample_command_is_the_one_make_demo_runs():
  train, generate = _makefile_demo()
  readme, sample = _readme_sample()
  assert readme == generate
  assert sample.strip(), "README shows no sample under the command"
  assert "--config=configs/tiny.py" in train and "--output_dir=runs/demo" in train
  assert "--run_dir=runs/demo" in generate


def test_the_sampled_run_is_300_steps_of_tiny():
  section = (ROOT / "README.md").read_text().split("\n## Sampling\n", 1)[1]
  steps = int(re.search(r"after (\d+) steps", section)[1])
  assert steps == tiny.get_config().trainer.max_steps
