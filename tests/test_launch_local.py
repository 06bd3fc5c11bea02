"""`axtrain launch`'s parts, without a launch command: default job names, the layout a mesh
entry gives, and the supervisor of local processes (split from tests/test_launch.py)."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

from launcher.errors import UserError
from launcher.launch import layout as launch_layout
from launcher.launch.job import default_name

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# -- layouts -------------------------------------------------------------------------------------

def test_default_job_names_are_dns_labels():
  assert default_name(pathlib.Path("runs/llama_size=1b/optimizer.learning_rate=3e-4")) == (
      "axtrain-llama-size-1b-optimizer-learning")  # 40 characters at most, no trailing '-'
  assert default_name(pathlib.Path("runs/tiny/base")) == "axtrain-tiny-base"
  assert default_name(pathlib.Path("/")) == "axtrain"
  assert _DNS_LABEL.match(default_name(pathlib.Path("runs/Tiny__x/base.")))


def test_layouts_follow_the_mesh_entry():
  two_hosts = launch_layout.resolve("gpu-h100-8x2", num_processes=None, devices_per_process=None)
  assert (two_hosts.num_hosts, two_hosts.processes_per_host, two_hosts.devices_per_process) == (
      2, 1, 8)
  per_gpu = launch_layout.resolve("gpu-h100-8x2", num_processes=16, devices_per_process=None,
                                  process_per="device")
  assert (per_gpu.num_processes, per_gpu.devices_of(3)) == (16, [3])
  slices = launch_layout.resolve("tpu-v5e-16x2", num_processes=8, devices_per_process=4)
  assert (slices.num_hosts, slices.num_slices, slices.hosts_per_slice, slices.topology) == (
      8, 2, 4, "v5e:4x4")
  cpu = launch_layout.resolve("cpu", num_processes=4, devices_per_process=2, nodes=2)
  assert (cpu.num_hosts, cpu.processes_per_host, cpu.devices_of(1), cpu.fixed) == (
      2, 2, [2, 3], False)
  auto = launch_layout.resolve("auto", num_processes=2, devices_per_process=None,
                               local_platform="cpu")
  assert (auto.platform, auto.devices_of(0)) == ("cpu", None)
  with pytest.raises(UserError, match="does not split evenly"):
    launch_layout.resolve("cpu", num_processes=3, devices_per_process=None, nodes=2)
  with pytest.raises(UserError, match="--devices_per_process=4 does not match"):
    launch_layout.resolve("gpu-h100-8", num_processes=None, devices_per_process=4)
  with pytest.raises(UserError, match="name the platform"):
    launch_layout.resolve("auto", num_processes=2, devices_per_process=2)


# -- the supervisor of local processes ------------------------------------------------------

def test_the_supervisor_says_a_processes_cpp_abort_in_one_line(tmp_path):
  """A process that aborts with absl's fatal report (jaxlib's, when process 0 and the
  coordination service it hosts are gone) keeps its reason line; the stack trace's frames are
  one line, and the other process's output passes unchanged."""
  import io  # pylint: disable=import-outside-toplevel
  from launcher.launch import job as launch_job, local  # pylint: disable=import-outside-toplevel
  # p1 aborts once p0 has said its line: the supervisor stops p0 when p1 ends, and on a loaded
  # machine p1 could otherwise end before p0 had started.
  said = tmp_path / "p0_said"
  abort = ("import os, sys, time\n"
           f"while not os.path.exists({str(said)!r}): time.sleep(0.01)\n"
           "print('F1205 client.h:80] Terminating process because the JAX distributed service "
           "detected fatal errors', file=sys.stderr)\n"
           "print('*** Check failure stack trace: ***', file=sys.stderr)\n"
           "for i in range(9): print(f'    @     0x7f00000{i}  (unknown)', file=sys.stderr)\n"
           "sys.stderr.flush(); os.abort()\n")
  layout = launch_layout.resolve("cpu", num_processes=2, devices_per_process=1)
  job = launch_job.Job(name="t", layout=layout, train_args=(), axtrain=(), workdir=str(tmp_path),
                       run_dir=tmp_path, record_dir=tmp_path, command="test")
  out, err = io.StringIO(), io.StringIO()
  fine = f"print('fine', flush=True); open({str(said)!r}, 'w').close()"
  code = local.Supervisor(job, [[sys.executable, "-c", fine],
                                [sys.executable, "-c", abort]], out=out, err=err).run()
  lines = err.getvalue().splitlines()
  p1 = [line for line in lines if line.startswith("[p1] ")]
  assert code == 134 and out.getvalue() == "[p0] fine\n"
  assert p1[0].startswith("[p1] F1205 client.h:80] Terminating process") and len(p1) == 2, lines
  assert "stack trace of 9 frames left out" in p1[1]


def test_the_supervisor_names_the_runtime_log_of_a_process_that_aborted(tmp_path):
  """A process that trained sends the JAX runtime's output to runtime/p<N>.log
  (launcher/distributed.py): when it aborts there (jaxlib's report of a lost coordination
  service), the console has nothing of it, and launch's line on its end names that log."""
  import io  # pylint: disable=import-outside-toplevel
  from launcher.launch import job as launch_job, local  # pylint: disable=import-outside-toplevel
  log = tmp_path / "runtime" / "p1.log"
  abort = (f"import os, pathlib\npath = pathlib.Path({str(log)!r})\n"
           f"path.parent.mkdir(parents=True, exist_ok=True)\n"
           f"path.write_text('F1205 client.h:80] Terminating process\\n')\nos.abort()\n")
  layout = launch_layout.resolve("cpu", num_processes=2, devices_per_process=1)
  job = launch_job.Job(name="t", layout=layout, train_args=(), axtrain=(), workdir=str(tmp_path),
                       run_dir=pathlib.Path("."), record_dir=tmp_path, command="test")
  err = io.StringIO()
  code = local.Supervisor(job, [[sys.executable, "-c", "import time; time.sleep(30)"],
                                [sys.executable, "-c", abort]], out=io.StringIO(), err=err,
                          grace_s=1).run()
  assert code == 134
  assert (f"axtrain launch: p1 exited with 134 (SIGABRT) (what the JAX runtime logged there: "
          f"{log}); stopping p0") in err.getvalue(), err.getvalue()


def test_the_supervisor_leaves_out_gloos_all_connected_line(tmp_path):
  """jaxlib's gloo prints `[Gloo] Rank N is connected to K peer ranks...` on stdout as each CPU
  process joins its peers (the line as jaxlib 0.10.2 prints it, std::cout). All connected: left
  out, stdout keeps the processes' own output; fewer than expected: kept, on stderr."""
  import io  # pylint: disable=import-outside-toplevel
  from launcher.launch import job as launch_job, local  # pylint: disable=import-outside-toplevel
  line = ("[Gloo] Rank {} is connected to {} peer ranks. Expected number of connected peer ranks "
          "is : 1")
  layout = launch_layout.resolve("cpu", num_processes=2, devices_per_process=1)
  job = launch_job.Job(name="t", layout=layout, train_args=(), axtrain=(), workdir=str(tmp_path),
                       run_dir=tmp_path, record_dir=tmp_path, command="test")
  out, err = io.StringIO(), io.StringIO()
  code = local.Supervisor(job, [
      [sys.executable, "-c", f"print({line.format(0, 1)!r}); print('trained')"],
      [sys.executable, "-c", f"print({line.format(1, 0)!r}); print('[Gloo] Rank 1 is NOT "
                             f"connected to: [0]')"]], out=out, err=err).run()
  assert code == 0 and out.getvalue() == "[p0] trained\n", out.getvalue()
  assert f"[p1] {line.format(1, 0)}\n[p1] [Gloo] Rank 1 is NOT connected to: [0]\n" in err.getvalue()
