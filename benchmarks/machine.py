"""What ran the benchmarks: host, versions, load; and this CPU's peak matmul FLOP/s."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import time

import jax
import jax.numpy as jnp


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def git_commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def describe() -> dict:
  versions = {}
  for name in ("jax", "jaxlib", "flax", "optax", "numpy", "orbax-checkpoint", "grain",
               "matplotlib"):
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return {
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
      "host": f"{cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} "
              f"{platform.release()}",
      "python": platform.python_version(),
      "jax devices": ", ".join(sorted({d.device_kind for d in jax.devices()})) +
                     f" x{jax.device_count()}",
      "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
      "commit": git_commit(),
  }


def load_average() -> str:
  try:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())
  except OSError:
    return "n/a"


def peak_matmul_flops(n: int = 2048, repeats: int = 5) -> float:
  """Best FLOP/s of an n x n float32 matmul, jitted (the MFU denominator on CPU)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  mm = jax.jit(jnp.matmul)
  mm(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    mm(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best
