"""`axtrain launch`: start one run on several processes or machines, through a real scheduler.

usage:
  axtrain launch --backend=local|slurm|k8s|tpu-vm [launch flags] -- AXTRAIN ARGUMENTS

examples:
  axtrain launch --backend=local --num_processes=2 --devices_per_process=2 -- --config=configs/tiny.py --mesh=cpu
  axtrain launch --backend=slurm --time=4:00:00 --partition=gpu --submit -- --config=configs/llm_1b.py --mesh=gpu-h100-8x2
  axtrain launch --backend=k8s --image=REGISTRY/axtrain:v1 --volume=runs:/runs -- --config=configs/llm_1b.py --mesh=gpu-h100-8x4 --output_dir=/runs/1b
  axtrain launch --backend=tpu-vm --tpu_name=my-tpu --zone=us-west4-a -- --config=configs/llm_1b.py --mesh=tpu-v5e-16

Writes what starts the run into the run directory's launch/ (local.sh, slurm.sbatch, k8s.yaml,
tpu-vm.sh), prints it, then: local runs the processes (unless --dry_run); slurm, k8s and
tpu-vm submit only with --submit (sbatch, kubectl apply, gcloud ssh). The mesh entry
(--mesh after `--`, docs/meshes.md) sets the hosts and devices; a generic entry (cpu, gpu,
auto) takes --num_processes. Exit codes: those of the run (0 done, 1 failed, 2 usage error,
75 preempted: re-run to resume); mistakes print one line and write nothing. docs/launch.md.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex
import shutil
import sys
from typing import Any, Callable

from absl import flags

from launcher import config_loading, run_dir as run_dir_lib
from launcher.errors import UserError, suggest
from launcher.launch.job import Backend, Job, default_name
from launcher.launch import k8s, layout as layout_lib, local, slurm, tpu_vm

BACKENDS: dict[str, Backend] = {b.name: b for b in (local.BACKEND, slurm.BACKEND, k8s.BACKEND,
                                                    tpu_vm.BACKEND)}
# Training flags that launch sets for every process itself.
_OWNED = ("coordinator_address", "num_processes", "process_id", "distributed")


def _define_flags() -> flags.FlagValues:
  fv = flags.FlagValues()
  flags.DEFINE_string("backend", None, "local, slurm, k8s or tpu-vm (required).", flag_values=fv)
  flags.DEFINE_boolean("dry_run", False, "Only write (and print) the script or manifest into "
                       "the run directory's launch/.", flag_values=fv)
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
  if "--" in argv:
    cut = argv.index("--")
    ours, train_args = argv[:cut], argv[cut + 1:]
  else:
    ours, train_args = argv, []
  if any(a in ("-h", "--help", "-help", "--helpfull") for a in ours[1:]):
    sys.stdout.write(help_text(fv))
    return 0
  _parse(fv, ours)
  backend = _backend(fv.backend)
  starts = _check_modes(fv, backend)
  train = _check_train_args(train_args, parse_train)
  layout = layout_lib.resolve(
      train.mesh, num_processes=fv.num_processes, devices_per_process=fv.devices_per_process,
      process_per=fv.process_per, nodes=fv.nodes,
      local_platform=local.this_machine_platform() if backend.runs_by_default else None,
      sized_by_flags=backend.sized_by_flags)
  if fv.max_restarts < 0:
    raise UserError(f"--max_restarts={fv.max_restarts}: must be >= 0")
  run_dir = (pathlib.Path(os.path.expanduser(train.output_dir)) if train.output_dir
             else _default_dir(train_args, train))
  _check_run_dir(run_dir)
  _check_names(fv, backend, run_dir)
  job = Job(name=fv.job_name or default_name(run_dir), layout=layout,
            train_args=tuple(train_args), axtrain=_axtrain(fv, backend),
            workdir=fv.workdir or (None if backend.own_workdir else os.getcwd()),
            run_dir=run_dir, command=shlex.join(["axtrain", "launch", *argv[1:]]),
            coordinator_port=backend.port(fv))
  backend.check(job, fv)
  texts = backend.render(job, fv)
  reason = backend.preflight(texts) if starts else None
  if reason:
    raise UserError(f"{backend.tool} would refuse this job: {reason}")
  say(f"{backend.name}: {layout.describe()}; run directory {run_dir}")
  for text in texts.values():
    sys.stdout.write(text)
  sys.stdout.flush()
  files = _write(job.launch_dir, texts)
  say(f"wrote {', '.join(str(p) for p in files.values())}")
  if not starts:
    say(backend.submit_hint(job, files))
    return 0
  return backend.start(job, fv, files)


def say(text: str) -> None:
  print(f"axtrain launch: {text}", file=sys.stderr, flush=True)


def _parse(fv: flags.FlagValues, ours: list[str]) -> None:
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Train:
  """What launch reads of the training arguments (parsed and checked as training would)."""
  mesh: str
  output_dir: str | None
  config: Any  # the resolved ml_collections.ConfigDict of the training arguments


def _check_train_args(train_args: list[str], parse_train) -> _Train:
  if not train_args:
    raise UserError("launch: give the axtrain arguments after `--`, e.g. axtrain launch "
                    "--backend=local --num_processes=2 -- --config=configs/tiny.py")
  for arg in train_args:
    name = arg.lstrip("-").split("=", 1)[0]
    if arg.startswith("--") and name in _OWNED:
      raise UserError(f"launch: drop --{name} from the axtrain arguments; launch sets it for "
                      f"every process")
    if arg.startswith("--") and name == "print_config":
      raise UserError("launch: --print_config runs no training; run it without launch")
  train = parse_train(["axtrain", *train_args])
  return _Train(mesh=train.mesh, output_dir=train.output_dir, config=train["config"].value)


def _default_dir(train_args: list[str], train: _Train) -> pathlib.Path:
  """The run directory the training processes will name (launcher/run_names.py:directory)."""
  from launcher import run_names  # pylint: disable=import-outside-toplevel
  value, items = config_loading.config_file_arg(train_args), config_loading.overrides(train_args)
  named = None if train.mesh == "auto" else train.mesh  # `auto` resolves where the processes run
  if named is not None:
    from trainer import meshes  # pylint: disable=import-outside-toplevel
    meshes.apply_rules(train.config, named, {path for path, _ in items})
  return run_names.directory(value, items, resolved=train.config, mesh=named)


def _check_run_dir(run_dir: pathlib.Path) -> None:
  run_dir_lib.check_writable(run_dir)
  if run_dir.is_dir():
    foreign = run_dir_lib.RunDir(run_dir).foreign()
    if foreign:
      raise UserError(f"{run_dir} holds files that axtrain did not write ({', '.join(foreign[:3])}"
                      f"{' ...' if len(foreign) > 3 else ''}); it is not a run directory, "
                      f"choose another --output_dir")


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


def _write(directory: pathlib.Path, texts: dict[str, str]) -> dict[str, pathlib.Path]:
  directory.mkdir(parents=True, exist_ok=True)
  out = {}
  for name, text in texts.items():
    path = directory / name
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    if text.startswith("#!"):
      tmp.chmod(0o755)
    os.replace(tmp, path)
    out[name] = path
  return out
