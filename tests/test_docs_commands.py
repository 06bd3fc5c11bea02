"""The command blocks of README.md and docs/*.md marked runnable run as written.

A block is marked by the line `<!-- runnable -->` (or `<!-- runnable devices=N -->` for a
command that names a mesh of N devices) right before its opening fence; GitHub does not show
the comment. Every line of a marked block is one `axtrain` command (a `\\` continues it, `#`
starts a comment). The test runs each command with a small budget appended (`BUDGET`: two
steps, one eval batch, its own --output_dir) and `devices=N` fake CPU devices; the commands of
one device count run in one process (conftest.cli_batch), each distinct command once. Plans of
large configs on TPU meshes (minutes each) are not marked.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shlex

import pytest

from tests.conftest import ROOT, cli_batch

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- runnable(?: devices=(\d+))? -->")
# Appended to a training command (one whose first argument is a flag): the later flag wins.
BUDGET = ("--config.trainer.max_steps=2", "--config.eval.num_batches=1", "--noprogress")


@dataclasses.dataclass(frozen=True)
class Command:
  where: str  # file:line of the command's first line
  args: tuple[str, ...]  # after `axtrain`
  devices: int | None  # fake CPU devices; None = the process's one
  block: str = ""  # file:line of its block's marker: the commands of a block run in order


class MarkupError(ValueError):
  """A marker that is not followed by a fence, or a marked line that is not a command."""


def _block(lines: list[str], start: int, *, name: str) -> list[tuple[int, str]]:
  """(line number, text) of the block whose opening fence is lines[start]."""
  if not lines[start].startswith("```"):
    raise MarkupError(f"{name}:{start}: a runnable marker must be right before a ``` fence")
  out = []
  for i in range(start + 1, len(lines)):
    if lines[i].startswith("```"):
      return out
    out.append((i + 1, lines[i]))
  raise MarkupError(f"{name}:{start + 1}: the block never closes")


def _commands(block: list[tuple[int, str]], *, name: str, devices: int | None,
              marker: str = "") -> list[Command]:
  """The block's `axtrain` commands, continuation lines joined, comments dropped."""
  out, pending, first = [], "", 0
  for number, text in block:
    if not pending:
      first = number
    pending += text
    if pending.endswith("\\"):
      pending = pending[:-1] + " "
      continue
    words = shlex.split(pending, comments=True)
    pending = ""
    if not words:
      continue
    if words[0] != "axtrain":
      raise MarkupError(f"{name}:{first}: a runnable block holds only axtrain commands, got "
                        f"{words[0]!r}")
    out.append(Command(where=f"{name}:{first}", args=tuple(words[1:]), devices=devices,
                       block=marker))
  return out


def runnable_in(text: str, *, name: str) -> list[Command]:
  """The commands of the blocks that the markdown `text` (of file `name`) marks runnable."""
  lines = text.splitlines()
  out = []
  for i, line in enumerate(lines):
    if "<!-- runnable" not in line:
      continue
    marker = MARKER.fullmatch(line.strip())
    if marker is None:
      raise MarkupError(f"{name}:{i + 1}: not a runnable marker: {line.strip()!r} (write "
                        f"<!-- runnable --> or <!-- runnable devices=N -->)")
    devices = int(marker[1]) if marker[1] else None
    out += _commands(_block(lines, i + 1, name=name), name=name, devices=devices,
                     marker=f"{name}:{i + 1}")
  return out


COMMANDS = [c for path in DOCS
            for c in runnable_in(path.read_text(), name=str(path.relative_to(ROOT)))]


def budgeted(args: tuple[str, ...], output_dir) -> list[str]:
  """`args` with the test's budget: training commands (first argument a flag) train 2 steps
  into `output_dir`; subcommands run as written."""
  if not args or not args[0].startswith("-") or "--help" in args:
    return list(args)
  return [*args, *BUDGET, f"--output_dir={output_dir}"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
  """{(args, devices): result} of every distinct marked command."""
  root = tmp_path_factory.mktemp("docs")
  distinct = list(dict.fromkeys((c.args, c.devices) for c in COMMANDS))
  out = {}
  for devices in dict.fromkeys(d for _, d in distinct):
    group = [args for args, d in distinct if d == devices]
    argvs = [budgeted(args, root / f"{devices}-{i}") for i, args in enumerate(group)]
    for args, result in zip(group, cli_batch(argvs, devices=devices)):
      out[args, devices] = result
  return out


# Each training command compiles its init, train and eval steps: 12-30 s of CPU on 2 shared
# cores (measured on 8 fake devices: moe_tiny expert=4 31 s, the pipeline 19-24 s), the
# ten distinct ones about 3.5 minutes of CPU in all; over a minute, so `slow`.
@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_a_runnable_command_runs(command, results):
  result = results[command.args, command.devices]
  assert result.returncode == 0, (f"{command.where}: axtrain {shlex.join(command.args)}\n"
                                  f"{result.stderr[-3000:]}")
  assert "Traceback" not in result.stderr, result.stderr[-3000:]


def _trains(args: tuple[str, ...]) -> tuple[pathlib.Path, dict] | None:
  """(the run directory, the resolved config) of a training command as written (without the
  test's budget and --output_dir); None for a command that trains nothing."""
  from launcher import config_loading, run_names  # pylint: disable=import-outside-toplevel
  if not args or not args[0].startswith("-") or {"--help", "--print_config"} & set(args):
    return None
  argv = ["axtrain", *args]
  config = config_loading.config_file_arg(argv)
  cfg = config_loading.load(config, *(a for a in args if a.startswith("--config.")))
  resolved = json.loads(cfg.to_json_best_effort())
  given = next((a.split("=", 1)[1] for a in args if a.startswith("--output_dir=")), None)
  if given is not None:
    return pathlib.Path(given), resolved
  effective = run_names.effective_overrides(config_loading.overrides(argv), resolved=cfg,
                                            base=config_loading.load(config))
  return run_names.name(config, effective), resolved


def test_each_training_command_of_a_block_trains_as_written(monkeypatch):
  """The commands of a block are run in order. A later one in the directory of an earlier one
  that differs from it only in where and how the steps run (the mesh, ...: no directory is
  named by them) finds that run completed and does nothing; each must train something."""
  from launcher import run_dir  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(ROOT)
  seen: dict[tuple[str, pathlib.Path], tuple[str, dict]] = {}
  for command in COMMANDS:
    found = _trains(command.args)
    if found is None:
      continue
    directory, resolved = found
    earlier = seen.get((command.block, directory))
    if earlier is not None:
      differ = [k for k in run_dir.differences(run_dir.identity(earlier[1]),
                                               run_dir.identity(resolved)) if not run_dir.relaid(k)]
      assert differ, (f"{command.where} trains in {directory}, as {earlier[0]} does, the same run:"
                      f" it would find that run completed; give it its own --output_dir")
    seen[command.block, directory] = (command.where, resolved)


def test_the_documented_pipeline_commands_are_marked():
  """Each doc that shows a pipeline (mesh.stage) training command on tiny marks it runnable."""
  marked = {c.where.split(":")[0] for c in COMMANDS if any("mesh.stage" in a for a in c.args)}
  assert {"README.md", "docs/parallelism.md", "docs/meshes.md"} <= marked


def test_markup_errors_name_the_line():
  cases = {
      "<!-- runnable -->\ntext\n": "doc.md:1: a runnable marker must be right before a ``` fence",
      "<!-- runnable devices=x -->\n```\naxtrain --help\n```\n": "doc.md:1: not a runnable marker",
      "<!-- runnable -->\n```\nfor lr in 1 2; do\n```\n": "doc.md:3: a runnable block holds only",
      "<!-- runnable -->\n```\naxtrain --help\n": "doc.md:2: the block never closes",
  }
  for text, message in cases.items():
    with pytest.raises(MarkupError, match=re.escape(message)):
      runnable_in(text, name="doc.md")
  text = ("<!-- runnable devices=8 -->\n```\naxtrain --config=c.py \\\n  --x='a b'   # note\n"
          "\n# a comment line\naxtrain --help\n```\n")
  assert runnable_in(text, name="doc.md") == [
      Command(where="doc.md:3", args=("--config=c.py", "--x=a b"), devices=8, block="doc.md:1"),
      Command(where="doc.md:7", args=("--help",), devices=8, block="doc.md:1")]
