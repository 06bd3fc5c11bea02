"""Multi-process start-up through JAX's own runtime (jax.distributed), never our own cluster layer.

Explicit flags win; otherwise a Slurm job step with several tasks, or the
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables (set by a
Kubernetes JobSet or by hand), start it. One process per host.
"""

from __future__ import annotations

import os

import jax

from launcher.errors import UserError


def maybe_initialize(coordinator_address: str | None, num_processes: int | None,
                     process_id: int | None) -> bool:
  """Starts jax.distributed when a coordinator or a Slurm job step says so; True if it did.

  --num_processes / --process_id without a coordinator address or a detected
  Slurm step are refused: silently training as one process would be wrong.
  """
  env = os.environ
  _check_counts(num_processes, process_id)
  address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
  slurm = int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_STEP_ID" in env
  if address:
    try:
      n = num_processes if num_processes is not None else int(env["JAX_NUM_PROCESSES"])
      pid = process_id if process_id is not None else int(env["JAX_PROCESS_ID"])
    except (KeyError, ValueError):
      raise UserError("a coordinator address needs --num_processes and --process_id (or "
                      "JAX_NUM_PROCESSES and JAX_PROCESS_ID)") from None
    _check_counts(n, pid)
    if n > 1:
      if env.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
      jax.distributed.initialize(address, num_processes=n, process_id=pid)
      return True
    return False
  if slurm:
    # Reads the Slurm environment; explicit counts must agree with it (jax checks).
    jax.distributed.initialize(num_processes=num_processes, process_id=process_id)
    return True
  if num_processes is not None or process_id is not None:
    given = " and ".join(f"--{name}" for name, value in (("num_processes", num_processes),
                                                          ("process_id", process_id))
                         if value is not None)
    verb = "need" if " and " in given else "needs"
    raise UserError(f"{given} {verb} --coordinator_address=HOST:PORT (or JAX_COORDINATOR_ADDRESS),"
                    f" or a Slurm job step (srun) to join; without one this would train as a "
                    f"single process")
  return False


def _check_counts(num_processes: int | None, process_id: int | None) -> None:
  if num_processes is not None and num_processes < 1:
    raise UserError(f"--num_processes={num_processes}: must be at least 1")
  if process_id is not None and process_id < 0:
    raise UserError(f"--process_id={process_id}: must be >= 0")
  if num_processes is not None and process_id is not None and process_id >= num_processes:
    raise UserError(f"--process_id={process_id}: must be below --num_processes={num_processes} "
                    f"(0 to {num_processes - 1})")
