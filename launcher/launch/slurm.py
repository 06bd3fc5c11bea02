"""`axtrain launch --backend=slurm`: an sbatch script that runs `srun axtrain ...` on every task.

One task per host (or per GPU, `--process_per=device`); JAX reads the coordinator (the step's
first node), the process count and each task's index from the Slurm variables itself
(launcher/distributed.py). With one task per GPU host the script sets JAX_LOCAL_DEVICE_IDS to
all of the host's GPUs: JAX's Slurm detection would otherwise give each process the single GPU
of its SLURM_LOCALID.

Preemption and restarts use Slurm's own mechanisms:
  --requeue               Slurm may requeue the job (node failure, preemption by the scheduler);
  --signal=TERM@S         with --time, SIGTERM reaches every task S seconds before the limit:
                          they agree on a step, checkpoint it and exit 75;
  scontrol requeue        the script requeues its own job when srun exits 75 (a preemption by
                          SIGTERM, e.g. `scancel --signal=TERM JOB`), at most --max_restarts
                          times (SLURM_RESTART_COUNT); the requeued job resumes the run from its
                          last checkpoint;
  --kill-on-bad-exit=1    when one task fails the step's other tasks are killed at once (their
                          collectives would wait for the dead peer), so the job ends.
Output goes to launch/slurm-<job id>.out in the run directory, appended across restarts.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess

from absl import flags

from launcher.errors import UserError
from launcher.launch.job import Backend, Job, header
from launcher.preemption import EXIT_PREEMPTED

_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


def time_seconds(value: str) -> int:
  """Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; UserError otherwise."""
  m = _TIME.match(value.strip())
  if not m:
    raise UserError(f"--time={value}: expected a Slurm time limit: minutes, HH:MM:SS or "
                    f"D-HH:MM:SS (e.g. 4:00:00)")
  days = int(m["days"] or 0)
  parts = [int(x) for x in (m["a"], m["b"], m["c"]) if x is not None]
  if m["days"] is not None:  # D-H, D-H:M, D-H:M:S
    h, mi, s = (parts + [0, 0])[:3]
  elif len(parts) == 1:  # M
    h, mi, s = 0, parts[0], 0
  elif len(parts) == 2:  # M:S
    h, mi, s = 0, parts[0], parts[1]
  else:
    h, mi, s = parts
  total = ((days * 24 + h) * 60 + mi) * 60 + s
  if total < 1:
    raise UserError(f"--time={value}: must be at least a minute")
  return total


def _define(fv: flags.FlagValues) -> None:
  flags.DEFINE_integer("nodes", None, "Slurm nodes (default: the mesh entry's hosts; 1 for a "
                       "generic entry).", flag_values=fv)
  flags.DEFINE_string("time", None, "Slurm time limit (--time: minutes, HH:MM:SS, "
                      "D-HH:MM:SS).", flag_values=fv)
  flags.DEFINE_string("partition", None, "Slurm partition.", flag_values=fv)
  flags.DEFINE_string("account", None, "Slurm account.", flag_values=fv)
  flags.DEFINE_multi_string("sbatch", [], "An extra #SBATCH option, e.g. --sbatch=--qos=high "
                            "(repeat for several).", flag_values=fv)
  flags.DEFINE_integer("signal_before_s", 300, "With --time: SIGTERM to every task this many "
                       "seconds before the time limit, so it checkpoints and is requeued; 0: "
                       "none.", flag_values=fv)


FLAG_NAMES = ("nodes", "time", "partition", "account", "sbatch", "signal_before_s")


def _check(job: Job, fv: flags.FlagValues) -> None:
  if job.layout.platform == "tpu":
    raise UserError(f"--mesh={job.layout.mesh} is a Cloud TPU slice; launch it with "
                    f"--backend=tpu-vm or --backend=k8s")
  for name in ("partition", "account"):
    value = fv[name].value
    if value is not None and not re.fullmatch(r"[A-Za-z0-9_.,:+-]+", value):
      raise UserError(f"--{name}={value}: not a Slurm {name} name")
  for line in fv.sbatch:
    if not line.startswith("-") or "\n" in line:
      raise UserError(f"--sbatch={line}: give one sbatch option, e.g. --sbatch=--qos=high")
  if fv.signal_before_s < 0:
    raise UserError(f"--signal_before_s={fv.signal_before_s}: must be >= 0")
  if fv.time is not None:
    limit = time_seconds(fv.time)
    if fv.signal_before_s >= limit:
      raise UserError(f"--signal_before_s={fv.signal_before_s} is not shorter than "
                      f"--time={fv.time} ({limit} s)")


def _render(job: Job, fv: flags.FlagValues) -> dict[str, str]:
  layout = job.layout
  options = [f"--job-name={job.name}", f"--nodes={layout.num_hosts}",
             f"--ntasks-per-node={layout.processes_per_host}"]
  if layout.platform == "gpu" and layout.fixed:
    options.append(f"--gpus-per-node={layout.devices_per_process * layout.processes_per_host}")
  if fv.time is not None:
    options.append(f"--time={fv.time}")
    if fv.signal_before_s:
      options.append(f"--signal=TERM@{fv.signal_before_s}")
  options += [f"--{name}={fv[name].value}" for name in ("partition", "account")
              if fv[name].value is not None]
  log = (job.launch_dir / "slurm-%j.out").absolute()
  options += ["--requeue", "--open-mode=append", f"--output={log}", *fv.sbatch]
  exports = []
  if layout.platform == "gpu" and layout.processes_per_host == 1 and layout.fixed:
    exports.append(f"export JAX_LOCAL_DEVICE_IDS={','.join(map(str, layout.devices_of(0)))}")
  elif layout.platform == "cpu" and layout.devices_per_process is not None:
    exports.append(f"export XLA_FLAGS=\"--xla_force_host_platform_device_count="
                   f"{layout.devices_per_process} ${{XLA_FLAGS:-}}\"")
  restarts = fv.max_restarts
  text = "\n".join([
      "#!/bin/bash",
      header(job, "A Slurm batch script of `axtrain launch --backend=slurm`; docs/launch.md."
             ).rstrip("\n"),
      *(f"#SBATCH {option}" for option in options),
      "",
      f"cd {shlex.quote(str(job.workdir))}" if job.workdir else "",
      *exports,
      'echo "axtrain launch: Slurm job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}, '
      'nodes $SLURM_JOB_NODELIST"',
      "# Every task is one jax process; JAX reads the coordinator and its index from Slurm.",
      f"srun --kill-on-bad-exit=1 {job.shell()}",
      "code=$?",
      f"# {EXIT_PREEMPTED}: preempted with a checkpoint saved (SIGTERM, e.g. --signal or "
      f"`scancel --signal=TERM`):",
      "# requeue this job; it resumes the run from the checkpoint.",
      f'if [ "$code" -eq {EXIT_PREEMPTED} ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {restarts} ]; '
      "then",
      '  echo "axtrain launch: preempted (exit 75); requeueing job $SLURM_JOB_ID"',
      '  scontrol requeue "$SLURM_JOB_ID"',
      "fi",
      'exit "$code"',
      ""])
  return {"slurm.sbatch": text.replace("\n\n\n", "\n\n")}


def validate(texts: dict[str, str]) -> str | None:
  """`sbatch --test-only` of the script's text: None if Slurm would take it, else its reason."""
  done = subprocess.run(["sbatch", "--test-only"], input=texts["slurm.sbatch"],
                        capture_output=True, text=True, timeout=60, check=False)
  if done.returncode == 0:
    return None
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  return lines[-1].replace("sbatch: error: ", "") if lines else f"exit {done.returncode}"


def _start(job: Job, fv: flags.FlagValues, files: dict[str, pathlib.Path]) -> int:
  del fv
  script = files["slurm.sbatch"]
  done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                        timeout=120, check=False)
  if done.returncode != 0:
    reason = " ".join(done.stderr.split()) or f"exit {done.returncode}"
    raise UserError(f"sbatch refused {script}: {reason}")
  job_id = done.stdout.strip().split(";")[0]
  print(f"axtrain launch: submitted Slurm job {job_id}; follow it with `squeue -j {job_id}`, "
        f"its output in {job.launch_dir / f'slurm-{job_id}.out'}", flush=True)
  return 0


def _hint(job: Job, files: dict[str, pathlib.Path]) -> str:
  del job
  return f"submit it with: sbatch {shlex.quote(str(files['slurm.sbatch']))}  (or add --submit)"


BACKEND = Backend(name="slurm", summary="an sbatch script running `srun axtrain ...` (requeued "
                  "on exit 75)", tool="sbatch", flag_names=FLAG_NAMES, define=_define,
                  check=_check, render=_render, start=_start, submit_hint=_hint,
                  sized_by_flags=True, preflight=validate)
