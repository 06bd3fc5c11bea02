"""`axtrain launch`: start one run on several processes or machines, through a real scheduler.

usage:
  axtrain launch --backend=local|slurm|k8s|tpu-vm [launch flags] -- AXTRAIN ARGUMENTS

examples:
  axtrain launch --backend=local --num_processes=2 --devices_per_process=2 -- --config=configs/tiny.py --mesh=cpu
  axtrain launch --backend=slurm --time=4:00:00 --partition=gpu --submit -- --config=configs/llm_1b.py --mesh=gpu-h100-8x2
  axtrain launch --backend=k8s --image=REGISTRY/axtrain:v1 --volume=runs:/runs -- --config=configs/llm_1b.py --mesh=gpu-h100-8x4 --output_dir=/runs/1b
  axtrain launch --backend=tpu-vm --tpu_name=my-tpu --zone=us-west4-a -- --config=configs/llm_1b.py --mesh=tpu-v5e-16 --output_dir=/mnt/runs/1b

First it makes the checks the processes would make before they touch the disk (the config;
the run directory: a different config, completed, inside another run; the shapes over the
job's devices; local: the mesh entry against this machine); for a named mesh entry it compiles
the step as `axtrain plan` does and refuses one that does not fit its devices (--force: a
warning instead; --nocheck_fit: no compile). Then it writes what starts the run as a new record, never replacing an
earlier one (the highest NNN is the newest): launch/NNN-local.sh or launch/NNN-slurm.sbatch in
the run directory, NNN-k8s.yaml or NNN-tpu-vm.sh in --record_dir (the cluster's run directory
is not created here). It prints it, then: local runs the processes (unless --dry_run); slurm,
k8s and tpu-vm submit only with --submit (sbatch, kubectl apply, gcloud ssh). The mesh entry
(--mesh after `--`, docs/meshes.md) sets the hosts and devices; a generic entry (cpu, gpu,
auto) takes --num_processes. Exit codes: those of the run (0 done, 1 failed, 2 usage error, 74
no space left on a disk: free space, then re-run, 75 preempted: re-run to resume, 130 Ctrl-C
before training); mistakes print one line and write nothing. docs/launch.md.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shlex
import shutil
import sys
from typing import Callable

from absl import flags

from launcher import config_loading, run_dir as run_dir_lib
from launcher.errors import UserError, suggest
from launcher.launch.job import Backend, Job, default_name
from launcher.launch import checks, k8s, layout as layout_lib, local, slurm, tpu_vm

BACKENDS: dict[str, Backend] = {b.name: b for b in (local.BACKEND, slurm.BACKEND, k8s.BACKEND,
                                                    tpu_vm.BACKEND)}
_RECORD = re.compile(r"^(\d+)-")  # a launch record: NNN-<file>, numbered in launch order


def _define_flags() -> flags.FlagValues:
  fv = flags.FlagValues()
  flags.DEFINE_string("backend", None, "local, slurm, k8s or tpu-vm (required).", flag_values=fv)
  flags.DEFINE_boolean("dry_run", False, "Only write (and print) the launch record, the script "
                       "or manifest; start nothing.", flag_values=fv)
  flags.DEFINE_boolean("submit", False, "slurm, k8s, tpu-vm: also submit it (sbatch, kubectl "
                       "apply, gcloud ssh).", flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "Processes in all (a generic mesh entry; a named "
                       "one fixes it).", flag_values=fv)
  flags.DEFINE_integer("devices_per_process", None, "Devices each process drives (CPU: fake "
                       "devices; GPU: a slice of the host's GPUs).", flag_values=fv)
  flags.DEFINE_string("process_per", "host", "host: one process per host; device: one per GPU "
                      "(named GPU entries).", flag_values=fv)
  flags.DEFINE_string("job_name", None, "The scheduler's job name (default: axtrain-<config>-"
                      "<run>).", flag_values=fv)
  flags.DEFINE_string("axtrain", None, "The command that runs axtrain where the job runs "
                      "(default: this installation for local and slurm, `axtrain` in the k8s "
                      "image, .venv/bin/axtrain under --workdir on TPU VMs).", flag_values=fv)
  flags.DEFINE_string("workdir", None, "Where the processes run (default: this directory for "
                      "slurm and tpu-vm, the image's for k8s).", flag_values=fv)
  flags.DEFINE_integer("max_restarts", 5, "slurm: requeues after exit 75; k8s: failures per "
                       "pod counted by backoffLimit.", flag_values=fv)
  flags.DEFINE_boolean("check_fit", True, "Compile the step for a named mesh entry on this "
                       "machine, as `axtrain plan` does (seconds for a small model, minutes for a "
                       "large one), and refuse a job whose step does not fit its devices' memory; "
                       "--nocheck_fit skips the compile.", flag_values=fv)
  flags.DEFINE_boolean("force", False, "Launch a job even when that check finds its step too "
                       "big for the devices (a warning instead of the refusal).", flag_values=fv)
  flags.DEFINE_string("record_dir", None, "k8s, tpu-vm: where this machine keeps the launch "
                      "record (default: launches/<job name>); local and slurm keep it in the run "
                      "directory's launch/.", flag_values=fv)
  for backend in BACKENDS.values():
    backend.define(fv)
  return fv


def help_text(fv: flags.FlagValues) -> str:
  own = {name for b in BACKENDS.values() for name in b.flag_names}
  lines = [__doc__.strip(), "", "backends:"]
  lines += [f"  {b.name}: {b.summary}" for b in BACKENDS.values()]
  groups = [("options", sorted(n for n in fv if n not in own))]
  groups += [(f"{b.name} options", sorted(b.flag_names)) for b in BACKENDS.values()
             if b.flag_names]
  for title, names in groups:
    lines += ["", f"{title}:"]
    for name in names:
      flag = fv[name]
      default = "" if flag.default in (None, "", []) else f" (default: {flag.default})"
      lines.append(f"  --{name}: {flag.help}{default}")
  return "\n".join(lines) + "\n"


def main(argv: list[str], *, parse_train: Callable[[list[str]], flags.FlagValues]) -> int:
  """argv without the `launch` word: [prog, launch flags..., --, axtrain arguments...].

  `parse_train`: training's own flag parser (launcher/main.py:parse_flags), handed down by the
  dispatch so that this package never imports the module above it.
  """
  fv = _define_flags()
  cut = argv.index("--") if "--" in argv else len(argv)
  ours, train_args = argv[:cut], argv[cut + 1:]
  if any(a in ("-h", "--help", "-help", "--helpfull") for a in ours[1:]):
    sys.stdout.write(help_text(fv))
    return 0
  _parse(fv, ours)
  backend = _backend(fv.backend)
  starts = _check_modes(fv, backend)
  train_fv = checks.parse(train_args, parse_train, launch_flags=set(fv))
  layout = layout_lib.resolve(
      train_fv.mesh, num_processes=fv.num_processes, devices_per_process=fv.devices_per_process,
      process_per=fv.process_per, nodes=fv.nodes,
      local_platform=local.this_machine_platform() if backend.runs_by_default else None,
      sized_by_flags=backend.sized_by_flags)
  if fv.max_restarts < 0:
    raise UserError(f"--max_restarts={fv.max_restarts}: must be >= 0")
  train = checks.resolve(train_args, train_fv)
  checks.layout(train, layout.num_devices, layout.platform)
  job = _job(fv, backend, argv=argv, train=train, layout=layout)
  backend.check(job, fv)
  if backend.runs_here:
    checks.check_place(job.run_dir)
  texts = backend.render(job, fv)
  reason = backend.preflight(texts) if starts else None
  if reason:
    raise UserError(f"{backend.tool} would refuse this job: {reason}")
  with checks.claimed(train) if backend.runs_here else contextlib.nullcontext() as state:
    if state == "completed":
      say(checks.completed_note(job.run_dir))
      return 0
    if fv.check_fit:
      checks.check_fit(train, force=fv.force, say=say)
    say(f"{backend.name}: {layout.describe()}; run directory {job.run_dir}")
    for text in texts.values():
      sys.stdout.write(text)
    sys.stdout.flush()
    files = write_record(job.record_dir, texts)
  say(f"wrote {', '.join(str(p) for p in files.values())}")
  if not starts:
    say(backend.submit_hint(job, files))
    return 0
  return backend.start(job, fv, files)


def _job(fv: flags.FlagValues, backend: Backend, *, argv: list[str], train: checks.Train,
         layout: layout_lib.Layout) -> Job:
  run_dir = train.run_dir
  _check_names(fv, backend, run_dir)
  name = fv.job_name or default_name(run_dir)
  return Job(name=name, layout=layout, train_args=train.args, axtrain=_axtrain(fv, backend),
             workdir=fv.workdir or (None if backend.own_workdir else os.getcwd()),
             run_dir=run_dir, record_dir=_record_dir(fv, backend, run_dir, name),
             command=shlex.join(["axtrain", "launch", *argv[1:]]),
             coordinator_port=backend.port(fv))


def _record_dir(fv: flags.FlagValues, backend: Backend, run_dir: pathlib.Path,
                name: str) -> pathlib.Path:
  """Where the launch record goes: the run directory's launch/ where the processes share this
  filesystem; else --record_dir or launches/<job name> here, never the cluster's path."""
  if backend.runs_here:
    if fv.record_dir is not None:
      raise UserError(f"launch: --record_dir is for k8s and tpu-vm; --backend={backend.name} "
                      f"keeps its record in the run directory's launch/")
    return run_dir / "launch"
  if fv.record_dir is not None and not fv.record_dir.strip():
    raise UserError("launch: --record_dir is empty; give a directory, or leave it out for "
                    f"launches/{name}")
  where = pathlib.Path(os.path.expanduser(fv.record_dir or f"launches/{name}"))
  run_dir_lib.check_writable(where, flag="--record_dir")
  return where


def say(text: str) -> None:
  print(f"axtrain launch: {text}", file=sys.stderr, flush=True)


def _parse(fv: flags.FlagValues, ours: list[str]) -> None:
  config_loading.check_values(fv, ours)
  try:
    rest = fv(ours)
  except flags.UnrecognizedFlagError as e:
    raise UserError(f"launch: unknown flag --{e.flagname}{suggest(e.flagname, list(fv))}; the "
                    f"axtrain arguments go after `--`; see axtrain launch --help") from None
  except flags.Error as e:
    raise UserError(f"launch: {config_loading.translate(e, []).args[0]}") from None
  if rest[1:]:
    raise UserError(f"launch: unexpected argument '{rest[1]}'; the axtrain arguments go "
                    f"after `--`: axtrain launch --backend=local --num_processes=2 -- "
                    f"--config=configs/tiny.py")


def _backend(name: str | None) -> Backend:
  if not name:
    raise UserError(f"launch: --backend is required: {', '.join(BACKENDS)}")
  if name not in BACKENDS:
    hint = suggest(name.lower(), BACKENDS) or suggest(name, BACKENDS)
    raise UserError(f"launch: unknown --backend={name}{hint}; backends: {', '.join(BACKENDS)}")
  return BACKENDS[name]


def _check_modes(fv: flags.FlagValues, backend: Backend) -> bool:
  """Whether this launch starts what it writes; UserError for modes that cannot work."""
  if fv.dry_run and fv.submit:
    raise UserError("launch: --dry_run only writes; --submit also submits: choose one")
  if fv.submit and backend.runs_by_default:
    raise UserError(f"launch: --backend={backend.name} runs the processes itself; --submit is for"
                    f" slurm, k8s and tpu-vm (--dry_run only writes the script)")
  for other in BACKENDS.values():
    for name in other.flag_names:
      if other is not backend and fv[name].present:
        raise UserError(f"launch: --{name} is a --backend={other.name} flag; this launch is "
                        f"--backend={backend.name}")
  starts = fv.submit or (backend.runs_by_default and not fv.dry_run)
  if starts and backend.tool and shutil.which(backend.tool) is None:
    raise UserError(f"launch: --submit runs `{backend.tool}`, which is not on PATH here; drop "
                    f"--submit to only write the {backend.name} files, and submit them where "
                    f"{backend.tool} runs")
  return starts


def _check_names(fv: flags.FlagValues, backend: Backend, run_dir: pathlib.Path) -> None:
  if fv.job_name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", fv.job_name):
    raise UserError(f"--job_name={fv.job_name}: letters, digits, '.', '_' and '-', starting with "
                    f"a letter or digit")
  if (fv.workdir and backend.runs_here and not run_dir.is_absolute()
      and pathlib.Path(fv.workdir).absolute() != pathlib.Path.cwd()):
    raise UserError(f"--workdir={fv.workdir} runs the processes in another directory: give an "
                    f"absolute --output_dir, so that they and launch mean the same run directory")


def _axtrain(fv: flags.FlagValues, backend: Backend) -> tuple[str, ...]:
  if fv.axtrain:
    try:
      words = tuple(shlex.split(fv.axtrain))
    except ValueError as e:
      raise UserError(f"--axtrain={fv.axtrain}: {e}") from None
    if not words:
      raise UserError("--axtrain is empty; give the command that runs axtrain")
    return words
  if backend.axtrain is not None:
    return backend.axtrain
  script = pathlib.Path(sys.executable).parent / "axtrain"
  if script.is_file() and not backend.runs_by_default:  # a script the job can read
    return (str(script),)
  return (sys.executable, "-m", "launcher")


def write_record(directory: pathlib.Path, texts: dict[str, str]) -> dict[str, pathlib.Path]:
  """Writes `texts` (file name -> text) into `directory` as NNN-<name>, NNN one above the highest
  record there, so that no launch replaces an earlier one's record; returns name -> path."""
  directory.mkdir(parents=True, exist_ok=True)
  numbers = [int(m[1]) for p in directory.iterdir() if (m := _RECORD.match(p.name))]
  number = max(numbers, default=0) + 1
  while True:
    paths = {name: directory / f"{number:03d}-{name}" for name in texts}
    try:
      for name, text in texts.items():
        with open(paths[name], "x", encoding="utf-8") as f:  # never over an existing file
          f.write(text)
        if text.startswith("#!"):
          paths[name].chmod(0o755)
      return paths
    except FileExistsError:  # another launch took this number meanwhile
      number += 1
