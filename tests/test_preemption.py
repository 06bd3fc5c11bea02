"""Two SIGINTs count as two even while the main thread is blocked in native code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.conftest import ROOT

# The main thread blocks in C for good (a default pthread mutex locked twice never returns and
# never lets Python run its signal handlers), as it does in a long device computation or a
# checkpoint write. The old handler-based counting saw nothing here.
BLOCKED = textwrap.dedent("""
    import ctypes, sys
    from launcher.preemption import Preemption
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER on Linux
    with Preemption(on_second=lambda: print("on_second", flush=True)).installed():
      libc.pthread_mutex_lock(mutex)
      print("ready", flush=True)
      libc.pthread_mutex_lock(mutex)
    sys.exit(3)
""")


def _start():
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.Popen([sys.executable, "-c", BLOCKED], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  assert proc.stdout.readline() == "ready\n"
  return proc


def test_second_signal_0_3_s_later_exits_at_once():
  proc = _start()
  try:
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
  finally:
    proc.kill()
  assert proc.returncode == 75, (proc.returncode, err)
  assert "SIGINT: finishing the current step" in err
  assert "second SIGINT: exiting now" in err and out == "on_second\n"


def test_one_signal_only_requests_a_stop():
  proc = _start()
  try:
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None, proc.communicate()
  finally:
    proc.kill()
    _, err = proc.communicate(timeout=20)
  assert "SIGTERM: finishing the current step" in err and "second" not in err
