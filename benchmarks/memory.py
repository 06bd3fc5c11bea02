"""Per-device memory of bench_lm's train step under fsdp = 1, 2, 4, 8 fake CPU devices.

    python -m benchmarks.memory     # prints one JSON line per fsdp size

XLA's compiled memory analysis (arguments, outputs, temporaries per device) and
the bytes of the train state each device holds. Run in a subprocess by
benchmarks.run, because the fake device count is fixed when jax starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SIZES = (1, 2, 4, 8)


def _measure(fsdp: int) -> dict:
  import flax.linen as nn
  import jax
  import numpy as np

  from configs import bench_lm
  from trainer import config as config_lib, experiment, meshes

  from planner import plan

  cfg = bench_lm.get_config()
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model = 1, fsdp, 1
  exp = experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"), devices=jax.devices()[:fsdp])
  state = nn.meta.unbox(exp.abstract_state)
  _, batch = plan.abstract_inputs(exp, exp.source.batch_size)  # the arrays its data yields
  with exp.context():
    compiled = exp.step_fn.lower(state, batch).compile()
  mem = compiled.memory_analysis()
  state_bytes = sum(
      int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
      for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(exp.state_shardings)))
  return {"fsdp": fsdp, "state_bytes": state_bytes,
          "argument_bytes": mem.argument_size_in_bytes, "output_bytes": mem.output_size_in_bytes,
          "alias_bytes": mem.alias_size_in_bytes, "temp_bytes": mem.temp_size_in_bytes}


def measure_all(timeout: float = 600) -> list[dict]:
  """Runs this module in a subprocess with 8 fake devices; one dict per fsdp size."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "benchmarks.memory"], env=env, capture_output=True,
                       text=True, timeout=timeout, check=False)
  if out.returncode:
    raise RuntimeError(f"benchmarks.memory failed:\n{out.stderr[-2000:]}")
  return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


if __name__ == "__main__":
  for n in SIZES:
    print(json.dumps(_measure(n)), flush=True)
