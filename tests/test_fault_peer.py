"""A process of a multi-process run whose peer died ends with one line, exit 1, at once.

Two real processes (jax.distributed on 127.0.0.1, one CPU device each) train tests/testdata/
ckpt_lm.py and hold after step 1 (tests/launch_with_hooks.py); process 1 is killed, process 0 is
released into step 2, whose gradient all-reduce fails. Before: a Python traceback of the gloo
error, then a wait at jax.distributed's shutdown barrier for the dead process until the heartbeat
timeout (100 s), then jaxlib's C++ "Check failure stack trace" and SIGABRT.

The other way round (process 0, the coordinator, killed) the survivor's coordination-service
agent reports it from a C++ thread and aborts (docs/launch.md, "A lost host"): not tested here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from launcher.launch.local import free_port
from tests import ckpt_util as cu
from tests.conftest import ROOT, xla_flags


def _start(tmp_path, port: int, index: int) -> subprocess.Popen:
  hooks = ("--hold_after_step=1", f"--held_file={tmp_path / 'held'}",
           f"--release_file={tmp_path / 'release'}")
  argv = [*cu.args(tmp_path / "run", "--config.trainer.max_steps=3",
                   "--config.optimizer.schedule.warmup_steps=0", "--noprogress",
                   f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                   f"--process_id={index}", hooks=hooks)]
  env = dict(cu.env(tmp_path / "cache"), XLA_FLAGS=xla_flags(1))
  return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # two processes, one killed (make test-slow)
def test_a_dead_peer_ends_the_survivor_with_one_line(tmp_path):
  port = free_port()
  procs = [_start(tmp_path, port, i) for i in range(2)]
  try:
    deadline = time.monotonic() + 300
    while not all((tmp_path / f"held.{i}").exists() for i in range(2)):
      assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
      assert time.monotonic() < deadline, "the processes did not reach step 1"
      time.sleep(0.05)
    procs[1].kill()
    procs[1].wait()
    released = time.monotonic()
    (tmp_path / "release").write_text("")
    _, err = procs[0].communicate(timeout=200)
    took = time.monotonic() - released
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  lines = [line for line in err.splitlines() if not line.startswith(
      ("axtrain: joining ", "axtrain: note: the JAX runtime's own messages"))]
  assert procs[0].returncode == 1 and len(lines) == 1, (procs[0].returncode, err[-3000:])
  assert lines[0].startswith("axtrain: error: process 0 of 2: the JAX runtime failed (") and (
      "Gloo" in lines[0] and "how another process's end shows up" in lines[0]), lines[0]
  assert took < 30, took  # not JAX's 100 s heartbeat timeout
  info = json.loads((tmp_path / "run" / "run.json").read_text())
  assert info["status"] == "failed" and info["error"] in lines[0]
