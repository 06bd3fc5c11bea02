"""What a data source provides to the trainer.

A source is built with `DATA.build(cfg, vocab_size=..., seed=...)` and gives
per-process slices of each global batch as numpy arrays:

  inputs   int32 [B/P, L]   token ids
  targets  int32 [B/P, L]   next-token ids
  weights  float32 [B/P, L] 1 where the target counts in the loss, 0 for padding

and, from sources that pack documents into rows (trainer/data/packing.py), positions and
segment_ids; where B is the global batch, P the number of JAX processes. Each source
declares the arrays its batches hold (`Source.fields`): `axtrain plan` compiles the step for
them (planner/plan.py:abstract_inputs). The order is a
function of the seed and the step alone, and `DataIterator.get_state()` is
JSON-able so that a checkpoint can hold it.
"""

from __future__ import annotations

import abc
import pathlib
from collections.abc import Iterator

import numpy as np

from core.registry import ConfigError, Registry

DATA = Registry("data")

Batch = dict[str, np.ndarray]

# The arrays of a batch by name, with their dtypes; each is [rows, seq_len].
TOKEN_FIELDS = {"inputs": np.dtype(np.int32), "targets": np.dtype(np.int32),
                "weights": np.dtype(np.float32)}


class DataIterator(abc.ABC, Iterator[Batch]):
  """An iterator over a process's slices of the global batches, with resumable state."""

  @abc.abstractmethod
  def get_state(self) -> dict: ...

  @abc.abstractmethod
  def set_state(self, state: dict) -> None: ...


class Source(abc.ABC):
  vocab_size: int  # ids the source emits are < vocab_size
  batch_size: int  # global batch (sequences)
  seq_len: int  # tokens per sequence

  @abc.abstractmethod
  def train_iterator(self, *, process_index: int, process_count: int) -> DataIterator: ...

  def fields(self) -> dict[str, np.dtype]:
    """The arrays of every batch it yields, train and eval, by name with their dtypes (each
    [rows, seq_len]): what the step is compiled for."""
    return dict(TOKEN_FIELDS)

  @abc.abstractmethod
  def eval_batches(self, *, batch_size: int, num_batches: int, process_index: int,
                   process_count: int) -> list[Batch]:
    """Held-out batches (the same every call)."""

  def metrics(self) -> dict:
    """Counters for the metrics records (e.g. documents skipped as bad input)."""
    return {}

  @classmethod
  def example(cls, directory: pathlib.Path) -> dict:
    """A small working node of this kind: its fields besides `kind`, `seq_len` and
    `batch_size`, with any files they name written under `directory` (which exists). The tests
    enumerate the registry and run every kind on its example (tests/test_data_model.py: its
    batches are the planned ones; tests/test_kinds_cli.py: it trains through the CLI), so a
    new kind is tested without a list to extend; a kind that reads nothing (synthetic, stdlib)
    keeps this default, no field."""
    del directory
    return {}


def local_rows(batch_size: int, *, process_index: int, process_count: int,
               what: str = "data.batch_size") -> slice:
  """This process's rows p * B/P ... (p + 1) * B/P - 1 of a global batch of B rows."""
  if batch_size <= 0 or batch_size % process_count:
    raise ConfigError(f"{what} {batch_size} must be positive and divisible by the "
                      f"{process_count} JAX processes")
  local = batch_size // process_count
  return slice(process_index * local, (process_index + 1) * local)


class StepIndexedIterator(DataIterator):
  """Batches that are a pure function of the step: state is the next step.

  `stream` (JSON-able) describes what the step indexes (corpus size, shapes, seed);
  a saved state whose stream differs is refused, since its steps would mean other data.
  """

  def __init__(self, batch_at, step: int = 0, *, stream: dict | None = None):
    self._batch_at = batch_at
    self.step = step
    self.stream = stream

  def __next__(self) -> Batch:
    batch = self._batch_at(self.step)
    self.step += 1
    return batch

  def get_state(self) -> dict:
    return {"step": self.step} if self.stream is None else {"step": self.step,
                                                             "stream": self.stream}

  def set_state(self, state: dict) -> None:
    saved = state.get("stream")
    if saved is not None and self.stream is not None and saved != self.stream:
      diff = sorted(k for k in set(saved) | set(self.stream) if saved.get(k) != self.stream.get(k))
      raise ConfigError(
          "the checkpoint's data stream differs from this run's ("
          + ", ".join(f"{k}: {saved.get(k)!r} then, {self.stream.get(k)!r} now" for k in diff)
          + "); resume with the same data, tokenizer, seq_len, batch_size and seed")
    self.step = int(state["step"])


def process_rows(step: int, *, batch_size: int, process_index: int, process_count: int,
                 what: str = "data.batch_size") -> np.ndarray:
  """Stream row indices of this process's slice of the batch at `step`."""
  rows = local_rows(batch_size, process_index=process_index, process_count=process_count,
                    what=what)
  return step * batch_size + np.arange(rows.start, rows.stop)
