"""Two real JAX processes (jax.distributed on 127.0.0.1, gloo collectives) train as one.

The processes are started by `axtrain launch --backend=local`, each with 2 fake CPU devices,
so the run has 4 devices over 2 processes; a single process with 4 devices is the reference.
The data is sliced per process, the batch assembled from process-local rows, the checkpoint
written by both processes together. A SIGKILL of one process stops the other within launch's
bound and launch exits with the killed one's code; launching again resumes from the two
processes' checkpoint, and that checkpoint also resumes in one process on a 2-device mesh.
A Ctrl-C of the launch ends with axtrain's lines only, the runtime's in the run's runtime/ logs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from launcher.launch.local import FAILURE_GRACE_S
from tests import ckpt_util as cu
from tests.conftest import ROOT

STEPS = ("--config.trainer.max_steps=6", "--config.checkpoint.every_steps=3",
         "--config.optimizer.schedule.warmup_steps=0")


def launch_argv(run_dir, *launch_flags: str) -> list[str]:
  return [sys.executable, "-m", "launcher", "launch", "--backend=local", "--num_processes=2",
          "--devices_per_process=2", *launch_flags, "--", f"--config={cu.CONFIG}",
          f"--output_dir={run_dir}", *STEPS]


def wait_for(predicate, what: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
  deadline = time.monotonic() + timeout_s
  while not predicate():
    assert proc.poll() is None, f"launch exited {proc.returncode} before {what}"
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.05)


@pytest.mark.slow  # launches, a kill, a reference: over a minute on 2 cores (make test-slow runs it)
def test_two_processes_train_like_one_survive_a_kill_and_resume(tmp_path, cache):
  one = tmp_path / "one"
  result = cu.run(one, cache, *STEPS, devices=4)
  assert result.returncode == 0, result.stderr[-3000:]
  want = cu.losses(one)

  # Both processes hold after step 3 (checkpointed); then process 1 is killed.
  two = tmp_path / "two"
  held, release, err = tmp_path / "held", tmp_path / "release", tmp_path / "launch.err"
  hooks = shlex.join([sys.executable, cu.HOOKS, "--hold_after_step=3", f"--held_file={held}",
                      f"--release_file={release}", "--"])
  with open(err, "w") as stderr:
    launch = subprocess.Popen(launch_argv(two, f"--axtrain={hooks}"), env=cu.env(cache),
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
  try:
    wait_for(lambda: all((tmp_path / f"held.{i}").exists() for i in (0, 1)), "the hold", launch)
    wait_for(lambda: (two / "checkpoints" / "3").is_dir(), "checkpoint 3", launch)
    pids = re.search(r"started 2 processes \(pids (\d+), (\d+)\)", err.read_text())
    killed_at = time.monotonic()
    subprocess.run(["kill", "-KILL", pids[2]], check=True)
    code = launch.wait(timeout=60)
    stopped_in = time.monotonic() - killed_at
  finally:
    if launch.poll() is None:
      launch.kill()
  log = err.read_text()
  assert code == 128 + signal.SIGKILL, log[-3000:]
  assert "p1 exited with 137 (SIGKILL); stopping p0" in log
  assert stopped_in < FAILURE_GRACE_S + 20, stopped_in  # the bound: within 30 s
  assert cu.steps(two) == [3]

  # The same launch again resumes from the two processes' checkpoint and completes.
  done = subprocess.run(launch_argv(two), env=cu.env(cache), cwd=ROOT, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "[p0] resumed from checkpoint step 3" in done.stderr
  assert cu.status(two) == "completed"
  assert cu.steps(two) == [3, 6]
  got = cu.losses(two)
  assert sorted(got) == list(range(1, 7))
  np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                             rtol=1e-5)
  theirs = cu.params(two, 6)
  for key, value in cu.params(one, 6).items():
    np.testing.assert_allclose(theirs[key], value, rtol=1e-4, atol=1e-6, err_msg=key)
  # Only process 0 writes the run's files: one record per step, not one per process (the
  # killed attempt wrote steps 1-3, the save at 3 flushing its record; the relaunch 4-6).
  logged = [json.loads(line)["step"] for line in (two / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]
  assert logged == list(range(1, 7))

  # The checkpoint the two processes wrote together resumes in one process on 2 devices.
  resumed = tmp_path / "resumed"
  cu.copy_as_crashed(two, resumed, upto=3)
  result = cu.run(resumed, cache, *STEPS, devices=2)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 3" in result.stderr
  again = cu.losses(resumed)
  np.testing.assert_allclose([again[s] for s in range(4, 7)], [want[s] for s in range(4, 7)],
                             rtol=1e-5)


# What a process of a multi-process run sends where once it trains: the runtime's C++ line
# (written to file descriptor 2, as jaxlib's logging does), an absl record (as Orbax logs) and
# axtrain's own line; with `before`, absl has made its handler before (on the console's stream).
RUNTIME_OUTPUT = textwrap.dedent("""
    import os, pathlib, sys
    from absl import logging
    from launcher import distributed
    if sys.argv[2] == "before":
      logging.warning("made a handler: said before the log began")
    distributed.runtime_output_to(pathlib.Path(sys.argv[1]))
    os.write(2, b"W1206 12:04:31.104108 2590 preemption_notifier.cc:90] SIGTERM caught\\n")
    logging.warning("[process=0][thread=MainThread] Reached preemption sync point, step=2")
    print("axtrain: preempted after step 2", file=sys.stderr)
""")


@pytest.mark.parametrize("handler", ["before", "none"])
def test_the_runtimes_output_goes_to_its_log_and_ours_to_the_console(tmp_path, handler):
  log = tmp_path / "run" / "runtime" / "p0.log"
  done = subprocess.run([sys.executable, "-c", RUNTIME_OUTPUT, str(log), handler], cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                        text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  before = "WARNING:absl:made a handler: said before the log began\n" if handler == "before" else ""
  assert done.stderr == before + "axtrain: preempted after step 2\n"
  assert log.read_text() == (
      "W1206 12:04:31.104108 2590 preemption_notifier.cc:90] SIGTERM caught\n"
      "WARNING:absl:[process=0][thread=MainThread] Reached preemption sync point, step=2\n")


@pytest.mark.slow  # two processes to a stop: about 25 s on 2 cores (make test-slow runs it)
def test_ctrl_c_of_two_processes_ends_with_our_lines_only(tmp_path, cache):
  """Ctrl-C of a 2-process launch held after step 2, process 1 ending 4 s after process 0 (a
  slow host). Both agree on a step, checkpoint it and exit 75, and the console holds axtrain's
  lines only: the notifier's `SIGTERM caught` and absl's `Reached preemption sync point` are in
  runtime/p<N>.log. Process 0 waits for process 1 to leave jax.distributed before its
  coordination service goes: before, process 1 then logged `Polled an error from coordination
  service`, `F ... Terminating process` and gRPC's `Socket closed` with a stack trace, and
  aborted before its own last line."""
  run_dir, held, release = tmp_path / "run", tmp_path / "held", tmp_path / "release"
  hooks = shlex.join([sys.executable, cu.HOOKS, "--hold_after_step=2", f"--held_file={held}",
                      f"--release_file={release}", "--then_sleep_s=0.3", "--end_late_process=1",
                      "--end_late_s=4", "--"])
  argv = [sys.executable, "-m", "launcher", "launch", "--backend=local", "--num_processes=2",
          "--devices_per_process=1", f"--axtrain={hooks}", "--", f"--config={cu.CONFIG}",
          f"--output_dir={run_dir}", "--config.trainer.max_steps=20", "--noprogress"]
  launch = subprocess.Popen(argv, env=cu.env(cache), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  logs = [run_dir / "runtime" / f"p{i}.log" for i in (0, 1)]
  try:
    wait_for(lambda: all((tmp_path / f"held.{i}").exists() for i in (0, 1)), "the hold", launch)
    launch.send_signal(signal.SIGINT)
    wait_for(lambda: all(p.exists() and "SIGTERM caught" in p.read_text() for p in logs),
             "the runtime's notices", launch, timeout_s=60)
    release.write_text("")
    _, err = launch.communicate(timeout=300)
  finally:
    if launch.poll() is None:
      launch.kill()
  assert launch.returncode == 75, err[-3000:]
  assert [l for l in err.splitlines()
          if not re.match(r"^(axtrain launch: |\[p[01]\] axtrain: )", l)] == [], err[-3000:]
  for i, log in enumerate(logs):
    assert f"[p{i}] axtrain: preempted after step " in err, err[-3000:]
    text = log.read_text()
    assert f"[process={i}][thread=MainThread] Reached preemption sync point" in text, text
    assert "Polled an error" not in text and "Terminating process" not in text, text
  assert {"runtime/p0.log", "runtime/p1.log"} <= set(
      json.loads((run_dir / "manifest.json").read_text())["files"])
