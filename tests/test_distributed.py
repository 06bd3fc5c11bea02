"""Two real JAX processes (jax.distributed on 127.0.0.1, gloo collectives) train as one.

Each process sees 2 fake CPU devices, so the run has 4 devices over 2 hosts; a
single process with 4 devices is the reference. The data is sliced per process,
the batch assembled from process-local rows, the checkpoint written by both
processes together, and then resumed by one process on a 2-device mesh.
"""

from __future__ import annotations

import socket
import subprocess

import numpy as np
import pytest

from tests import ckpt_util as cu
from tests.conftest import ROOT

STEPS = ("--config.trainer.max_steps=6", "--config.checkpoint.every_steps=3",
         "--config.optimizer.schedule.warmup_steps=0")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_two_processes(run_dir, cache, *extra) -> list[tuple[int, str]]:
  port = free_port()
  procs = [subprocess.Popen(
      cu.args(run_dir, *STEPS, *extra, f"--coordinator_address=127.0.0.1:{port}",
              "--num_processes=2", f"--process_id={i}"),
      env=cu.env(cache, devices=2), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for i in (0, 1)]
  out = []
  try:
    for proc in procs:
      _, err = proc.communicate(timeout=600)
      out.append((proc.returncode, err))
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp("jax_cache")


def test_two_processes_train_like_one_and_resume_on_one(tmp_path, cache):
  one = tmp_path / "one"
  result = cu.run(one, cache, *STEPS, devices=4)
  assert result.returncode == 0, result.stderr[-3000:]

  two = tmp_path / "two"
  results = run_two_processes(two, cache)
  for rc, err in results:
    assert rc == 0, err[-3000:]
  assert cu.status(two) == "completed"
  assert cu.steps(two) == [3, 6]
  want, got = cu.losses(one), cu.losses(two)
  assert sorted(got) == list(range(1, 7))
  np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                             rtol=1e-5)
  theirs = cu.params(two, 6)
  for key, value in cu.params(one, 6).items():
    np.testing.assert_allclose(theirs[key], value, rtol=1e-4, atol=1e-6, err_msg=key)
  # Only process 0 writes the run's files: one record per step, not one per process.
  assert len((two / "metrics.jsonl").read_text().splitlines()) == len(
      (one / "metrics.jsonl").read_text().splitlines())

  # The checkpoint the two processes wrote together resumes in one process on 2 devices.
  resumed = tmp_path / "resumed"
  cu.copy_as_crashed(two, resumed, upto=3)
  result = cu.run(resumed, cache, *STEPS, devices=2)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 3" in result.stderr
  again = cu.losses(resumed)
  np.testing.assert_allclose([again[s] for s in range(4, 7)], [want[s] for s in range(4, 7)],
                             rtol=1e-5)
