"""`axtrain launch --backend=tpu-vm`: axtrain on every worker of a Cloud TPU VM slice, by gcloud ssh.

    gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all --command='cd DIR && axtrain ...'

JAX reads each worker's process index and the coordinator (worker 0) from the TPU environment
(`--distributed=tpu`, launcher/distributed.py). A multi-slice entry (`tpu-v5e-16x2`) runs on
the slices NAME-0 ... NAME-{N-1}, the names a queued resource with `--node-count=N
--node-prefix=NAME` gives: the script looks up worker 0 of NAME-0 and gives every worker
MEGASCALE_COORDINATOR_ADDRESS, MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID and MEGASCALE_PORT, the
variables that join slices over the data-center network. Every worker must hold the checkout
and its .venv at --workdir. The script ends with the workers' exit code; after a preemption
(75) run it again, and the run resumes from its checkpoint.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess

from absl import flags

from launcher.errors import UserError
from launcher.launch.job import Backend, Job, header

MEGASCALE_PORT = 8080  # the slices' coordinator port on NAME-0 worker 0
_TPU_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_PROJECT = re.compile(r"^[a-z][-a-z0-9.:]*[a-z0-9]$")


def _define(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("tpu_name", None, "tpu-vm: the TPU VM's name (multi-slice: the prefix of "
                      "NAME-0, NAME-1, ...).", flag_values=fv)
  flags.DEFINE_string("zone", None, "tpu-vm: the TPU's zone, e.g. us-west4-a.", flag_values=fv)
  flags.DEFINE_string("project", None, "tpu-vm: the Google Cloud project (default: gcloud's).",
                      flag_values=fv)


FLAG_NAMES = ("tpu_name", "zone", "project")


def _check(job: Job, fv: flags.FlagValues) -> None:
  layout = job.layout
  if layout.platform != "tpu":
    raise UserError(f"--backend=tpu-vm launches Cloud TPU entries (tpu-v5e-16, tpu-v5p-128x2, "
                    f"...); --mesh={layout.mesh} is {layout.platform}")
  if not fv.tpu_name:
    raise UserError("--backend=tpu-vm needs --tpu_name=NAME, the TPU VM (gcloud compute tpus "
                    "tpu-vm list)")
  if not _TPU_NAME.match(fv.tpu_name) or len(fv.tpu_name) > 61:
    raise UserError(f"--tpu_name={fv.tpu_name}: lowercase letters, digits and '-', starting with"
                    f" a letter")
  if not fv.zone:
    raise UserError("--backend=tpu-vm needs --zone=ZONE, the TPU's zone (e.g. us-west4-a)")
  if not _ZONE.match(fv.zone):
    raise UserError(f"--zone={fv.zone}: expected a zone like us-west4-a")
  if fv.project is not None and not _PROJECT.match(fv.project):
    raise UserError(f"--project={fv.project}: not a Google Cloud project id")
  if not job.run_dir.is_absolute() and layout.num_hosts > 1:
    raise UserError(f"--backend=tpu-vm: the run directory {job.run_dir} is relative, so each of "
                    f"the {layout.num_hosts} workers would write its own copy under --workdir on "
                    f"its own disk; give an absolute --output_dir on storage every worker mounts "
                    f"(e.g. Filestore or a gcsfuse bucket)")


def slice_names(job: Job, fv: flags.FlagValues) -> list[str]:
  n = job.layout.num_slices
  return [fv.tpu_name] if n == 1 else [f"{fv.tpu_name}-{i}" for i in range(n)]


def _where(fv: flags.FlagValues) -> str:
  return f"--zone={fv.zone}" + (f" --project={fv.project}" if fv.project else "")


def _cd(job: Job) -> str:
  return f"cd {shlex.quote(job.workdir)} && " if job.workdir else ""


def _axtrain(job: Job) -> str:
  """axtrain's command line on a worker; several hosts join through the TPU environment."""
  return job.shell(*(("--distributed=tpu",) if job.layout.num_hosts > 1 else ()))


def _render(job: Job, fv: flags.FlagValues) -> dict[str, str]:
  layout = job.layout
  names = slice_names(job, fv)
  lines = ["#!/bin/bash",
           header(job, "Cloud TPU VM commands of `axtrain launch --backend=tpu-vm`: run "
                  "axtrain on every worker; docs/launch.md.").rstrip("\n"),
           "set -euo pipefail"]
  if len(names) == 1:
    lines += [f"# {layout.hosts_per_slice} worker(s) of {names[0]} ({layout.topology}).",
              f"gcloud compute tpus tpu-vm ssh {names[0]} {_where(fv)} --worker=all "
              f"--command={shlex.quote(_cd(job) + _axtrain(job))}"]
  else:
    lines += [f"# {len(names)} slices of {layout.hosts_per_slice} workers ({layout.topology} "
              f"each), joined over the data-center network by the MEGASCALE variables;",
              f"# the coordinator is worker 0 of {names[0]}.",
              f"coordinator=$(gcloud compute tpus tpu-vm describe {names[0]} {_where(fv)} "
              f"--format='value(networkEndpoints[0].ipAddress)')",
              "pids=()"]
    for i, name in enumerate(names):
      # The worker's command line, quoted for it, with $coordinator filled in here.
      head = f"{_cd(job)}MEGASCALE_COORDINATOR_ADDRESS="
      tail = (f":{MEGASCALE_PORT} MEGASCALE_NUM_SLICES={len(names)} MEGASCALE_SLICE_ID={i} "
              f"MEGASCALE_PORT={MEGASCALE_PORT} {_axtrain(job)}")
      lines += [f"gcloud compute tpus tpu-vm ssh {name} {_where(fv)} --worker=all "
                f"--command={shlex.quote(head)}\"$coordinator\"{shlex.quote(tail)} &",
                "pids+=($!)"]
    lines += ["code=0",
              'for pid in "${pids[@]}"; do wait "$pid" || code=$?; done',
              'exit "$code"']
  return {"tpu-vm.sh": "\n".join(lines) + "\n"}


def _start(job: Job, fv: flags.FlagValues, files: dict[str, pathlib.Path]) -> int:
  del job, fv
  return subprocess.run(["bash", str(files["tpu-vm.sh"])], check=False).returncode


def _hint(job: Job, files: dict[str, pathlib.Path]) -> str:
  del job
  return f"run it with: bash {shlex.quote(str(files['tpu-vm.sh']))}  (or add --submit)"


BACKEND = Backend(name="tpu-vm", summary="gcloud ssh to every worker of a Cloud TPU VM slice "
                  "(multi-slice: NAME-0..NAME-{N-1})", tool="gcloud", flag_names=FLAG_NAMES,
                  define=_define, check=_check, render=_render, start=_start, submit_hint=_hint,
                  runs_here=False, axtrain=(".venv/bin/axtrain",))
