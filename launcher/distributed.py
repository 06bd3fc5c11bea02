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
  env = os.environ
  if coordinator_address or env.get("JAX_COORDINATOR_ADDRESS"):
    address = coordinator_address or env["JAX_COORDINATOR_ADDRESS"]
    try:
      n = num_processes if num_processes is not None else int(env["JAX_NUM_PROCESSES"])
      pid = process_id if process_id is not None else int(env["JAX_PROCESS_ID"])
    except (KeyError, ValueError):
      raise UserError("a coordinator address needs --num_processes and --process_id (or "
                      "JAX_NUM_PROCESSES and JAX_PROCESS_ID)") from None
    if n > 1:
      if env.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
      jax.distributed.initialize(address, num_processes=n, process_id=pid)
      return True
    return False
  if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_STEP_ID" in env:
    jax.distributed.initialize()  # reads the Slurm environment
    return True
  return False
