"""`axtrain launch --backend=local`: N axtrain processes on this machine, one jax.distributed run.

Process 0 serves the coordinator on 127.0.0.1 at a free port; each process gets its slice of the
machine's devices (CPU: `--devices_per_process` fake devices through XLA_FLAGS, as the tests
use; GPU: JAX_LOCAL_DEVICE_IDS). Their output lines come prefixed `[p0]`, `[p1]`; gloo's line
that a CPU process connected to all its peers is left out (one connected to fewer is kept, on
stderr).

When a process exits non-zero (other than 75, a preemption that every process takes together),
the others get SIGTERM and, FAILURE_GRACE_S later, SIGKILL: a peer that died leaves collectives
that never finish. launch exits with the first non-zero code (128+N for signal N). SIGINT or
SIGTERM to launch is passed on to every process as SIGTERM (they checkpoint and exit 75); a
second one kills them. Re-running the same launch resumes from the last checkpoint.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from launcher import distributed
from launcher.errors import UserError
from launcher.launch.job import Backend, Job, header
from launcher.preemption import EXIT_PREEMPTED

FAILURE_GRACE_S = 5.0  # after one process fails, the others' time to exit before SIGKILL
_POLL_S = 0.1
_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=\S+")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def this_machine_platform() -> str:
  """cpu or gpu (tpu refused by the layout): what JAX would pick here."""
  chosen = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
  if chosen:
    return "gpu" if chosen in ("cuda", "rocm", "gpu") else chosen
  from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
  if hardware_utils.num_available_tpu_chips_and_device_id()[0]:
    return "tpu"
  if hardware_utils.has_visible_nvidia_gpu() or os.path.exists("/dev/kfd"):
    return "gpu"
  return "cpu"


def process_env(job: Job, index: int, base: dict) -> dict:
  """The environment of process `index`: its devices, nothing else changed."""
  env = dict(base)
  layout = job.layout
  devices = layout.devices_of(index % layout.processes_per_host)
  if devices is None:
    return env
  if layout.platform == "cpu":
    kept = _DEVICE_COUNT.sub("", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join(
        [f"--xla_force_host_platform_device_count={len(devices)}", *kept])
  else:
    env["JAX_LOCAL_DEVICE_IDS"] = ",".join(map(str, devices))
  return env


def commands(job: Job, port: int) -> list[list[str]]:
  n = job.layout.num_processes
  return [job.argv(f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={n}",
                   f"--process_id={i}") for i in range(n)]


def _env_prefix(job: Job, index: int) -> str:
  """`NAME=value ` for each variable process `index` gets besides this environment."""
  return "".join(f"{k}={shlex.quote(v)} " for k, v in process_env(job, index, {}).items())


def _define(fv: flags.FlagValues) -> None:
  del fv  # local has no flags of its own: --num_processes and --devices_per_process are shared


def _check(job: Job, fv: flags.FlagValues) -> None:
  del fv
  layout = job.layout
  if layout.num_hosts != 1:
    raise UserError(f"--backend=local starts processes on this machine only; "
                    f"--mesh={layout.mesh} spans {layout.num_hosts} hosts: use "
                    f"--backend=slurm or --backend=k8s")
  here = this_machine_platform()
  if layout.platform != here:  # what a run's trainer/meshes.py:check_present refuses, found
    # without starting JAX's backend here (it would hold the GPUs that the processes need)
    raise UserError(f"--mesh={layout.mesh} is a {layout.platform} mesh but this machine runs "
                    f"{here}; launch here with --mesh={here} (or --mesh=auto), or plan for "
                    f"that hardware with `axtrain plan --mesh={layout.mesh}`")


def _render(job: Job, fv: flags.FlagValues) -> dict[str, str]:
  del fv
  lines = [f"{_env_prefix(job, i)}{shlex.join(cmd)} &"
           for i, cmd in enumerate(commands(job, job.coordinator_port))]
  text = ("#!/bin/bash\n" + header(job, "The processes of `axtrain launch --backend=local`; that "
                                   "command runs them with [pN] log prefixes and stops the "
                                   "others when one fails, which this plain script does not.")
          + (f"cd {shlex.quote(job.workdir)}\n" if job.workdir else "")
          + "\n".join(lines) + "\nwait\n")
  return {"local.sh": text}


def _hint(job: Job, files: dict[str, pathlib.Path]) -> str:
  del files
  return f"run it with: {job.command.replace(' --dry_run', '')}"


def _start(job: Job, fv: flags.FlagValues, files: dict[str, pathlib.Path]) -> int:
  del fv, files
  return Supervisor(job, commands(job, job.coordinator_port)).run()


# absl's fatal report: this line, then one "    @ 0x..." line per frame.
_STACK_TRACE = "*** Check failure stack trace: ***"
_FRAME = re.compile(r"^\s+@\s+0x[0-9a-f]+")
# What the gloo inside jaxlib (0.10.2) prints to stdout, unconditionally, as each CPU process
# connects to its peers (gloo has since made it an INFO log, off by default). All peers
# connected says nothing: left out; fewer is kept, on stderr, with gloo's "is NOT connected".
_GLOO_CONNECTED = re.compile(r"^\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. Expected "
                             r"number of connected peer ranks is : (\d+)$")


class Supervisor:
  """Runs the processes, prefixes their output, stops them all when one fails."""

  def __init__(self, job: Job, argvs: list[list[str]], *, out=None, err=None,
               grace_s: float = FAILURE_GRACE_S):
    self.job, self.argvs, self.grace_s = job, argvs, grace_s
    self.out, self.err = out or sys.stdout, err or sys.stderr
    self._lock = threading.Lock()
    self._signals = 0

  def say(self, text: str) -> None:
    with self._lock:
      self.err.write(f"axtrain launch: {text}\n")
      self.err.flush()

  def _pump(self, stream, prefix: str, sink) -> None:
    frames = None  # frames of a C++ abort's stack trace left out, once one has begun
    for raw in iter(stream.readline, b""):
      line = raw.decode(errors="replace").rstrip("\r\n")
      if frames is not None and _FRAME.match(line):
        frames += 1
        continue
      if frames is not None:
        self._frames_left_out(prefix, sink, frames)
        frames = None
      if line.strip() == _STACK_TRACE:
        frames = 0
        continue
      gloo = _GLOO_CONNECTED.match(line)
      if gloo and gloo[1] == gloo[2]:
        continue
      with self._lock:
        out = self.err if gloo or line.startswith("[Gloo] Rank ") else sink
        out.write(f"{prefix}{line}\n")
        out.flush()
    if frames is not None:
      self._frames_left_out(prefix, sink, frames)
    stream.close()

  def _frames_left_out(self, prefix: str, sink, frames: int) -> None:
    """A process's C++ abort (absl's fatal report: jaxlib's when process 0, which hosts JAX's
    coordination service, is gone) in one line: the reason is the F line before it."""
    with self._lock:
      sink.write(f"{prefix}(a C++ stack trace of {frames} frames left out: the process aborted "
                 f"for the reason on the line above; docs/fault_tolerance.md)\n")
      sink.flush()

  def _runtime_said(self, index: int, code: int) -> str:
    """Where process `index`, ended with `code` by itself (not SIGKILLed), kept what the JAX
    runtime logged once it trained (its C++ report of a lost coordination service, say), if it
    wrote anything there."""
    if code == -signal.SIGKILL:
      return ""
    path = distributed.runtime_log(pathlib.Path(self.job.workdir or ".") / self.job.run_dir, index)
    try:
      return f" (what the JAX runtime logged there: {path})" if path.stat().st_size else ""
    except OSError:
      return ""

  def _on_signal(self, signum, frame) -> None:
    del signum, frame
    self._signals += 1

  def run(self) -> int:
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      for i, argv in enumerate(self.argvs):
        # Their own session: a Ctrl-C in this terminal reaches launch, which passes it on.
        proc = subprocess.Popen(argv, env=process_env(self.job, i, os.environ),
                                cwd=self.job.workdir, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        procs.append(proc)
        for stream, sink in ((proc.stdout, self.out), (proc.stderr, self.err)):
          pump = threading.Thread(target=self._pump, args=(stream, f"[p{i}] ", sink), daemon=True)
          pump.start()
          pumps.append(pump)
      self.say(f"started {len(procs)} processes (pids {', '.join(str(p.pid) for p in procs)})")
      code = self._supervise(procs)
    finally:
      for proc in procs:
        if proc.poll() is None:
          proc.kill()
          proc.wait()
      for s, handler in previous.items():
        signal.signal(s, handler)
    for pump in pumps:
      pump.join(timeout=5)
    return code

  def _supervise(self, procs: list[subprocess.Popen]) -> int:
    first: tuple[int, int] | None = None  # (process, exit code) of the first non-zero exit
    kill_at: float | None = None
    forwarded = 0
    while True:
      if self._signals > forwarded:
        forwarded = self._signals
        sig = signal.SIGTERM if forwarded == 1 else signal.SIGKILL
        self.say(f"{'SIGTERM' if forwarded == 1 else 'SIGKILL'} to every process"
                 + (" (they checkpoint and exit 75; again to kill them)" if forwarded == 1
                    else ""))
        _send(procs, sig)
      codes = [p.poll() for p in procs]
      for i, code in enumerate(codes):
        if code not in (None, 0) and first is None:
          first = (i, _exit_code(code))
          if first[1] != EXIT_PREEMPTED and forwarded == 0:
            alive = [j for j, c in enumerate(codes) if c is None]
            self.say(f"p{i} exited with {_describe(code)}{self._runtime_said(i, code)}"
                     + (f"; stopping {', '.join(f'p{j}' for j in alive)} (SIGTERM, SIGKILL "
                        f"after {self.grace_s:.0f} s)" if alive else ""))
            _send(procs, signal.SIGTERM)
            kill_at = time.monotonic() + self.grace_s
      if all(c is not None for c in codes):
        break
      if kill_at is not None and time.monotonic() > kill_at:
        _send(procs, signal.SIGKILL)
        kill_at = None
      time.sleep(_POLL_S)
    if first is None:
      return 0
    if first[1] == EXIT_PREEMPTED:
      self.say("preempted (exit 75): re-run the same command to resume from the checkpoint")
    return first[1]


def _send(procs: list[subprocess.Popen], sig: int) -> None:
  for proc in procs:
    if proc.poll() is None:
      try:
        proc.send_signal(sig)
      except ProcessLookupError:
        pass


def _exit_code(code: int) -> int:
  return 128 - code if code < 0 else code


def _describe(code: int) -> str:
  if code < 0:
    try:
      return f"{128 - code} ({signal.Signals(-code).name})"
    except ValueError:
      return str(128 - code)
  return str(code)


BACKEND = Backend(name="local", summary="N processes on this machine (coordinator on 127.0.0.1)",
                  tool=None, flag_names=(), define=_define, check=_check, render=_render,
                  start=_start, submit_hint=_hint, runs_by_default=True, sized_by_flags=True,
                  port=lambda fv: free_port())
