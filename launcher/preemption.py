"""SIGTERM / SIGINT: finish the step in flight, checkpoint, exit EXIT_PREEMPTED.

Outside the training loop (`Interruptions`, installed for the whole process by the command-line
entry point): before training a signal stops the process at once with one line, exit
EXIT_INTERRUPTED for SIGINT (Ctrl-C) and EXIT_PREEMPTED for SIGTERM, except inside `held()`
blocks (the run directory's writes), which it lets finish first; after training (`finishing`)
the run's files are complete and a signal changes nothing. There is no step to save before
training, and nothing to stop half-way: the process ends without unwinding, which a signal
delivered as an exception (KeyboardInterrupt) cannot promise (raised in a garbage-collector
callback or a C extension's import, it is swallowed or turned into another error).

In the training loop (`Preemption`) the first signal only sets a flag that the training loop
polls after each step. A second signal exits at once (still EXIT_PREEMPTED): a save in flight
is abandoned in its temporary directory, so the last committed checkpoint is
untouched and the run resumes from it.

Signals are counted by a thread that reads Python's signal wakeup fd, one byte
per delivery. Python runs its own handlers only when the main thread returns
to the interpreter, and two signals that arrive while it waits in a device
computation or a checkpoint write run the handler once; the wakeup fd sees both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable

# EX_TEMPFAIL from sysexits.h: "temporary failure, the user is invited to retry".
# A scheduler should re-queue the same command, which resumes from the checkpoint.
EXIT_PREEMPTED = 75
# 128 + SIGINT, what a shell reports for a command that Ctrl-C ended: SIGINT outside the training
# loop, where no step is in flight to save.
EXIT_INTERRUPTED = 130

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STOP = 0  # written by installed() on exit to end the reader thread; no signal has number 0


def _wakeups(fd: int):
  """The signal numbers that Python's wakeup fd (`signal.set_wakeup_fd`) writes to pipe `fd`,
  as they come, until _STOP."""
  while True:
    try:
      data = os.read(fd, 64)
    except InterruptedError:
      continue
    for signum in data:
      if signum == _STOP:
        return
      yield signum


def _say(line: str) -> None:
  """One stderr line in one write: this runs on the signal-reading thread, and `print` writes
  the text and its newline separately, so the loop's own line could land between them."""
  sys.stderr.write(line + "\n")
  sys.stderr.flush()


class Preemption:
  """`signals`: the signals this handles (a multi-process run leaves SIGTERM to JAX's preemption
  service, launcher/distributed.py); `on_first(signum)` runs after the first one's message;
  `on_second()` before the second one's exit, which says what it returns (where the run will
  resume) or that the last committed checkpoint is kept."""

  def __init__(self, *, on_second: Callable[[], str | None] = lambda: None,
               signals: tuple[int, ...] = _SIGNALS,
               on_first: Callable[[int], None] = lambda signum: None):
    self.signum: int | None = None
    self._on_second = on_second
    self._signals = tuple(signals)
    self._on_first = on_first

  def requested(self) -> bool:
    return self.signum is not None

  def received(self, signum: int) -> None:
    """One delivery of `signum`: the first requests a stop, the second exits the process."""
    name = signal.Signals(signum).name
    if self.signum is None:
      self.signum = signum
      _say(f"axtrain: {name}: finishing the current step and saving a checkpoint "
           f"(send it again to exit at once)")
      self._on_first(signum)
      return
    said = None
    try:
      said = self._on_second()
    finally:
      _say(f"axtrain: second {name}: exiting now; "
           f"{said or 'the last committed checkpoint is kept'}")
      os._exit(EXIT_PREEMPTED)  # pylint: disable=protected-access

  def _read(self, fd: int) -> None:
    for signum in _wakeups(fd):
      if signum in self._signals:
        self.received(signum)

  @contextlib.contextmanager
  def installed(self):
    """Counts SIGTERM/SIGINT while the block runs (main thread only); restores everything after."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    # The Python-level handler only keeps the default action (KeyboardInterrupt, exit) away.
    previous = {s: signal.signal(s, lambda *_: None) for s in self._signals}
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    reader = threading.Thread(target=self._read, args=(read_fd,), name="axtrain-signals",
                              daemon=True)
    reader.start()
    try:
      yield self
    finally:
      signal.set_wakeup_fd(previous_fd)
      for s, handler in previous.items():
        signal.signal(s, handler)
      os.write(write_fd, bytes([_STOP]))
      reader.join()
      os.close(read_fd)
      os.close(write_fd)


class Interruptions:
  """SIGINT/SIGTERM of a whole axtrain process outside the training loop (which installs
  Preemption over it, and puts it back after).

  A signal ends the process at once, from a thread that reads the signal wakeup fd (so also
  while the main thread compiles or waits in native code): one line, exit EXIT_INTERRUPTED for
  SIGINT and EXIT_PREEMPTED for SIGTERM. Inside `held()` blocks it waits for the outermost one
  to end. After `finishing()` it only says that the run is finishing. A signal whose handler
  another part of the process installed over this one (launch's supervisor) is left to it.
  `what` (set by the caller) ends the line: what the stop left on disk.
  """

  def __init__(self, *, what: str = ""):
    self.what = what
    self._lock = threading.Lock()  # taken to enter or leave a held block, and to exit
    self._held = 0
    self._pending: int | None = None
    self._finishing = False
    # What `_exit` undoes first, newest first, each with what the stop line then says of it.
    self._undo: list[tuple[Callable[[], None], str]] = []
    self._stderr = 2  # install() makes it a copy of the process's stderr

  def _exit(self, signum: int) -> None:
    """Ends the process (called with the lock held, outside held blocks)."""
    code = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED
    for undo, _ in reversed(self._undo):
      with contextlib.suppress(Exception):
        undo()
    for stream in (sys.stdout, sys.stderr):
      with contextlib.suppress(Exception):
        stream.flush()
    # To the stderr the process started with: fd 2 may be captured for a while (a compile's
    # log, planner/plan.py), and that capture ends unread.
    said = "".join(text for _, text in self._undo)
    line = f"axtrain: {signal.Signals(signum).name}: stopped{self.what}{said} (exit {code})\n"
    with contextlib.suppress(OSError):
      os.write(self._stderr, line.encode())
    os._exit(code)  # pylint: disable=protected-access

  def received(self, signum: int) -> None:
    if signal.getsignal(signum) is not self._keep_default_away:
      return  # another handler took this signal over (launch's supervisor): it is theirs
    with self._lock:
      if self._finishing:
        print(f"axtrain: {signal.Signals(signum).name}: the run is finishing; its files are "
              f"complete", file=sys.stderr, flush=True)
      elif self._held:
        self._pending = self._pending or signum
      else:
        self._exit(signum)

  def _read(self, fd: int) -> None:
    for signum in _wakeups(fd):
      if signum in _SIGNALS:
        self.received(signum)

  @staticmethod
  def _keep_default_away(signum, frame) -> None:
    """The Python-level handler: keeps the default action (KeyboardInterrupt, exit) away; the
    thread acts on the signal while this is the handler, not once another replaced it."""
    del signum, frame

  def install(self) -> Interruptions:
    """Installs the handling for the rest of the process (from the main thread)."""
    global _installed  # pylint: disable=global-statement
    self._stderr = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for s in _SIGNALS:
      signal.signal(s, self._keep_default_away)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=self._read, args=(read_fd,), name="axtrain-interruptions",
                     daemon=True).start()
    _installed = self
    return self

  @contextlib.contextmanager
  def held(self):
    with self._lock:
      self._held += 1
    try:
      yield
    finally:
      with self._lock:
        self._held -= 1
        if not self._held and self._pending is not None and not self._finishing:
          self._exit(self._pending)

  @contextlib.contextmanager
  def undone_on_stop(self, undo: Callable[[], None], said: str = ""):
    """While the block runs, a stop first calls `undo` (e.g. put back a lock file), and its
    line ends with `said` (what the undo did: `; removed its partial output DIR.partial`)."""
    entry = (undo, said)
    with self._lock:
      self._undo.append(entry)
    try:
      yield
    finally:
      with self._lock:
        self._undo.remove(entry)

  def finishing(self) -> None:
    with self._lock:
      self._finishing = True


_installed: Interruptions | None = None  # by the command-line entry point (launcher/main.py:run)


def held():
  """A block that SIGINT/SIGTERM does not stop half-way (writes of the run directory): a signal
  that arrives in it ends the process as the block ends. Nothing where no Interruptions are
  installed (axtrain called in-process, as tests do)."""
  return _installed.held() if _installed is not None else contextlib.nullcontext()


def undone_on_stop(undo: Callable[[], None], said: str = ""):
  """A block in which a stop before training first calls `undo` (Interruptions.undone_on_stop)."""
  if _installed is None:
    return contextlib.nullcontext()
  return _installed.undone_on_stop(undo, said)


def finishing() -> None:
  """The run is over (completed, stopped, failed) and its files complete: later signals change
  nothing."""
  if _installed is not None:
    _installed.finishing()
