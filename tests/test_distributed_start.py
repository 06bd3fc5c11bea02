"""Joining jax.distributed (launcher/distributed.py): who joins, and how a start that cannot
work ends: a malformed address or a busy port at once, a coordinator that never answers or
peers that never come within --distributed_timeout; one line each, never a traceback or a hang.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from launcher import distributed
from launcher.errors import UserError
from tests.conftest import ROOT, _env, cli_batch

RUN = ("--config=tests/testdata/ckpt_lm.py",)


def test_plan_join_reads_flags_jax_variables_and_slurm():
  assert distributed.plan_join(None, None, None, env={}) is None
  join = distributed.plan_join("10.0.0.1:8476", 4, 2, env={})
  assert (join.source, join.address, join.num_processes, join.process_id) == (
      "flags", "10.0.0.1:8476", 4, 2)
  env = {"JAX_COORDINATOR_ADDRESS": "[::1]:9000", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
  assert distributed.plan_join(None, None, None, env=env).source == "JAX_* variables"
  assert distributed.plan_join("h:1", 1, 0, env={}) is None  # one process: nothing to join
  slurm = {"SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "7"}
  assert distributed.plan_join(None, None, None, env=slurm).source == "Slurm job step"
  assert distributed.plan_join(None, None, None, env={"SLURM_NTASKS": "1",
                                                      "SLURM_STEP_ID": "0"}) is None
  assert distributed.plan_join(None, None, None, mode="tpu", env={}).source == "Cloud TPU"
  for address in ("notahost", "host:0", "host:70000", "host:port", ":80", "a b:1"):
    with pytest.raises(UserError, match="expected HOST:PORT"):
      distributed.plan_join(address, 2, 0, env={})
  with pytest.raises(UserError, match="needs --num_processes and --process_id"):
    distributed.plan_join("h:1", None, None, env={})
  with pytest.raises(UserError, match="must be below --num_processes=2"):
    distributed.plan_join("h:1", 2, 2, env={})
  with pytest.raises(UserError, match="--process_id needs --coordinator_address"):
    distributed.plan_join(None, None, 1, env={})
  with pytest.raises(UserError, match="drop --coordinator_address"):
    distributed.plan_join("h:1", None, None, mode="tpu", env={})


def test_malformed_address_and_busy_port_are_refused_at_once(tmp_path):
  with socket.socket() as busy:
    busy.bind(("", 0))
    busy.listen()
    port = busy.getsockname()[1]
    results = cli_batch([
        [*RUN, f"--output_dir={tmp_path / 'a'}", "--coordinator_address=notahost",
         "--num_processes=2", "--process_id=1"],
        [*RUN, f"--output_dir={tmp_path / 'b'}", f"--coordinator_address=127.0.0.1:{port}",
         "--num_processes=2", "--process_id=0"],
        [*RUN, f"--output_dir={tmp_path / 'c'}", "--distributed=tpu", "--process_id=0"],
        [*RUN, f"--output_dir={tmp_path / 'd'}", "--distributed=slurm"],
        [*RUN, f"--output_dir={tmp_path / 'e'}", "--distributed_timeout=0",
         "--coordinator_address=127.0.0.1:1234", "--num_processes=2", "--process_id=1"]])
  wants = ["--coordinator_address=notahost: expected HOST:PORT",
           f"port {port} is already in use on this host",
           "--distributed=tpu reads the TPU environment; drop --process_id",
           "--distributed=slurm",
           "--distributed_timeout=0: must be at least 1 second"]
  for want, result in zip(wants, results):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("axtrain: error: ") and want in lines[0], lines[0]
  assert list(tmp_path.iterdir()) == []


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow  # two processes waiting out the join timeout (make test-slow)
def test_processes_that_cannot_all_join_end_within_the_timeout(tmp_path):
  """Three starts at once, each with --distributed_timeout=3: process 0 whose peer never comes,
  process 1 whose coordinator host does not resolve, process 1 whose coordinator never answers."""
  lonely, silent = free_port(), free_port()
  cases = [
      (["--coordinator_address=127.0.0.1:%d" % lonely, "--process_id=0"], 1,
       f"not all 2 processes joined the coordinator at 127.0.0.1:{lonely} within 3 s"),
      (["--coordinator_address=notahost.invalid:1234", "--process_id=1"], 2,
       "the coordinator host 'notahost.invalid' (--coordinator_address=notahost.invalid:1234) "
       "does not resolve"),
      (["--coordinator_address=127.0.0.1:%d" % silent, "--process_id=1"], 1,
       f"nothing answered at 127.0.0.1:{silent} within 3 s"),
  ]
  start = time.monotonic()
  procs = [subprocess.Popen([sys.executable, "-m", "launcher", *RUN, *flags_,
                             f"--output_dir={tmp_path / str(i)}", "--num_processes=2",
                             "--distributed_timeout=3"], cwd=ROOT, env=_env(None, None),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i, (flags_, _, _) in enumerate(cases)]
  outs = [proc.communicate(timeout=120) for proc in procs]
  assert time.monotonic() - start < 100  # jax's own deadline would be 3 + 30 s, and abort
  for (_, code, want), proc, (_, err) in zip(cases, procs, outs):
    errors = [line for line in err.splitlines() if line.startswith("axtrain: error:")]
    assert proc.returncode == code and len(errors) == 1, err[-3000:]
    assert want in errors[0] and "Traceback" not in err and "Check failure" not in err, err
  assert list(tmp_path.iterdir()) == []
