"""Shared test helpers: the CLI in a subprocess, and the repo root."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

def cli(*args: str, cwd: pathlib.Path | str | None = None, env: dict | None = None,
        timeout: float = 600, devices: int | None = None) -> subprocess.CompletedProcess:
  """Runs `axtrain ARGS` (as `python -m launcher`) from this checkout; returns the result.

  `devices=N` gives the process N fake CPU devices (XLA_FLAGS, set before jax imports).
  """
  full_env = dict(os.environ)
  full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
  full_env.setdefault("JAX_PLATFORMS", "cpu")
  if devices is not None:
    full_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  full_env.update(env or {})
  return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd or ROOT,
                        env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run_cli():
  return cli
