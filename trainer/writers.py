"""Where metrics records go: metrics.jsonl, TensorBoard event files, Weights & Biases.

Each writer is a loop callback (trainer/callbacks.py) that takes every record in
`on_record` and closes in `on_train_end`. `for_run` gives the writers of a run
directory; only process 0 writes. Each file a writer creates goes to its `record`
callback (the run's manifest, trainer/run_files.py) as it is created.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import socket
import struct
import time

from trainer import disk
from trainer.callbacks import Callback
from trainer.config import TrainerConfig
from trainer.run_files import NewFiles, Record, no_record

def plain(record: dict) -> dict:
  """Numbers as Python floats, ints and strings kept (what every writer receives)."""
  return {k: (v if isinstance(v, (int, str)) and not isinstance(v, bool) else float(v))
          for k, v in record.items()}


def scalars(record: dict) -> dict[str, float]:
  """The finite numeric values of a record, without its step."""
  return {k: float(v) for k, v in record.items()
          if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


CUT = ".cut"  # metrics.jsonl.cut: the lines cut off by runs that stopped while writing them


def _last_line_start(f, size: int) -> int:
  """The offset just past the last newline of the open file `f` of `size` bytes (0: none)."""
  end = size
  while end > 0:
    start = max(0, end - 65536)
    f.seek(start)
    found = f.read(end - start).rfind(b"\n")
    if found >= 0:
      return start + found + 1
    end = start
  return 0


def end_last_line(path: pathlib.Path, *, record: Record = no_record,
                  warn=logging.warning) -> None:
  """Makes `path` (a JSON-lines file) end with a newline, so the next record starts a line.

  A last line that is a whole JSON object only lacks its newline, which is added. Anything
  else there is a line cut off by a run killed while writing it (`{"step": 45, "lo`): it is
  moved, with a warning, to `<path>.cut` (appended there, a line each), which `record` receives.
  """
  try:
    size = path.stat().st_size
  except FileNotFoundError:
    return
  with open(path, "rb") as f:
    f.seek(max(0, size - 1))
    if size == 0 or f.read(1) == b"\n":
      return
    start = _last_line_start(f, size)
    f.seek(start)
    tail = f.read(size - start)
  try:
    whole = isinstance(json.loads(tail), dict)
  except ValueError:
    whole = False
  if whole:
    _append(path, b"\n")
    return
  aside = path.with_name(path.name + CUT)
  record(aside)
  _append(aside, tail + b"\n")  # kept before it leaves the file: a crash now loses nothing
  os.truncate(path, start)
  shown = tail[:40].decode("utf-8", "replace") + ("..." if len(tail) > 40 else "")
  warn(f"{path} ended in a line cut off by a run that stopped while writing it "
       f"({size - start} bytes: {shown}); moved it to {aside}, and new records start on a "
       f"line of their own")


def _append(path: pathlib.Path, data: bytes) -> None:
  file = disk.AppendFile(path)
  try:
    file.append(data)
  finally:
    file.close()


class JsonlWriter(Callback):
  """One JSON object per line; NaN/Inf are written as null. A line the disk has no room for is
  not left half-written (disk.AppendFile): the run stops with NoSpace. A file that does not end
  with a newline (a run killed while writing) first gets one, its cut-off line set aside
  (`end_last_line`), so a record never continues another's line."""

  def __init__(self, path: pathlib.Path, *, record: Record = no_record, warn=logging.warning):
    self.path = pathlib.Path(path)
    record(self.path)
    end_last_line(self.path, record=record, warn=warn)
    self._file = disk.AppendFile(self.path)

  def on_record(self, record: dict) -> None:
    self._file.append((json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v)
                                       else v) for k, v in record.items()}) + "\n").encode())

  def on_train_end(self, loop) -> None:
    self._file.close()


def _framed(event) -> bytes:
  """One record of a TensorBoard event file: length, its checksum, the event, its checksum."""
  # pylint: disable-next=import-outside-toplevel
  from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
  data = event.SerializeToString()
  header = struct.pack("<Q", len(data))
  return (header + struct.pack("<I", masked_crc32c(header)) + data
          + struct.pack("<I", masked_crc32c(data)))


class TensorBoardWriter(Callback):
  """Event files under <run_dir>/tensorboard/ (TensorBoard's own event protos and checksum, no
  TensorFlow; tensorboardX's import also imports torch where it is installed, 1.85 s of every
  start on this repo's CPU machine), written in this thread: each metrics record's scalars are
  appended at once as whole records (disk.AppendFile), so a full disk stops the run with NoSpace
  rather than a writer thread's traceback, and leaves no half record.

  A resumed run starts a new event file that purges the steps it redoes (a SessionLog START at
  its first step), so TensorBoard shows each step once. Event file names carry the start step
  and the process id besides the second, so a resume within the same second gets a file of its
  own.
  """

  def __init__(self, directory: pathlib.Path, *, record: Record = no_record):
    self.directory = pathlib.Path(directory)
    self._record = record
    self._file: disk.AppendFile | None = None

  def on_train_start(self, loop) -> None:
    # pylint: disable-next=import-outside-toplevel
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    self.directory.mkdir(parents=True, exist_ok=True)
    path = self.directory / (f"events.out.tfevents.{str(time.time())[:10]}."
                             f"{socket.gethostname()}.{os.getpid()}.from{loop.start}")
    self._record(path)
    self._file = disk.AppendFile(path)
    events = [Event(wall_time=time.time(), file_version="brain.Event:2")]
    if loop.start:
      events += [Event(step=loop.start + 1, file_version="brain.Event:2"),
                 Event(step=loop.start + 1, session_log=SessionLog(status=SessionLog.START))]
    self._file.append(b"".join(map(_framed, events)))

  def on_record(self, record: dict) -> None:
    # pylint: disable-next=import-outside-toplevel
    from tensorboard.compat.proto.event_pb2 import Event
    # pylint: disable-next=import-outside-toplevel
    from tensorboard.compat.proto.summary_pb2 import Summary
    now = time.time()
    self._file.append(b"".join(
        _framed(Event(wall_time=now, step=record["step"],
                      summary=Summary(value=[Summary.Value(tag=key, simple_value=value)])))
        for key, value in scalars(record).items()))

  def on_train_end(self, loop) -> None:
    if self._file is not None:
      self._file.close()


class WandbWriter(Callback):
  """A Weights & Biases run named after the run directory (`trainer.wandb_project`)."""

  def __init__(self, project: str, run_dir: pathlib.Path, config: dict | None, *,
               record: Record = no_record):
    import wandb  # pylint: disable=import-outside-toplevel  (TrainerConfig.check: installed)
    self._new = NewFiles(pathlib.Path(run_dir) / "wandb", record)
    self._new.start()
    self._run = wandb.init(project=project, name=str(run_dir), dir=str(run_dir), config=config,
                           resume="allow")
    self._new.done()

  def on_record(self, record: dict) -> None:
    self._run.log(scalars(record), step=record["step"])

  def on_train_end(self, loop) -> None:
    self._run.finish()
    self._new.done()  # what wandb wrote while the run went on


def for_run(run_dir: pathlib.Path | None, cfg: TrainerConfig, *, main_process: bool,
            config: dict | None = None, record: Record = no_record,
            warn=logging.warning) -> list[Callback]:
  """The writers of a run directory (none without one, or off process 0); `record` receives
  each file they create, `warn` a line for what they set aside."""
  if run_dir is None or not main_process:
    return []
  run_dir = pathlib.Path(run_dir)
  out: list[Callback] = [JsonlWriter(run_dir / "metrics.jsonl", record=record, warn=warn),
                         TensorBoardWriter(run_dir / "tensorboard", record=record)]
  if cfg.wandb_project:
    out.append(WandbWriter(cfg.wandb_project, run_dir, config, record=record))
  return out
