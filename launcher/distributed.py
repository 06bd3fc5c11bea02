"""Multi-process start-up through JAX's own runtime (jax.distributed), never our own cluster layer.

Who joins, and where (`plan_join`):
  --coordinator_address=HOST:PORT with --num_processes and --process_id, or the same from
      JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID (`axtrain launch` local and
      k8s set them);
  a Slurm job step with several tasks (srun): JAX reads the Slurm variables itself, the
      coordinator on the step's first node;
  --distributed=tpu: a multi-host Cloud TPU slice (TPU VM or GKE); JAX reads the TPU
      environment itself (`axtrain launch --backend=tpu-vm` passes it).

Joining waits up to --distributed_timeout seconds for every process; past that one line names
the coordinator address and what to check, and the process exits (2 when the address is the
user's mistake, a host that does not resolve; else 1). A malformed address or a port already
in use on process 0's host is refused at once (exit 2).

In a multi-process run a stop (preemption) must happen after the same step on every process,
or the processes' collectives no longer match. JAX's preemption service agrees on that step:
SIGTERM reaches its notifier in every process that gets one, the processes exchange their step
counters through the coordinator, and `AgreedStop.requested` turns true on all of them at the
same step (the fastest process's next one).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import socket
import sys
import threading
from typing import Callable, Literal

from launcher.errors import EXIT_USAGE, UserError
from trainer.callbacks import Callback

Mode = Literal["auto", "tpu"]
MODES: tuple[str, ...] = ("auto", "tpu")
DEFAULT_TIMEOUT_S = 300  # jax.distributed.initialize's own default
EXIT_FAILED = 1
# jax gets this much longer than our own bound, so that our one-line message comes first.
_JAX_MARGIN_S = 30
_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
                      r":(?P<port>[0-9]{1,5})$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Join:
  """How this process joins jax.distributed; None fields are left to JAX's cluster detection."""
  source: str  # "flags", "JAX_* variables", "Slurm job step", "Cloud TPU"
  address: str | None  # HOST:PORT of process 0's coordinator
  num_processes: int | None
  process_id: int | None


def split_address(address: str, *, flag: str = "--coordinator_address") -> tuple[str, int]:
  """(host, port) of HOST:PORT, or UserError saying what the form is."""
  m = _ADDRESS.match(address.strip())
  port = int(m["port"]) if m else 0
  if not m or not 1 <= port <= 65535:
    raise UserError(f"{flag}={address}: expected HOST:PORT with a port from 1 to 65535, e.g. "
                    f"10.0.0.1:8476 (process 0's host and a port free there)")
  return m["host"].strip("[]"), port


def plan_join(coordinator_address: str | None, num_processes: int | None,
              process_id: int | None, *, mode: Mode = "auto",
              env: dict | None = None) -> Join | None:
  """Who this process joins (None: it trains alone). Reads flags and `env`; starts nothing.

  --num_processes / --process_id without a coordinator address or a detected
  Slurm step are refused: silently training as one process would be wrong.
  """
  env = os.environ if env is None else env
  if mode not in MODES:
    raise UserError(f"--distributed={mode}: expected one of {', '.join(MODES)}")
  _check_counts(num_processes, process_id)
  if mode == "tpu":
    given = [name for name, value in (("coordinator_address", coordinator_address),
                                      ("num_processes", num_processes),
                                      ("process_id", process_id)) if value is not None]
    if given:
      raise UserError(f"--distributed=tpu reads the TPU environment; drop --{given[0]}")
    return Join(source="Cloud TPU", address=None, num_processes=None, process_id=None)
  address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
  if address:
    flag = "--coordinator_address" if coordinator_address else "JAX_COORDINATOR_ADDRESS"
    split_address(address, flag=flag)
    try:
      n = num_processes if num_processes is not None else int(env["JAX_NUM_PROCESSES"])
      pid = process_id if process_id is not None else int(env["JAX_PROCESS_ID"])
    except (KeyError, ValueError):
      raise UserError("a coordinator address needs --num_processes and --process_id (or "
                      "JAX_NUM_PROCESSES and JAX_PROCESS_ID)") from None
    _check_counts(n, pid)
    if n == 1:
      return None
    return Join(source="flags" if coordinator_address else "JAX_* variables", address=address,
                num_processes=n, process_id=pid)
  if _slurm_tasks(env) > 1 and "SLURM_STEP_ID" in env:
    # Explicit counts must agree with the Slurm step's (jax checks).
    return Join(source="Slurm job step", address=None, num_processes=num_processes,
                process_id=process_id)
  if num_processes is not None or process_id is not None:
    given = " and ".join(f"--{name}" for name, value in (("num_processes", num_processes),
                                                          ("process_id", process_id))
                         if value is not None)
    verb = "need" if " and " in given else "needs"
    raise UserError(f"{given} {verb} --coordinator_address=HOST:PORT (or JAX_COORDINATOR_ADDRESS),"
                    f" or a Slurm job step (srun) to join; without one this would train as a "
                    f"single process")
  return None


def maybe_initialize(coordinator_address: str | None, num_processes: int | None,
                     process_id: int | None, *, mode: Mode = "auto",
                     timeout_s: int = DEFAULT_TIMEOUT_S,
                     say: Callable[[str], None] = lambda text: print(text, file=sys.stderr,
                                                                     flush=True)) -> bool:
  """Starts jax.distributed when flags, JAX_* variables, a Slurm step or --distributed=tpu say
  so; True if it did. Ends the process with one line if the processes do not all join within
  `timeout_s` seconds."""
  if timeout_s < 1:
    raise UserError(f"--distributed_timeout={timeout_s}: must be at least 1 second")
  join = plan_join(coordinator_address, num_processes, process_id, mode=mode)
  if join is None:
    return False
  if join.address is not None and join.process_id == 0:
    _check_port_free(join.address)
  import jax  # pylint: disable=import-outside-toplevel
  # CPU computations across processes need a collectives implementation (other platforms
  # bring their own); this setting only concerns the CPU backend.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  where = join.address or ("the first node of the step" if join.source == "Slurm job step"
                           else "worker 0")
  say(f"axtrain: joining jax.distributed ({join.source}) at {where}"
      + (f" as process {join.process_id} of {join.num_processes}"
         if join.process_id is not None and join.num_processes is not None else "")
      + f"; waiting up to {timeout_s} s for every process")
  done = threading.Event()

  def give_up() -> None:
    if not done.wait(timeout_s):
      message, code = _diagnose(join, timeout_s)
      print(f"axtrain: error: {message}", file=sys.stderr, flush=True)
      os._exit(code)  # pylint: disable=protected-access  (the main thread waits inside jax)

  threading.Thread(target=give_up, name="axtrain-distributed-timeout", daemon=True).start()
  if join.address is not None:
    # Everything is given: JAX's cluster detection must not add to it (inside a Slurm
    # allocation it would narrow each process to the GPU of its SLURM_LOCALID; in a Kubernetes
    # pod it would look for the `kubernetes` package). JAX_LOCAL_DEVICE_IDS still applies.
    kwargs = dict(coordinator_address=join.address, num_processes=join.num_processes,
                  process_id=join.process_id, cluster_detection_method="deactivate")
  else:
    kwargs = dict(num_processes=join.num_processes, process_id=join.process_id)
  try:
    jax.distributed.initialize(initialization_timeout=timeout_s + _JAX_MARGIN_S, **kwargs)
  finally:
    done.set()
  return True


def _diagnose(join: Join, timeout_s: int) -> tuple[str, int]:
  """The one line (and exit code) for processes that did not all join within `timeout_s`."""
  late = f"within {timeout_s} s (--distributed_timeout)"
  if join.address is None:
    if join.source == "Slurm job step":
      env = os.environ
      return (f"jax.distributed: the {env.get('SLURM_NTASKS')} tasks of Slurm job "
              f"{env.get('SLURM_JOB_ID')} did not all join the coordinator on "
              f"{env.get('SLURM_STEP_NODELIST', 'the first node')} {late}; check the other "
              f"tasks' output and that the nodes reach each other", EXIT_FAILED)
    return (f"jax.distributed: the Cloud TPU workers did not all join worker 0 {late}; check "
            f"that axtrain runs on every worker (gcloud ... ssh --worker=all)", EXIT_FAILED)
  host, port = split_address(join.address)
  n = join.num_processes
  if join.process_id == 0:
    return (f"jax.distributed: not all {n} processes joined the coordinator at {join.address} "
            f"{late}; check that the other {n - 1} process{'es' if n > 2 else ''} started with "
            f"--coordinator_address={join.address} --num_processes={n} and their own "
            f"--process_id, and that port {port} here is reachable from their hosts",
            EXIT_FAILED)
  try:
    socket.getaddrinfo(host, port)
  except (socket.gaierror, UnicodeError):
    return (f"jax.distributed: the coordinator host '{host}' (--coordinator_address="
            f"{join.address}) does not resolve from this host; give process 0's host name "
            f"or IP address", EXIT_USAGE)
  try:
    with socket.create_connection((host, port), timeout=5):
      pass
  except OSError:
    return (f"jax.distributed: nothing answered at {join.address} {late}; check that process 0 "
            f"runs on {host} with the same --coordinator_address and that port {port} is open "
            f"to this host", EXIT_FAILED)
  return (f"jax.distributed: the coordinator at {join.address} answers but not all {n} "
          f"processes joined {late}; check that each of the {n} started with "
          f"--num_processes={n} and its own --process_id", EXIT_FAILED)


def _check_port_free(address: str) -> None:
  """Process 0 serves the coordinator on every interface at the address's port."""
  _, port = split_address(address)
  for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
    try:
      sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
      continue  # no IPv6 on this host
    try:
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      sock.bind((host, port))
      return
    except OSError as e:
      if e.errno == 98:  # EADDRINUSE
        raise UserError(f"--coordinator_address={address}: port {port} is already in use on "
                        f"this host (process 0 serves the coordinator there); choose another "
                        f"port") from None
    finally:
      sock.close()


def _slurm_tasks(env) -> int:
  try:
    return int(env.get("SLURM_NTASKS", "1") or 1)
  except ValueError:
    return 1


def _check_counts(num_processes: int | None, process_id: int | None) -> None:
  if num_processes is not None and num_processes < 1:
    raise UserError(f"--num_processes={num_processes}: must be at least 1")
  if process_id is not None and process_id < 0:
    raise UserError(f"--process_id={process_id}: must be >= 0")
  if num_processes is not None and process_id is not None and process_id >= num_processes:
    raise UserError(f"--process_id={process_id}: must be below --num_processes={num_processes} "
                    f"(0 to {num_processes - 1})")


# Where each process of a multi-process run keeps what the JAX runtime logs: runtime/p<N>.log.
RUNTIME_LOG_DIR = "runtime"
_LEAVE_TIMEOUT_S = 30


def runtime_log(run_dir: pathlib.Path, process_index: int) -> pathlib.Path:
  return pathlib.Path(run_dir) / RUNTIME_LOG_DIR / f"p{process_index}.log"


def runtime_output_to(path: pathlib.Path) -> None:
  """From now until this process ends, what the JAX runtime writes to stderr goes to `path`
  (appended), not the console: its C++ logging, written straight to file descriptor 2 (the
  preemption notifier's `SIGTERM caught`, the coordination service's reports as a process
  leaves, gRPC's), and Python's logging records (absl's `Reached preemption sync point`, from
  Orbax). sys.stderr, where axtrain's own lines go, stays the console: it becomes a stream on a
  copy of the console's descriptor."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  sys.stderr.flush()
  runtime = sys.stderr  # on descriptor 2: the logging handlers made so far write through it
  console = os.fdopen(os.dup(2), "w", buffering=1, encoding=runtime.encoding,
                      errors="backslashreplace")
  os.dup2(fd, 2)
  os.close(fd)
  sys.stderr = console
  if not logging.getLogger().handlers:  # the handler absl's first record would make, on the
    logging.basicConfig(stream=runtime)  # stream sys.stderr is then: the console


def leave_together(code: int) -> None:
  """Disconnects this process from jax.distributed in JAX's order before it exits with `code`
  without the interpreter's teardown (a preemption, launcher/main.py): every process's client
  leaves at the shutdown barrier, then process 0's coordination service stops. Exiting at once
  instead, process 0 took the service with it while the others were still connected, and
  their agent reported the lost service and aborted (`E ... Polled an error from coordination
  service`, `F ... client.h:80] Terminating process`, gRPC's `Socket closed`). A process that
  cannot leave within _LEAVE_TIMEOUT_S (a peer gone) exits anyway."""
  if "jax" not in sys.modules:  # a command that never started JAX
    return
  import jax  # pylint: disable=import-outside-toplevel
  if not jax.distributed.is_initialized():
    return
  done = threading.Event()

  def give_up() -> None:
    if not done.wait(_LEAVE_TIMEOUT_S):
      os._exit(code)  # pylint: disable=protected-access

  threading.Thread(target=give_up, name="axtrain-leave", daemon=True).start()
  try:
    jax.distributed.shutdown()
  except Exception:  # pylint: disable=broad-except  (leaving anyway: said in the runtime's log)
    pass
  done.set()


class PeerLost(Exception):
  """Another process of the run ended (the JAX runtime failed a collective with it); the
  failure is recorded and said in one line. Handled by `exit_alone`."""


def exit_alone(code: int) -> None:
  """Ends this process now with `code`, skipping jax.distributed's exit handler.

  That handler (jax.distributed.shutdown, registered with atexit) waits at a barrier for every
  process, the dead one too, until JAX's heartbeat timeout (100 s), then jaxlib aborts with a
  C++ "Check failure stack trace" (SIGABRT). There is nothing left to shut down in order once a
  peer is gone; the run's files are written (run.json, the checkpoints committed)."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


class AgreedStop(Callback):
  """The loop's stop request in a multi-process run: true on every process after the same step.

  JAX's preemption service (jax.distributed) hears SIGTERM in any process and agrees on the
  step to stop after (multihost_utils.reached_preemption_sync_point, asked once per step).
  Register it as a loop callback (it learns the step in on_step_end, which the loop calls just
  before it asks) and pass `requested` as the loop's stop_requested.
  """

  def __init__(self, say: Callable[[str], None] = lambda text: None):
    self._step: int | None = None
    self._say = say

  def on_step_end(self, step: int, loop) -> None:
    self._step = step

  def requested(self) -> bool:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    if self._step is None:
      return False
    reached = multihost_utils.reached_preemption_sync_point(self._step)
    if reached:
      self._say(f"axtrain: preemption notice: every process stops after step {self._step}")
    return reached
