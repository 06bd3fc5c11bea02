"""Two SIGINTs count as two even while the main thread is blocked in native code; outside the
training loop a signal ends the process at once in one line, and never inside a held block."""

from __future__ import annotations

import os
import pathlib
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


# Outside the training loop (launcher/preemption.py:Interruptions): a signal ends the process at
# once, in one line, even while the main thread is blocked in native code (a compilation).
OUTSIDE = textwrap.dedent("""
    import ctypes, sys
    from launcher.preemption import Interruptions
    interruptions = Interruptions(what=" before training began").install()
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    print("ready", flush=True)
    libc.pthread_mutex_lock(mutex)
    sys.exit(3)
""")


def _start_script(script: str):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  assert proc.stdout.readline() == "ready\n"
  return proc


def test_before_training_sigint_ends_the_process_at_once_in_one_line():
  for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 75)):
    proc = _start_script(OUTSIDE)
    try:
      proc.send_signal(sig)
      out, err = proc.communicate(timeout=20)
    finally:
      proc.kill()
    assert proc.returncode == code, (proc.returncode, err)
    assert err == f"axtrain: {sig.name}: stopped before training began (exit {code})\n"
    assert out == ""


CAPTURED = OUTSIDE.replace("libc = ctypes.CDLL(None)\n", (
    "libc = ctypes.CDLL(None)\n"
    "import os, tempfile\n"
    "log = tempfile.TemporaryFile()\n"
    "os.dup2(log.fileno(), 2)  # captured, never read back\n"))


def test_the_line_reaches_the_stderr_the_process_started_with():
  """`axtrain plan` captures file descriptor 2 while it compiles (XLA's log) and reads the capture
  only afterwards: a stop during the compile still says its line where the user sees it."""
  assert CAPTURED != OUTSIDE
  proc = _start_script(CAPTURED)
  try:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
  finally:
    proc.kill()
  assert proc.returncode == 130, err
  assert err == "axtrain: SIGINT: stopped before training began (exit 130)\n", err


HELD = textwrap.dedent("""
    import sys, time
    from launcher.preemption import Interruptions
    interruptions = Interruptions().install()
    with interruptions.held():
      print("ready", flush=True)
      while interruptions._pending is None:  # the signal has been read
        time.sleep(0.01)
      print("written", flush=True)
    print("after the block", flush=True)
    sys.exit(3)
""")


def test_a_signal_waits_for_the_held_block_to_end():
  """The run directory's writes happen in held blocks: a signal during one stops the process as
  the block ends, never half-way through it."""
  proc = _start_script(HELD)
  try:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
  finally:
    proc.kill()
  assert proc.returncode == 130, (proc.returncode, err)
  assert out == "written\n" and err == "axtrain: SIGINT: stopped (exit 130)\n"


TAKEN_OVER = textwrap.dedent("""
    import signal, sys, time
    from launcher.preemption import Interruptions
    Interruptions().install()
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(1))  # as launch's supervisor does
    print("ready", flush=True)
    while not got:
      time.sleep(0.01)
    time.sleep(0.3)  # room for the interruption thread to act on the signal, which it must not
    print("handled", flush=True)
    sys.exit(0)
""")


def test_a_handler_that_takes_a_signal_over_gets_it_alone():
  """`axtrain launch --backend=local` installs its own SIGINT/SIGTERM handlers (pass them on to
  its processes, wait for their checkpoints): the process's interruption handling leaves those
  signals to it rather than ending launch at once, orphaning its processes."""
  proc = _start_script(TAKEN_OVER)
  try:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
  finally:
    proc.kill()
  assert proc.returncode == 0 and out == "handled\n" and err == "", (proc.returncode, out, err)


FINISHING = textwrap.dedent("""
    import sys
    from launcher.preemption import Interruptions
    interruptions = Interruptions().install()
    interruptions.finishing()
    print("ready", flush=True)
    sys.stdin.readline()
    sys.exit(0)
""")


def test_after_the_run_a_signal_changes_nothing():
  proc = _start_script(FINISHING)
  try:
    proc.send_signal(signal.SIGINT)
    while "the run is finishing" not in proc.stderr.readline():
      pass
    out, _ = proc.communicate("\n", timeout=20)
  finally:
    proc.kill()
  assert proc.returncode == 0 and out == ""


def _catches(pid: int, sig: signal.Signals) -> bool:
  """Whether process `pid` has a handler for `sig` (Linux /proc: SigCgt)."""
  for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
    if line.startswith("SigCgt:"):
      return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
  return False


def _axtrain(run_dir: pathlib.Path, env: dict | None = None) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "-m", "launcher", f"--config={ROOT / 'tests/testdata/ckpt_lm.py'}",
       f"--output_dir={run_dir}"], cwd=ROOT, env=env or dict(os.environ, JAX_PLATFORMS="cpu"),
      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(proc: subprocess.Popen, ready) -> None:
  while not ready():
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.01)


def test_sigint_while_modules_import(tmp_path):
  """Ctrl-C as soon as axtrain handles signals (SIGTERM caught: its handler is in), while it
  imports jax and the trainer: one line, exit 130, nothing written."""
  proc = _axtrain(tmp_path / "run")
  try:
    _wait_for(proc, lambda: _catches(proc.pid, signal.SIGTERM))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode == 130, (proc.returncode, err[-3000:])
  assert err == ("axtrain: SIGINT: stopped before training began; nothing is half-written: the "
                 "same command starts or resumes the run (exit 130)\n"), err[-3000:]
  assert out == "" and not (tmp_path / "run").exists()


def test_sigint_while_compiling_a_new_run(tmp_path):
  """Ctrl-C once the run directory is locked (its .lock holds the pid), while the steps compile
  (no compile cache: seconds): one line, exit 130, and the new directory is gone again."""
  run_dir = tmp_path / "run"
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  proc = _axtrain(run_dir, env=dict(env, JAX_PLATFORMS="cpu"))
  lock = run_dir / ".lock"
  try:
    _wait_for(proc, lambda: lock.exists() and lock.read_text().strip() == str(proc.pid))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 130, (proc.returncode, err[-3000:])
  assert err.endswith("before training began; nothing is half-written: the same command starts "
                      "or resumes the run (exit 130)\n"), err[-3000:]
  assert "Traceback" not in err and not run_dir.exists()
