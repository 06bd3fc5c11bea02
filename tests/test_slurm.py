"""`axtrain launch --backend=slurm --submit` on a real one-node Slurm cluster (tests/slurm_cluster.py).

A 2-task job (two jax processes, one CPU device each, gloo collectives) trains like one process
with two devices; a job that gets SIGTERM mid-run (`scancel --signal=TERM`) checkpoints, exits
75, requeues itself (`scontrol requeue`), resumes and logs the uninterrupted run's losses.
Skipped, with the reason, where Slurm is not installed (.ci/run installs slurm-wlm). The requeue
test is `slow`: `make test-slow` runs it, `make test` (CI) does not.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import ckpt_util as cu
from tests import slurm_cluster
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(slurm_cluster.missing() is not None,
                                reason=slurm_cluster.missing() or "")

STEPS = ("--config.trainer.max_steps=8", "--config.checkpoint.every_steps=3",
         "--config.optimizer.schedule.warmup_steps=0", "--mesh=cpu")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  cluster = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm")).start()
  yield cluster
  cluster.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> dict[int, float]:
  """The losses of one process with two devices, uninterrupted."""
  run_dir = tmp_path_factory.mktemp("reference") / "run"
  result = cu.run(run_dir, cache, *STEPS, devices=2)
  assert result.returncode == 0, result.stderr[-3000:]
  return cu.losses(run_dir)


def submit(slurm, cache, run_dir, *launch_flags: str) -> str:
  """`axtrain launch --backend=slurm --submit`; returns the Slurm job id."""
  argv = [sys.executable, "-m", "launcher", "launch", "--backend=slurm", "--num_processes=2",
          "--submit", *launch_flags, "--", f"--config={cu.CONFIG}", f"--output_dir={run_dir}",
          *STEPS]
  done = subprocess.run(argv, env={**cu.env(cache), **slurm.env}, cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  m = re.search(r"submitted Slurm job (\d+)", done.stdout)
  assert m, done.stdout[-2000:]
  assert [p.name for p in (run_dir / "launch").glob("*.sbatch")] == ["001-slurm.sbatch"]
  return m[1]


def log(run_dir, job_id: str) -> str:
  path = run_dir / "launch" / f"slurm-{job_id}.out"
  return path.read_text(errors="replace") if path.exists() else ""


def wait_for(predicate, what: str, timeout_s: float = 300) -> None:
  deadline = time.monotonic() + timeout_s
  while not predicate():
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.2)


def assert_losses_equal(run_dir, reference: dict[int, float]) -> None:
  got = cu.losses(run_dir)
  print("step  loss (this job)  loss (one process, uninterrupted)")
  for step in sorted(got):
    print(f"{step:4d}  {got[step]:.6f}  {reference.get(step, float('nan')):.6f}")
  assert sorted(got) == sorted(reference)
  np.testing.assert_allclose([got[s] for s in sorted(got)],
                             [reference[s] for s in sorted(reference)], rtol=1e-5)


def test_two_task_job_trains_like_one_process(slurm, cache, reference, tmp_path):
  run_dir = tmp_path / "two"
  job_id = submit(slurm, cache, run_dir)
  state = slurm.wait(job_id)
  output = log(run_dir, job_id)
  assert state == "COMPLETED", output[-3000:]
  assert cu.status(run_dir) == "completed"
  assert '"process_count": 2' in (run_dir / "run.json").read_text()
  assert "joining jax.distributed (Slurm job step)" in output
  assert_losses_equal(run_dir, reference)
  print(slurm.run("sacct", "--completion", "-j", job_id,
                  "--format=JobID,JobName%30,State,ExitCode,NodeList").stdout)


@pytest.mark.slow  # two job starts and a requeue: over a minute on 2 cores (`make test-slow` runs it)
def test_sigterm_checkpoints_requeues_and_resumes(slurm, cache, reference, tmp_path):
  run_dir = tmp_path / "requeued"
  held, release = tmp_path / "held", tmp_path / "release"
  hooks = shlex.join([sys.executable, cu.HOOKS, "--hold_after_step=3", f"--held_file={held}",
                      f"--release_file={release}", "--then_sleep_s=0.3", "--"])
  job_id = submit(slurm, cache, run_dir, f"--axtrain={hooks}")
  wait_for(lambda: all((tmp_path / f"held.{i}").exists() for i in (0, 1)), "the held tasks")
  wait_for(lambda: (run_dir / "checkpoints" / "3").is_dir(), "checkpoint 3")
  print(slurm.run("squeue", "-j", job_id).stdout)
  slurm.run("scancel", "--signal=TERM", job_id)
  # JAX's preemption notifier in each task reports the SIGTERM, in the task's log of the JAX
  # runtime (launcher/distributed.py); then the tasks may go on.
  runtime = [run_dir / "runtime" / f"p{i}.log" for i in (0, 1)]
  wait_for(lambda: all(p.exists() and "SIGTERM caught" in p.read_text() for p in runtime),
           "the SIGTERM notices")
  release.write_text("")
  state = slurm.wait(job_id)
  output = log(run_dir, job_id)
  assert state == "COMPLETED", output[-3000:]
  assert "preempted (exit 75); requeueing job" in output
  assert re.search(r"resumed from checkpoint step [45]", output), output[-3000:]
  assert "Restarts=1" in slurm.run("scontrol", "show", "job", job_id).stdout
  assert cu.status(run_dir) == "completed"
  assert '"restarts": 1' in (run_dir / "run.json").read_text()
  # The last record of each step: those after the restart were computed by the resumed job.
  assert_losses_equal(run_dir, reference)
  print(slurm.run("sacct", "--completion", "-j", job_id,
                  "--format=JobID,JobName%30,State,ExitCode,NodeList").stdout)
