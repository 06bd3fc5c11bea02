"""Derived metrics of a logged step: model FLOPs per device, MFU, device memory.

    model_flops_per_sec_per_device = flops/token (trainer/flops.py) * tokens/s / devices
    mfu                            = model_flops_per_sec_per_device / peak FLOP/s of a device

The peak is `trainer.peak_flops` when set, else the mesh entry's peak bf16 FLOP/s
(trainer/meshes.py), else, on CPU, a float32 matmul benchmark measured once per
machine and cached in ~/.cache/axtrain/peak_flops.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import platform
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "axtrain"


def measure_peak_flops(n: int = 1024, repeats: int = 5) -> float:
  """Best FLOP/s of an n x n float32 matmul on the default device."""
  a = jnp.ones((n, n), jnp.float32)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    matmul(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best


def cpu_peak_flops(cache: pathlib.Path = CACHE) -> float:
  """measure_peak_flops() once per machine, then read from `cache`/peak_flops.json."""
  key = f"{platform.node()}|{platform.machine()}|{os.cpu_count()}|{jax.devices()[0].device_kind}"
  path = cache / "peak_flops.json"
  try:
    known = json.loads(path.read_text())
  except (OSError, ValueError):
    known = {}
  if key not in known:
    known[key] = measure_peak_flops()
    try:
      cache.mkdir(parents=True, exist_ok=True)
      tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
      tmp.write_text(json.dumps(known, indent=1) + "\n")
      os.replace(tmp, path)
    except OSError:
      pass  # a read-only home: measure again next time
  return float(known[key])


def peak_flops(configured: float, hardware_peak: float | None, device_platform: str) -> float | None:
  """The MFU denominator (see the module docstring); None where nothing is known."""
  if configured:
    return configured
  if hardware_peak:
    return hardware_peak
  return cpu_peak_flops() if device_platform == "cpu" else None


def device_peak(stats: dict) -> int | None:
  """A device's peak of memory held, from its allocator's counters: buffers
  (`peak_bytes_in_use`) plus, where the runtime keeps them apart, the scratch space it reserves
  for a running program's temporaries (`peak_bytes_reserved`: XLA:TPU). Without the second a TPU
  step's temporaries are missing: on one v5e chip llm_1b at 8 rows read 6.04 GB of buffers,
  6.04 + 5.97 GB with the scratch, against 12.30 GB that the compiler planned for the step
  (125m at 4 rows: 1.90 + 4.03 = 5.93 GB against 5.72; benchmarks/chip.py, 2026-12-05).
  Process-lifetime peaks: one run per process (the CLI) reads its own."""
  if "peak_bytes_in_use" not in stats:
    return None
  return stats["peak_bytes_in_use"] + stats.get("peak_bytes_reserved", 0)


def device_memory(devices) -> dict:
  """Bytes in use and the peak (device_peak), the largest over `devices`, where the platform
  reports them."""
  stats = [d.memory_stats() for d in devices]
  if not stats or any(s is None or "bytes_in_use" not in s for s in stats):
    return {}
  out = {"memory_bytes_in_use": max(s["bytes_in_use"] for s in stats)}
  peaks = [device_peak(s) for s in stats]
  if all(p is not None for p in peaks):
    out["memory_peak_bytes"] = max(peaks)
  return out


def state_bytes_per_device(abstract_state, shardings) -> int:
  """Bytes of one device's shard of the train state (parameters + optimizer state)."""
  leaves = jax.tree.leaves(nn.meta.unbox(abstract_state))
  return sum(math.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize
             for x, sh in zip(leaves, jax.tree.leaves(shardings)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Throughput:
  flops_per_token: float  # model FLOPs of one training token, forward + backward
  num_devices: int
  peak: float | None  # FLOP/s of one device

  def __call__(self, tokens_per_sec: float) -> dict:
    per_device = self.flops_per_token * tokens_per_sec / self.num_devices
    out = {"model_flops_per_sec_per_device": per_device}
    if self.peak:
      out["mfu"] = per_device / self.peak
    return out


def host_bytes(memory) -> int:
  """Bytes per device a compiled program keeps in host memory (memory kind pinned_host:
  arguments + outputs not aliased to them + temporaries); 0 where XLA reports none."""
  get = lambda f: int(getattr(memory, f"host_{f}_size_in_bytes", 0) or 0)
  return get("argument") + get("output") - get("alias") + get("temp")


def device_bytes(memory) -> int:
  """Bytes per device a compiled program needs in device memory: arguments + outputs not
  aliased to them + temporaries. A program with host-resident state (trainer/offload.py):
  the compiler's peak less its host bytes; its temporaries then count the host transfers'
  buffers over again (llm_1b on v5e: 16.3 GiB of temporaries where its buffer assignment
  lays out 14.8 GiB of device memory and the peak less host bytes is 14.1)."""
  host = host_bytes(memory)
  if host and getattr(memory, "peak_memory_in_bytes", 0):
    return int(memory.peak_memory_in_bytes) - host
  return (memory.argument_size_in_bytes + memory.output_size_in_bytes
          - memory.alias_size_in_bytes + memory.temp_size_in_bytes)


def compiled_stats(compiled) -> dict:
  """Per-device memory (bytes) and FLOPs of a compiled executable, as XLA reports them."""
  out = {}
  memory = compiled.memory_analysis()
  if memory is not None:
    fields = ("argument", "output", "temp", "alias", "generated_code")
    out.update({f"{f}_bytes": int(getattr(memory, f"{f}_size_in_bytes")) for f in fields})
    out["total_bytes"] = device_bytes(memory)
    if host_bytes(memory):
      out["host_bytes"] = host_bytes(memory)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  if cost and "flops" in cost:
    out["flops"] = float(cost["flops"])
  return out
