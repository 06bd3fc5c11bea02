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
  """One JSON object per line; NaN/Inf are written as null."""

  def __init__(self, path: pathlib.Path, *, record: Record = no_record):
    self.path = pathlib.Path(path)
    record(self.path)
    self._file = open(self.path, "a", encoding="utf-8")

  def on_record(self, record: dict) -> None:
    self._file.write(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v)
                                     else v) for k, v in record.items()}) + "\n")
    self._file.flush()

  def on_train_end(self, loop) -> None:
    self._file.close()


class TensorBoardWriter(Callback):
  """Event files under <run_dir>/tensorboard/, written by tensorboardX (no TensorFlow).

  A resumed run starts a new event file that purges the steps it redoes, so
  TensorBoard shows each step once. Event file names carry the start step and the
  process id: tensorboardX names files by the second, and a resume within the same
  second would otherwise reopen (and truncate) the first run's file.
  """

  def __init__(self, directory: pathlib.Path, *, record: Record = no_record):
    self.directory = pathlib.Path(directory)
    self._new = NewFiles(self.directory, record)
    self._writer = None

  def on_train_start(self, loop) -> None:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    self._new.start()
    self._writer = SummaryWriter(logdir=str(self.directory), flush_secs=10,
                                 purge_step=loop.start + 1 if loop.start else None,
                                 filename_suffix=f".{os.getpid()}.from{loop.start}")
    self._new.done()  # the event file, created with the writer

  def on_record(self, record: dict) -> None:
    for key, value in scalars(record).items():
      self._writer.add_scalar(key, value, global_step=record["step"])

  def on_train_end(self, loop) -> None:
    if self._writer is not None:
      self._writer.close()
      self._new.done()


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
