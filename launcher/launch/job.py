"""What every `axtrain launch` backend is handed: the job (`Job`) and the backend's own hooks.

A backend (local.py, slurm.py, k8s.py, tpu_vm.py) is one `Backend`: its flags, its checks, the
files it writes into the run directory's launch/, and how it starts them. command.py parses,
checks what all backends share, and calls these in order.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex
from typing import Callable

from absl import flags

from launcher.launch.layout import Layout


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
  name: str  # the scheduler's job name (and the Kubernetes objects' names)
  layout: Layout
  train_args: tuple[str, ...]  # the axtrain arguments after `--`, as given
  axtrain: tuple[str, ...]  # the command that runs axtrain where the job runs
  workdir: str | None  # where it runs (--workdir, or this directory); None: the image's (k8s)
  run_dir: pathlib.Path  # the run directory, as the processes see it
  record_dir: pathlib.Path  # where this machine keeps the launch record (command.py)
  command: str  # the `axtrain launch ...` command line, recorded in what is written
  coordinator_port: int | None = None  # process 0's port, where the backend chooses it

  @property
  def launch_dir(self) -> pathlib.Path:
    """The run directory's launch/, as the processes see it (Slurm writes its log there)."""
    return self.run_dir / "launch"

  def argv(self, *extra: str) -> list[str]:
    """One process's command line: axtrain, the training arguments, then `extra` flags."""
    return [*self.axtrain, *self.train_args, *extra]

  def shell(self, *extra: str) -> str:
    return shlex.join(self.argv(*extra))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Backend:
  name: str
  summary: str  # one line for --help
  tool: str | None  # the program --submit (or a local run) needs on PATH
  flag_names: tuple[str, ...]  # flags only this backend reads (refused with another backend)
  define: Callable[[flags.FlagValues], None]  # defines those flags
  check: Callable[[Job, flags.FlagValues], None]  # UserError for flags that cannot work
  render: Callable[[Job, flags.FlagValues], dict[str, str]]  # launch/ file name -> text
  start: Callable[[Job, flags.FlagValues, dict[str, pathlib.Path]], int]  # run / submit
  submit_hint: Callable[[Job, dict[str, pathlib.Path]], str]  # how to start what was written
  runs_by_default: bool = False  # local runs unless --dry_run; the others need --submit
  sized_by_flags: bool = False  # a generic mesh entry may be sized by --num_processes
  runs_here: bool = True  # the processes see this filesystem (else --workdir is theirs)
  own_workdir: bool = False  # they start in their own directory (an image's) unless --workdir
  # The command that runs axtrain where the job runs, unless --axtrain (None: this installation).
  axtrain: tuple[str, ...] | None = None
  # The coordinator's port (None: the scheduler's or JAX's own choice).
  port: Callable[[flags.FlagValues], int | None] = lambda fv: None
  # Checks the rendered files with the scheduler before anything is written or submitted;
  # returns why they would be refused (None: fine). Called only when launch submits.
  preflight: Callable[[dict[str, str]], str | None] = lambda texts: None


_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


def default_name(run_dir: pathlib.Path) -> str:
  """`axtrain-<config>-<run>` from the run directory's last two parts, as a DNS label
  (lowercase letters, digits, '-'; at most 40 characters), which every scheduler accepts."""
  parts = [p for p in run_dir.parts[-2:] if p not in ("/", ".", "..")]
  slug = _DNS_LABEL.sub("-", "-".join(["axtrain", *parts]).lower()).strip("-")
  slug = re.sub(r"-{2,}", "-", slug)
  return slug[:40].rstrip("-")


def header(job: Job, what: str, comment: str = "#") -> str:
  """The first lines of a written file: what it is and the command that wrote it."""
  lines = [f"{what}", f"Written by: {job.command}", f"Run directory: {job.run_dir}",
           f"Layout: {job.layout.describe()}"]
  return "".join(f"{comment} {line}\n" for line in lines)
