"""Where metrics records go: metrics.jsonl, TensorBoard event files, Weights & Biases.

Each writer is a loop callback (trainer/callbacks.py) that takes every record in
`on_record` and closes in `on_train_end`. `for_run` gives the writers of a run
directory; only process 0 writes. Each file a writer creates goes to its `record`
callback (the run's manifest, trainer/run_files.py) as it is created.
"""

from __future__ import annotations

import json
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


class JsonlWriter(Callback):
  """One JSON object per line; NaN/Inf are written as null. A line the disk has no room for is
  not left half-written (disk.AppendFile): the run stops with NoSpace."""

  def __init__(self, path: pathlib.Path, *, record: Record = no_record):
    self.path = pathlib.Path(path)
    record(self.path)
    self._file = disk.AppendFile(self.path)

  def on_record(self, record: dict) -> None:
    self._file.append((json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v)
                                       else v) for k, v in record.items()}) + "\n").encode())

  def on_train_end(self, loop) -> None:
    self._file.close()


def _framed(event) -> bytes:
  """One record of a TensorBoard event file: length, its checksum, the event, its checksum."""
  from tensorboardX.record_writer import masked_crc32c  # pylint: disable=import-outside-toplevel
  data = event.SerializeToString()
  header = struct.pack("<Q", len(data))
  return (header + struct.pack("<I", masked_crc32c(header)) + data
          + struct.pack("<I", masked_crc32c(data)))


class TensorBoardWriter(Callback):
  """Event files under <run_dir>/tensorboard/ (tensorboardX's event protos, no TensorFlow),
  written in this thread: each metrics record's scalars are appended at once as whole records
  (disk.AppendFile), so a full disk stops the run with NoSpace rather than a writer thread's
  traceback, and leaves no half record.

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
    from tensorboardX.proto.event_pb2 import Event, SessionLog  # pylint: disable=import-outside-toplevel
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
    from tensorboardX.proto.event_pb2 import Event  # pylint: disable=import-outside-toplevel
    from tensorboardX.summary import scalar  # pylint: disable=import-outside-toplevel
    now = time.time()
    self._file.append(b"".join(
        _framed(Event(wall_time=now, step=record["step"], summary=scalar(key, value)))
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
            config: dict | None = None, record: Record = no_record) -> list[Callback]:
  """The writers of a run directory (none without one, or off process 0); `record` receives
  each file they create."""
  if run_dir is None or not main_process:
    return []
  run_dir = pathlib.Path(run_dir)
  out: list[Callback] = [JsonlWriter(run_dir / "metrics.jsonl", record=record),
                         TensorBoardWriter(run_dir / "tensorboard", record=record)]
  if cfg.wandb_project:
    out.append(WandbWriter(cfg.wandb_project, run_dir, config, record=record))
  return out
