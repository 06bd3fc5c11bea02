"""Preemption signals, the run lock and the hang watchdog, without training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from launcher import preemption
from launcher.errors import UserError
from launcher.run_lock import RunLock
from tests.conftest import ROOT
from trainer.watchdog import Watchdog


def _python(code: str, **kw) -> subprocess.Popen:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_first_signal_sets_flag_second_exits_at_once(tmp_path):
  marker = tmp_path / "second"
  proc = _python(f"""
      import os, signal, time
      from launcher.preemption import Preemption
      stop = Preemption(on_second=lambda: open({str(marker)!r}, "w").write("x"))
      with stop.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        print("requested", stop.requested(), flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        print("not reached", flush=True)
      """)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == preemption.EXIT_PREEMPTED == 75
  assert out == "requested True\n"
  assert "second SIGINT: exiting now" in err
  assert marker.read_text() == "x"


def test_run_lock_refuses_live_holder_and_ignores_dead_one(tmp_path):
  holder = _python(f"""
      import sys, time
      from launcher.run_lock import RunLock
      RunLock({str(tmp_path)!r}).acquire()
      print("locked", flush=True)
      time.sleep(60)
      """)
  assert holder.stdout.readline() == "locked\n"
  try:
    with pytest.raises(UserError, match=f"in use by another axtrain \\(pid {holder.pid}\\)"):
      RunLock(tmp_path).acquire()
  finally:
    holder.kill()
    holder.communicate()
  assert (tmp_path / ".lock").read_text().strip() == str(holder.pid)  # stale file stays
  with RunLock(tmp_path):
    assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())


def _stuck_in_a_collective(seconds: float) -> None:
  time.sleep(seconds)


def test_watchdog_dumps_all_thread_stacks(tmp_path):
  log = tmp_path / "stderr.txt"
  with open(log, "w") as f:
    with Watchdog(0.2, file=f) as watchdog:
      watchdog.pet()
      _stuck_in_a_collective(0.7)
  text = log.read_text()
  assert "Timeout (0:00:00" in text and "_stuck_in_a_collective" in text
  # Petting in time keeps it quiet.
  with open(log, "w") as f:
    with Watchdog(0.5, file=f) as watchdog:
      for _ in range(4):
        time.sleep(0.1)
        watchdog.pet()
  assert log.read_text() == ""
