"""Shared test helpers: the CLI in a subprocess (one command, or several in one process), the
repo root, and the `tpu` lane's skip (tests that run only on a TPU chip)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# XLA's CPU backend at optimisation level 0 (LLVM -O0) and with its older loop emitters for
# fusions instead of the MLIR fusion emitters: tests run tiny programs for a few steps, where
# compiling dominates. -O0 makes the suite about a third faster; the old emitters compile the
# `test` model's step about 3x faster again (measured 3.4 s -> 1.2 s), with losses equal to
# float32 rounding. The compiled program is also built as one LLVM module instead of split for
# parallel codegen: on CI's 2 cores, where both pytest workers compile at once, the split's
# threads only add work (the `test` model's init and step compile in about 30% less CPU time,
# same losses bit for bit). None of these changes what any test checks. Set before jax is
# imported, here and in every subprocess the tests start; benchmarks and users keep XLA's defaults.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                  "--xla_cpu_parallel_codegen_split_count=1")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
# One JAX compile cache for the whole test run: pytest's own process makes it before its
# xdist workers start; they inherit it through the environment, as does every process they
# start. Many tests train the same tiny programs in fresh processes; a program compiled once is
# read back by the others (about 8% of the CPU of the CLI-heavy files). Its key holds the
# program, the XLA flags and the devices, so what a test computes does not change.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
      tempfile.gettempdir(), f"axtrain-tests-jax-cache-{os.getpid()}")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_unconfigure(config):
  """The process that made the run's compile cache removes it when the run ends."""
  if _OWN_CACHE and not hasattr(config, "workerinput"):
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


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
        timeout: float = 600, devices: int | None = None,
        module: str = "launcher") -> subprocess.CompletedProcess:
  """Runs `axtrain ARGS` (as `python -m launcher`, or another `module` that runs it: a test
  wrapper) from this checkout; returns the result.

  `devices=N` gives the process N fake CPU devices (XLA_FLAGS, set before jax imports).
  """
  return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or ROOT,
                        env=_env(env, devices), capture_output=True, text=True, timeout=timeout)


def cli_batch(commands: list[list[str]], *, devices: int | None = None, env: dict | None = None,
              timeout: float = 600) -> list[subprocess.CompletedProcess]:
  """Runs each `axtrain ARGS` of `commands` in one fresh process (tests/cli_batch.py), one after
  another, from this checkout, with `env` added to its environment; returns one result per
  command, its output captured as `cli`'s.

  For commands that need a process only for `devices` (fake CPU devices, set before jax
  imports) or `env`: one process start and jax import instead of one per command.
  """
  done = subprocess.run([sys.executable, "-m", "tests.cli_batch"], cwd=ROOT,
                        env=_env(env, devices), input=json.dumps(commands),
                        capture_output=True, text=True, timeout=timeout, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return [subprocess.CompletedProcess(["axtrain", *args], r["code"], r["stdout"], r["stderr"])
          for args, r in zip(commands, json.loads(done.stdout))]


def gpu_compiler_missing() -> str | None:
  """Why XLA's GPU compiler (the jax-cuda12 plugin `axtrain plan` of GPU entries uses) is not
  here, or None where it is."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  from launcher.plan import GPU_PLUGIN_DIR  # pylint: disable=import-outside-toplevel
  if GPU_PLUGIN_DIR.is_dir() or importlib.util.find_spec("jax_cuda12_plugin") is not None:
    return None
  return (f"the jax-cuda12 plugin (XLA's GPU compiler) is not installed: `make install` puts "
          f"it in {GPU_PLUGIN_DIR}")


def fill_disk_at(monkeypatch, suffix: str) -> None:
  """Fault injection: the disk fills as trainer/disk.py writes a file whose name ends with
  `suffix` (its `write_atomic` writes through the file that `open` gives): the write puts half
  its bytes down, then raises ENOSPC, as a disk that fills part-way does."""
  import builtins  # pylint: disable=import-outside-toplevel
  import errno  # pylint: disable=import-outside-toplevel
  from trainer import disk  # pylint: disable=import-outside-toplevel

  class Full:
    def __init__(self, path, mode):
      self.file = builtins.open(path, mode)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.file.close()

    def write(self, data):
      data = memoryview(data).cast("B")
      self.file.write(data[:len(data) // 2])
      self.file.flush()
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def full_at(path, mode="r", *args, **kwargs):
    if str(path).endswith(suffix):
      return Full(path, mode)
    return builtins.open(path, mode, *args, **kwargs)

  monkeypatch.setattr(disk, "open", full_at, raising=False)


def report_full(monkeypatch, under: pathlib.Path, *, when=lambda: True) -> None:
  """Fault injection: os.statvfs reports one 4 kB block free on the filesystem of every path
  under `under` (while `when()` holds), as on a disk another job has filled."""
  real = os.statvfs

  def statvfs(path):
    found = real(path)
    if str(under) in os.fspath(path) and when():
      return os.statvfs_result((found.f_bsize, 4096, found.f_blocks, 1, 1, found.f_files,
                                found.f_ffree, found.f_favail, found.f_flag, found.f_namemax))
    return found

  monkeypatch.setattr(os, "statvfs", statvfs)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """A module's JAX compile cache (tests/ckpt_util.py): its runs of one config share programs."""
  return tmp_path_factory.mktemp("jax_cache")


@pytest.fixture(scope="module", autouse=True)
def _share_experiments(request):
  """In a module marked `share_experiments`, trainer/experiment.py's `build` returns the
  Experiment it built before for an equal config, mesh entry and devices, so that the module's
  in-process runs of one config (CLI runs in a row: a run, its resume, its refusals) reuse its
  jitted programs instead of tracing, lowering and compiling them again (about 2 s a run of the
  `test` model; a third of the suite's runs repeated a config of their module). For modules
  whose tests change no module constant that a trace reads; the memo ends with the module."""
  if request.node.get_closest_marker("share_experiments") is None:
    yield
    return
  from trainer import experiment  # pylint: disable=import-outside-toplevel
  build, built = experiment.build, {}

  def shared(run, entry, *args, **kwargs):
    key = repr((run, entry, args, sorted(kwargs.items())))
    if key not in built:
      built[key] = build(run, entry, *args, **kwargs)
    return built[key]
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(experiment, "build", shared)
    yield


@pytest.fixture
def run_cli():
  return cli


@pytest.fixture
def highest_precision():
  """float32 matmuls at full precision while the test runs. On a TPU they otherwise take one
  bfloat16 pass (relative error ~2^-8), which comparisons at float32 tolerances do not survive;
  on CPU float32 matmuls are exact to float32 either way, so CPU results do not change."""
  import jax  # pylint: disable=import-outside-toplevel
  with jax.default_matmul_precision("highest"):
    yield


# The `tpu` lane (pyproject.toml's marker): tests whose chip work runs in subprocesses (training
# runs, tests/tpu_tolerances.py), which need the chip free. One process at a time can hold a
# TPU, and the pytest process would take it as soon as JAX creates an array (collecting
# tests/test_modules.py does), so under `-m tpu` this process keeps JAX on CPU; in any other
# selection the tpu tests are skipped on a chip machine too. On the lent chip:
#     bash .chip/on_chip.sh python3 -m pytest -m tpu
LANE = "tpu"
LANE_COMMAND = "python -m pytest -m tpu"


def tpu_present() -> bool:
  """libtpu found and a TPU chip on the PCI bus (or JAX_FORCE_TPU_INIT set): the check JAX itself
  makes before it loads libtpu (jax/_src/cloud_tpu_init.py), made with JAX's own functions and
  without opening the chip (which would hold it: one process at a time can)."""
  # pylint: disable=import-outside-toplevel
  from jax._src import cloud_tpu_init, hardware_utils
  chips = hardware_utils.num_available_tpu_chips_and_device_id()[0]
  return cloud_tpu_init.get_tpu_library_path() is not None and (
      chips > 0 or cloud_tpu_init.jax_force_tpu_init())


def tpu_skip_reason() -> str | None:
  """Why the `tpu` tests cannot run in this session, or None when they can."""
  if not tpu_present():
    return f"needs a TPU chip (libtpu and a TPU on the PCI bus); on one: {LANE_COMMAND}"
  if os.environ.get("JAX_PLATFORMS") != "cpu":
    return (f"this pytest process may hold the chip that the lane's subprocesses need: run the "
            f"lane on its own, {LANE_COMMAND}")
  return None


def pytest_configure(config):
  if config.option.markexpr.strip() == LANE:
    os.environ["JAX_PLATFORMS"] = "cpu"  # read when jax is imported, before the test modules
    if "jax" in sys.modules:  # imported already (by a plugin): its backends start later
      sys.modules["jax"].config.update("jax_platforms", "cpu")


def pytest_collection_modifyitems(items):
  lane = [item for item in items if item.get_closest_marker(LANE)]
  reason = tpu_skip_reason() if lane else None
  for item in lane if reason else ():
    item.add_marker(pytest.mark.skip(reason=reason))
