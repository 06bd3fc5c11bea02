"""Shared test helpers: the CLI in a subprocess (one command, or several in one process), and
the repo root."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# XLA's CPU backend at optimisation level 0 (LLVM -O0) and with its older loop emitters for
# fusions instead of the MLIR fusion emitters: tests run tiny programs for a few steps, where
# compiling dominates. -O0 makes the suite about a third faster; the old emitters compile the
# `test` model's step about 3x faster again (measured 3.4 s -> 1.2 s), with losses equal to
# float32 rounding. Neither changes what any test checks. Set before jax is imported, here and in
# every subprocess the tests start; benchmarks and users keep XLA's defaults.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()


def xla_flags(devices: int | None = None) -> str:
  """XLA_FLAGS for a test subprocess, with `devices` fake CPU devices if given."""
  fake = f"--xla_force_host_platform_device_count={devices} " if devices is not None else ""
  return fake + TEST_XLA_FLAGS

def _env(env: dict | None, devices: int | None) -> dict:
  full_env = dict(os.environ)
  full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
  full_env.setdefault("JAX_PLATFORMS", "cpu")
  if devices is not None:
    full_env["XLA_FLAGS"] = xla_flags(devices)
  full_env.update(env or {})
  return full_env


def cli(*args: str, cwd: pathlib.Path | str | None = None, env: dict | None = None,
        timeout: float = 600, devices: int | None = None) -> subprocess.CompletedProcess:
  """Runs `axtrain ARGS` (as `python -m launcher`) from this checkout; returns the result.

  `devices=N` gives the process N fake CPU devices (XLA_FLAGS, set before jax imports).
  """
  return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd or ROOT,
                        env=_env(env, devices), capture_output=True, text=True, timeout=timeout)


def cli_batch(commands: list[list[str]], *, devices: int | None = None,
              timeout: float = 600) -> list[subprocess.CompletedProcess]:
  """Runs each `axtrain ARGS` of `commands` in one fresh process (tests/cli_batch.py), one after
  another, from this checkout; returns one result per command, its output captured as `cli`'s.

  For commands that need a process only for `devices` (fake CPU devices, set before jax
  imports): one process start and jax import instead of one per command.
  """
  done = subprocess.run([sys.executable, "-m", "tests.cli_batch"], cwd=ROOT,
                        env=_env(None, devices), input=json.dumps(commands),
                        capture_output=True, text=True, timeout=timeout, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return [subprocess.CompletedProcess(["axtrain", *args], r["code"], r["stdout"], r["stderr"])
          for args, r in zip(commands, json.loads(done.stdout))]


@pytest.fixture
def run_cli():
  return cli
