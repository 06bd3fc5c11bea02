"""Helpers for the checkpoint / fault-tolerance tests: CLI runs that can be paused and signalled,
and the same runs in this process where the process is not what a test checks."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import ROOT, xla_flags

CONFIG = str(ROOT / "tests" / "testdata" / "ckpt_lm.py")
HOOKS = str(ROOT / "tests" / "launch_with_hooks.py")  # axtrain with test callbacks


def env(cache_dir: pathlib.Path, devices: int | None = None, *, platform: str = "cpu") -> dict:
  """A run's environment: JAX on `platform` (`tpu` for the tpu lane's runs on the chip)."""
  out = dict(os.environ)
  out["PYTHONPATH"] = str(ROOT) + os.pathsep + out.get("PYTHONPATH", "")
  out["JAX_PLATFORMS"] = platform
  # Runs of one config share compiled programs (same results, less CPU).
  out["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
  out["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  if devices is not None:
    out["XLA_FLAGS"] = xla_flags(devices)
  return out


def args(run_dir: pathlib.Path, *extra: str, hooks: tuple[str, ...] = ()) -> list[str]:
  """axtrain's command line; with `hooks` (tests/launch_with_hooks.py options) that script's."""
  axtrain = [f"--config={CONFIG}", f"--output_dir={run_dir}", *extra]
  if hooks:
    return [sys.executable, HOOKS, *hooks, "--", *axtrain]
  return [sys.executable, "-m", "launcher", *axtrain]


def run(run_dir, cache_dir, *extra, devices=None, hooks=(),
        platform="cpu") -> subprocess.CompletedProcess:
  return subprocess.run(args(run_dir, *extra, hooks=hooks),
                        env=env(cache_dir, devices, platform=platform),
                        capture_output=True, text=True, timeout=600, cwd=ROOT)


@contextlib.contextmanager
def compile_cache(cache_dir):
  """jax in this process reads and writes the subprocesses' compile cache while the block runs."""
  # pylint: disable=import-outside-toplevel
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  settings = {"jax_compilation_cache_dir": str(cache_dir),
              "jax_persistent_cache_min_compile_time_secs": 0.0}
  before = {name: getattr(jax.config, name) for name in settings}
  compilation_cache.reset_cache()  # jax opens its cache once per process: this one, now
  try:
    for name, value in settings.items():
      jax.config.update(name, value)
    yield
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()


def run_here(capfd, run_dir, cache_dir, *extra, callbacks=()) -> subprocess.CompletedProcess:
  """`run` in this process (launcher.main.main, `callbacks` injected), for runs whose process is
  not what is tested; its stdout and stderr come from `capfd` (pytest's fixture), or stay in
  pytest's capture with `capfd=None` (a module fixture's run: the result holds no output)."""
  from launcher import main as main_lib  # pylint: disable=import-outside-toplevel
  argv = ["axtrain", f"--config={CONFIG}", f"--output_dir={run_dir}", *extra]
  if capfd is not None:
    capfd.readouterr()
  with compile_cache(cache_dir):
    code = main_lib.main(argv, callbacks=callbacks)
  out, err = capfd.readouterr() if capfd is not None else ("", "")
  return subprocess.CompletedProcess(argv, code, out, err)


def start_paused(run_dir, cache_dir, pause: int, *extra, devices=None, platform="cpu",
                 at: str = "pause_after_step") -> subprocess.Popen:
  """Starts a run that holds after step `pause` (dispatched, checkpoint dispatched; its
  metrics record is written one step late, so on the stop, or never on SIGKILL); with
  `at="pause_at_eval"`, as the evaluation after step `pause` reports."""
  paused = pathlib.Path(run_dir).parent / f".{pathlib.Path(run_dir).name}.paused"
  paused.unlink(missing_ok=True)
  hooks = (f"--{at}={pause}", f"--paused_file={paused}")
  proc = subprocess.Popen(args(run_dir, *extra, hooks=hooks),
                          env=env(cache_dir, devices, platform=platform), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 600
  while not paused.exists():
    if proc.poll() is not None:
      raise AssertionError(f"run exited with {proc.returncode} before step {pause}:\n"
                           f"{proc.stderr.read()[-3000:]}")
    assert time.monotonic() < deadline, "run did not reach the pause step"
    time.sleep(0.05)
  return proc


def signal_and_wait(proc: subprocess.Popen, sig=signal.SIGTERM) -> tuple[int, str]:
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=600)
  return proc.returncode, err


def losses(run_dir) -> dict[int, float]:
  """step -> loss, the last record of each step (a resumed run logs redone steps again)."""
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  out = {}
  if path.exists():
    for line in path.read_text().splitlines():
      if line.endswith("}"):
        record = json.loads(line)
        if "loss" in record:
          out[record["step"]] = record["loss"]
  return out


def status(run_dir) -> str:
  return json.loads((pathlib.Path(run_dir) / "run.json").read_text())["status"]


def steps(run_dir) -> list[int]:
  return sorted(int(p.name) for p in (pathlib.Path(run_dir) / "checkpoints").iterdir()
                if p.name.isdigit())


def params(run_dir, step: int) -> dict:
  """The saved parameters of a step as numpy arrays keyed by path."""
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  path = pathlib.Path(run_dir).absolute() / "checkpoints" / str(step) / "state"
  with ocp.PyTreeCheckpointer() as reader:
    # Read as numpy: the saving run's devices (maybe 8, or two processes) need not exist here.
    meta = reader.metadata(path).item_metadata.tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    tree = reader.restore(path, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
  leaves = jax.tree_util.tree_flatten_with_path(tree["params"])[0]
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}


def copy_as_crashed(src, dst, *, upto: int) -> None:
  """A copy of a finished run as if killed right after its checkpoint of step `upto`.

  Later checkpoints and metrics records are dropped, so whatever the copy logs
  past `upto` was computed by the run under test.
  """
  shutil.copytree(src, dst)
  for step in steps(dst):
    if step > upto:
      shutil.rmtree(pathlib.Path(dst) / "checkpoints" / str(step))
  metrics = pathlib.Path(dst) / "metrics.jsonl"
  kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= upto]
  metrics.write_text("".join(line + "\n" for line in kept))
  info = json.loads((pathlib.Path(dst) / "run.json").read_text())
  info["status"] = "running"
  (pathlib.Path(dst) / "run.json").write_text(json.dumps(info))


def snapshot(directory) -> dict[str, tuple[int, int]]:
  """relative path -> (size, mtime_ns) of every file and folder under `directory`."""
  root = pathlib.Path(directory)
  return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(root.rglob("*"))}


def one_error_line(result: subprocess.CompletedProcess) -> str:
  """The stderr of a refused command: exactly one `axtrain: error:` line, no traceback."""
  lines = result.stderr.splitlines()
  assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-3000:])
  assert lines[0].startswith("axtrain: error: ") and "Traceback" not in result.stderr
  return lines[0]


# The uninterrupted run every fault test compares with (a module fixture of the modules that
# import it: tests/test_fault_tolerance.py, tests/test_fault_disk.py).
@pytest.fixture(scope="module")
def ref(tmp_path_factory, cache):
  """The uninterrupted run (in this process; it fills the compile cache for the others)."""
  run_dir = tmp_path_factory.mktemp("ref") / "run"
  assert run_here(None, run_dir, cache).returncode == 0
  assert status(run_dir) == "completed"
  assert sorted(losses(run_dir)) == list(range(1, 31))
  assert steps(run_dir) == [10, 20, 30]
  return run_dir


def assert_same_params(a, b, *, step=30):
  pa, pb = params(a, step), params(b, step)
  assert pa.keys() == pb.keys() and pa
  for key in pa:
    np.testing.assert_array_equal(pa[key], pb[key], err_msg=key)


def checkpoint_folders(run_dir) -> list[str]:
  return sorted(p.name for p in (pathlib.Path(run_dir) / "checkpoints").iterdir())
