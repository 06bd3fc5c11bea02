"""On a TPU chip (the `tpu` lane): a run SIGKILLed and resumed equals an uninterrupted one bit for
bit, and checkpoints cross between CPU and the chip.

Every run trains tests/testdata/ckpt_lm.py (the `test` model, 30 steps, a checkpoint every 10,
every step logged), as tests/test_fault_tolerance.py does on CPU, with --mesh=auto: `cpu` on
CPU, the chip's entry (tpu-v5e-1) on the chip. Runs on the chip are subprocesses
(JAX_PLATFORMS=tpu; one process at a time can hold the chip) sharing one compile cache; runs on
CPU run in this process, whose JAX the lane keeps on CPU (tests/conftest.py).
"""

from __future__ import annotations

import json
import math
import pathlib
import signal
import time

import numpy as np
import pytest

from launcher.preemption import EXIT_PREEMPTED
from tests import ckpt_util as cu
from tests.launch_with_hooks import SaveParamsAtStart, StopAfter

pytestmark = pytest.mark.tpu

@pytest.fixture(scope="module")
def chip_ref(tmp_path_factory, cache):
  """The uninterrupted run on the chip."""
  run_dir = tmp_path_factory.mktemp("chip_ref") / "run"
  result = cu.run(run_dir, cache, platform="tpu")
  assert result.returncode == 0, result.stderr[-3000:]
  assert cu.status(run_dir) == "completed" and mesh_name(run_dir).startswith("tpu-")
  assert sorted(cu.losses(run_dir)) == list(range(1, 31))
  assert cu.steps(run_dir) == [10, 20, 30]
  return run_dir


def mesh_name(run_dir) -> str:
  """The mesh entry the run's last start trained on (run.json)."""
  return json.loads((pathlib.Path(run_dir) / "run.json").read_text())["mesh"]["name"]


def assert_bitwise(got, want: dict) -> None:
  """The same parameter names, each array of the same dtype, shape and bytes."""
  assert sorted(got) == sorted(want) and want
  for key in want:
    a, b = np.asarray(got[key]), want[key]
    assert (a.dtype, a.shape) == (b.dtype, b.shape), key
    assert a.tobytes() == b.tobytes(), f"{key}: largest difference {np.max(np.abs(a - b))}"


def wait_for_checkpoint(run_dir, step: int, proc) -> None:
  """Until checkpoint `step` of the running `proc` is committed (its directory has its name)."""
  deadline = time.monotonic() + 120
  while step not in (cu.steps(run_dir) if (run_dir / "checkpoints").is_dir() else []):
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.monotonic() < deadline, f"checkpoint {step} was not committed in 120 s"
    time.sleep(0.05)


def assert_finite_losses(run_dir, steps: range) -> None:
  got = cu.losses(run_dir)
  assert all(step in got and math.isfinite(got[step]) for step in steps), got


def test_sigkill_and_resume_on_the_chip_equals_an_uninterrupted_run(tmp_path, chip_ref, cache):
  run_dir = tmp_path / "run"
  proc = cu.start_paused(run_dir, cache, 17, platform="tpu")  # holds after step 17
  wait_for_checkpoint(run_dir, 10, proc)
  rc, _ = cu.signal_and_wait(proc, signal.SIGKILL)
  assert rc == -signal.SIGKILL
  assert cu.steps(run_dir) == [10]  # 11-17 are lost
  result = cu.run(run_dir, cache, platform="tpu")  # the same command
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 10" in result.stderr
  assert cu.status(run_dir) == "completed"
  # Steps 1-10 logged by the killed part, 11-30 by the resumed one: bit for bit the reference's.
  assert cu.losses(run_dir) == cu.losses(chip_ref)
  assert_bitwise(cu.params(run_dir, 30), cu.params(chip_ref, 30))


def test_checkpoint_written_on_cpu_resumes_on_the_chip(tmp_path, cache, capfd):
  run_dir = tmp_path / "run"
  stopped = cu.run_here(capfd, run_dir, cache, callbacks=[StopAfter(12)])  # CPU, this process
  assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-3000:]
  assert mesh_name(run_dir) == "cpu" and cu.steps(run_dir) == [10, 12]
  saved = cu.params(run_dir, 12)
  start = tmp_path / "start.npz"
  result = cu.run(run_dir, cache, hooks=(f"--save_params_at_start={start}",), platform="tpu")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 12" in result.stderr
  assert cu.status(run_dir) == "completed" and mesh_name(run_dir).startswith("tpu-")
  with np.load(start) as restored:
    assert_bitwise(restored, saved)
  assert_finite_losses(run_dir, range(13, 31))


def test_checkpoint_written_on_the_chip_resumes_on_cpu(tmp_path, chip_ref, cache, capfd):
  run_dir = tmp_path / "run"
  cu.copy_as_crashed(chip_ref, run_dir, upto=20)
  saved = cu.params(run_dir, 20)
  start = SaveParamsAtStart(tmp_path / "start.npz")
  result = cu.run_here(capfd, run_dir, cache, callbacks=[start])  # CPU, this process
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 20" in result.stderr
  assert cu.status(run_dir) == "completed" and mesh_name(run_dir) == "cpu"
  with np.load(start.path) as restored:
    assert_bitwise(restored, saved)
  assert_finite_losses(run_dir, range(21, 31))


def test_a_host_memory_resume_on_the_chip_reads_its_checkpoint_beside_the_compile(
    tmp_path, chip_ref, cache):
  """trainer/early_restore.py on the chip: the state in pinned host memory is read while the
  steps compile, and the loop starts from exactly the checkpoint's parameters."""
  run_dir = tmp_path / "run"
  cu.copy_as_crashed(chip_ref, run_dir, upto=20)
  saved = cu.params(run_dir, 20)
  start = tmp_path / "start.npz"
  result = cu.run(run_dir, cache, "--config.trainer.state_memory=host",
                  hooks=(f"--save_params_at_start={start}",), platform="tpu")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 20" in result.stderr
  startup = json.loads((run_dir / "run.json").read_text())["startup"]
  assert startup["restore_started_s"] <= startup["to_steps_compiled_s"], startup
  assert startup["restore_read_s"] > 0, startup
  with np.load(start) as restored:
    assert_bitwise(restored, saved)
  assert_finite_losses(run_dir, range(21, 31))
