"""Orbax checkpoints of a run: `<run_dir>/checkpoints/<step>/{state,data}`.

    state  the TrainState pytree (step, params, opt_state): Orbax's `_METADATA`
           (the tree) and an OCDBT database (`manifest.ocdbt`, `d/` and
           `ocdbt.process_<i>/` files) holding one zarr array per leaf
    data   the data iterator's get_state() as JSON (`data/metadata`)

Saves are asynchronous: `save` returns once the arrays are copied off the devices and the
write finishes in a background thread; a state in host memory is saved synchronously, a batch at
a time (trainer/checkpoint_bounded.py). A step directory appears under its final name only when
Orbax has committed it (atomic rename of a temporary directory), so a process killed at any
moment leaves the committed checkpoints intact. Old checkpoints are garbage-collected after a
newer one commits: the latest `keep` stay, plus every step divisible by `keep_every_steps`.

Every read starts with `trainer/checkpoint_files.py:check_step`, which reads only metadata,
so that a damaged checkpoint is refused before Orbax starts reads it could not finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import pathlib
import shutil
import sys
import time
import traceback
import types
import warnings
from typing import Any, Callable

import flax.linen as nn
import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from core.registry import ConfigError
from trainer import checkpoint_layout, disk
from trainer.checkpoint_bounded import Transfers, handlers
from trainer.checkpoint_files import (DATA, STATE, CheckpointError, GatedCommit, check_step,
                                      committed_steps, move_aside, steps_holding, strays)
from trainer.config import CheckpointConfig
from trainer.run_files import Record, no_record

# Where a failed save's errors are logged: Orbax's threads (absl.logging), and asyncio's "Task
# exception was never retrieved" for the writes that failed after their gather gave up.
_LOGS = (logging.getLogger("absl"), logging.getLogger("asyncio"))
# Checkpoints taken out of use are moved next to checkpoints/ rather than deleted:
QUARANTINE = "corrupt_checkpoints"  # unreadable ones
SUPERSEDED = "superseded_checkpoints"  # newer than checkpoint.restore_step when resuming from it


class NoUsableCheckpoint(CheckpointError):
  """Checkpoints exist and none reads back; the caller says how to start the run over."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Restored:
  step: int
  state: Any
  data_state: dict


# -- reads ---------------------------------------------------------------------------------

def _nbytes(state) -> int:
  """Bytes of the arrays of `state`, every process's shards (a jax.Array's nbytes is global)."""
  return sum(int(getattr(leaf, "nbytes", 0)) for leaf in jax.tree.leaves(state))


def _with_shardings(abstract, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, shardings)


def _settle(dropped: list, *, quiet_s: float, max_s: float) -> None:
  """Collects garbage until no report was dropped for `quiet_s` seconds, or `max_s` passed."""
  start = last_change = time.monotonic()
  seen = len(dropped)
  while time.monotonic() - start < max_s and time.monotonic() - last_change < quiet_s:
    gc.collect()
    time.sleep(0.02)
    if len(dropped) != seen:
      seen, last_change = len(dropped), time.monotonic()


@contextlib.contextmanager
def _one_read(*, quiet_s: float = 1.0, max_s: float = 10.0, filter_warnings: bool = True):
  """Confines to one Orbax read what it leaves behind when a read fails after check_step passed.

  Orbax then closes its event loop while TensorStore reads are still in
  flight; they report late ("Event loop is closed", coroutines closed or never
  awaited, "exception was never retrieved"), tracebacks that would garble the
  one-line warning. Inside this block those reports are dropped. On a failure
  the frames of the failed read are cleared and the block waits, collecting,
  until the abandoned reads have been quiet for `quiet_s` (at most `max_s`);
  then it raises CheckpointError(reason). On exit sys.unraisablehook, the
  asyncio logger's filters and warnings.filters are what they were before.
  A read still in flight after that window (seen on a loaded CPU) can report
  once more, unfiltered; check_step keeps truncated and missing files, the
  usual damage, from ever reaching this path. `filter_warnings=False` leaves
  the process's warnings filters alone (a read in a thread beside the compile).
  """
  dropped: list[str] = []  # one entry per report dropped
  previous_hook = sys.unraisablehook
  asyncio_logger = logging.getLogger("asyncio")
  never_retrieved = logging.Filter()

  def keep(record) -> bool:
    if str(record.msg).partition("\n")[0].endswith(" exception was never retrieved"):
      dropped.append("never retrieved")
      return False
    return True

  never_retrieved.filter = keep

  def hook(unraisable):
    exc = unraisable.exc_value
    loop_closed = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
    # A suspended read collected by the GC is closed with GeneratorExit, which Orbax's
    # `except BaseException` turns into an Exception: "Exception ignored in: <coroutine ...>".
    closed_read = (isinstance(unraisable.object, types.CoroutineType) and exc is not None
                   and isinstance(exc.__cause__ or exc.__context__, GeneratorExit))
    if loop_closed or closed_read:
      dropped.append(type(exc).__name__)  # a name: keeping the report would keep the read alive
    else:
      previous_hook(unraisable)

  sys.unraisablehook = hook
  asyncio_logger.addFilter(never_retrieved)
  try:
    with warnings.catch_warnings() if filter_warnings else contextlib.nullcontext():
      if filter_warnings:
        warnings.filterwarnings("ignore", message="coroutine .* was never awaited",
                                category=RuntimeWarning)
      try:
        yield
      except Exception as e:  # pylint: disable=broad-except  (any read failure means unusable)
        reason = _reason(e)
        while e is not None:  # the finished frames of the read hold the abandoned reads
          traceback.clear_frames(e.__traceback__)
          e = e.__cause__ or e.__context__
        _settle(dropped, quiet_s=quiet_s, max_s=max_s)
        raise CheckpointError(reason) from None
  finally:
    asyncio_logger.removeFilter(never_retrieved)
    sys.unraisablehook = previous_hook


def _reason(e: Exception) -> str:
  """One clause for a warning: the innermost cause's message, without object reprs."""
  if isinstance(e, CheckpointError):
    return str(e)
  while (e.__cause__ or e.__context__) is not None:
    e = e.__cause__ or e.__context__
  text = " ".join(str(e).split()).split("<")[0].rstrip(" :;,([{")  # e.g. `<bound method ...>`
  return f"a read failed: {text[:240]}" if text else f"a read failed ({type(e).__name__})"


class _SaveReports:
  """What a save that fails part-way leaves behind, kept out of the console while it is written.

  Orbax writes a checkpoint's arrays in a background thread, one asyncio task per fragment
  under one gather; when one write fails (a full disk) the gather raises, Orbax closes its event
  loop and logs the error from each of its threads, and the other writes, still in flight,
  report "Event loop is closed" as they finish; their coroutines, collected at interpreter exit,
  add "Exception ignored in: <coroutine ... write_fragment>" tracebacks, and asyncio logs "Task
  exception was never retrieved" for each write that failed after the gather gave up. Between
  `start` (a save begins) and `stop` (the save finished, or its failure was read) those reports
  are dropped: log records (Orbax's, asyncio's) whose exception is a write without room (the
  launcher prints its one line instead) and the closed loop's unraisable reports.
  `stop(failed=True)` clears the failed write's frames and collects the abandoned writes while
  the interpreter still runs (they close quietly then), until they have been quiet for
  `quiet_s`. Everything is put back at `stop`.
  """

  def __init__(self, *, quiet_s: float = 1.0, max_s: float = 10.0):
    self.quiet_s, self.max_s = quiet_s, max_s
    self._dropped: list[str] = []
    self._previous_hook = None
    self._filter = logging.Filter()
    self._filter.filter = self._keep

  def _keep(self, record) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and disk.no_room(error):
      self._dropped.append("log")
      return False
    # Orbax's count of our own wait for the save before (its time is in the run's records).
    return not str(record.msg).startswith("Waiting for previous save to complete took")

  def _hook(self, unraisable) -> None:
    exc = unraisable.exc_value
    loop_closed = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
    closed_write = (isinstance(unraisable.object, types.CoroutineType) and exc is not None
                    and isinstance(exc.__cause__ or exc.__context__, GeneratorExit))
    if loop_closed or closed_write:
      self._dropped.append(type(exc).__name__)
    else:
      self._previous_hook(unraisable)

  def start(self) -> None:
    if self._previous_hook is None:
      self._previous_hook = sys.unraisablehook
      sys.unraisablehook = self._hook
      for logger in _LOGS:
        logger.addFilter(self._filter)

  def stop(self, failure: BaseException | None = None) -> None:
    if self._previous_hook is None:
      return
    if failure is not None:
      while failure is not None:  # the finished frames of the failed save hold the other writes
        traceback.clear_frames(failure.__traceback__)
        failure = failure.__cause__ or failure.__context__
      _settle(self._dropped, quiet_s=self.quiet_s, max_s=self.max_s)
    for logger in _LOGS:
      logger.removeFilter(self._filter)
    sys.unraisablehook, self._previous_hook = self._previous_hook, None


class Checkpointer:
  """Saves and restores one run's checkpoints; every process of a run makes one."""

  def __init__(self, directory: pathlib.Path | str, cfg: CheckpointConfig, *,
               record: Record = no_record):
    """`record` receives each checkpoint moved out of `directory` (the run's manifest,
    trainer/run_files.py): a damaged one may no longer show it is Orbax's."""
    self.directory = pathlib.Path(directory).absolute()
    self.cfg = cfg
    self._record = record
    keep = [policies.LatestN(n=cfg.keep)]
    if cfg.keep_every_steps:
      keep.append(policies.EveryNSteps(interval_steps=cfg.keep_every_steps))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy(keep),
        enable_async_checkpointing=True,
        # Temporary directories of saves cut short by a crash are never committed steps.
        cleanup_tmp_directories=True,
        temporary_path_class=GatedCommit,  # commits under a lock (final_committed_steps)
    )
    self._transfers = Transfers()
    self._manager = ocp.CheckpointManager(
        self.directory, options=options,
        handler_registry=handlers(self._transfers, compression=cfg.compression))
    self._moves = 0
    self._in_flight: tuple[int, int] | None = None  # (step, bytes needed) of the save in flight
    self._reports = _SaveReports()

  def due(self, step: int) -> bool:
    """Whether the schedule (checkpoint.every_steps) asks for a checkpoint after `step`."""
    return bool(self.cfg.every_steps) and step % self.cfg.every_steps == 0

  def save(self, step: int, state, data_state: dict) -> bool:
    """Starts an asynchronous save of `step`; False if that step is already on disk.

    The caller decides when to save (`due`, the last step, a preemption). Waits for the save
    before it first. A state in host memory is saved a batch at a time, when this returns
    (checkpoint_bounded.py). Raises disk.NoSpace, starting nothing, when the disk holding the
    checkpoints has less room than the state's arrays take (the most a checkpoint needs: Orbax
    compresses), and when the disk filled during the save before (wait_until_finished)."""
    if step in self.all_steps():
      return False
    self.wait_until_finished()
    needed = _nbytes(state) + len(json.dumps(data_state))
    disk.check_room(self.directory / str(step), needed)
    self._in_flight = (step, needed)
    self._reports.start()
    self._transfers.bound(state)
    try:
      try:
        self._manager.save(step, force=True, args=ocp.args.Composite(**{
            STATE: ocp.args.StandardSave(state), DATA: ocp.args.JsonSave(data_state)}))
      except Exception as e:  # pylint: disable=broad-except  (read by _failed)
        raise self._failed(e) from None
      if self._transfers.bounded:
        self.wait_until_finished()
    finally:
      self._transfers.finish()
    return True

  def all_steps(self) -> list[int]:
    """Committed steps, oldest first (plus the one whose save is in flight, if any)."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, step: int, abstract_state, shardings) -> Restored:
    """Exactly `step`, its state placed in `shardings`; CheckpointError if it does not read.

    The shardings are the current mesh's: a checkpoint written on another mesh
    or device count is resharded while reading.
    """
    check_step(self.directory / str(step))
    return _read(step, abstract_state, shardings,
                 lambda args: self._manager.restore(step, args=args))

  def restore_newest(self, abstract_state, shardings, *, at_most: int | None = None,
                     warn: Callable[[str], None] = logging.warning) -> Restored | None:
    """The newest committed step (at or before `at_most`) that reads back; None if none exist.

    A checkpoint that fails check_step or its read (and first, by process 0, any step-named
    entry that is no folder, which Orbax lists on no process: checkpoint_files.strays) is
    reported through `warn` in one line, moved to `<run_dir>/corrupt_checkpoints/` (so its
    step can be written again) and the next older one is tried. Raises CheckpointError when
    checkpoints exist but none reads back, or `at_most` is not a committed step."""
    for stray, what in (strays(self.directory) if jax.process_index() == 0 else {}).items():
      self._record(moved := move_aside(stray, self.directory.parent / QUARANTINE))
      warn(f"checkpoint {stray} is unreadable ({what}); moved it to {moved}")
    steps = self.all_steps()
    if at_most is not None:
      if at_most not in steps:
        raise CheckpointError(f"checkpoint.restore_step={at_most} is not a committed checkpoint "
                              f"in {self.directory} (committed: {steps or 'none'})")
      steps = [s for s in steps if s <= at_most]
    unreadable = []
    for candidate in reversed(steps):
      try:
        return self.restore(candidate, abstract_state, shardings)
      except Exception as e:  # pylint: disable=broad-except  (any read failure means unusable)
        moved = self._move(candidate, QUARANTINE)
        older = [s for s in steps if s < candidate]
        warn(f"checkpoint {self.directory / str(candidate)} is unreadable ({_reason(e)}); "
             f"moved it to {moved}; "
             f"{f'falling back to step {older[-1]}' if older else 'no older checkpoint'}")
        unreadable.append(candidate)
    if unreadable:
      raise NoUsableCheckpoint(
          f"no usable checkpoint in {self.directory}: steps {sorted(unreadable)} are all "
          f"unreadable (moved to {self.directory.parent / QUARANTINE})")
    return None

  def set_aside(self, steps: list[int]) -> pathlib.Path:
    """Moves committed steps out of checkpoints/ (their step numbers can be saved again)."""
    for step in steps:
      self._move(step, SUPERSEDED)
    return self.directory.parent / SUPERSEDED

  def _move(self, step: int, folder: str) -> pathlib.Path:
    dest = self.directory.parent / folder / str(step)
    if jax.process_index() == 0:
      dest = move_aside(self.directory / str(step), dest.parent)
      self._record(dest)
    if jax.process_count() > 1:  # every process re-lists the directory after the move
      self._moves += 1  # barrier names must be unique and equal on every process
      ocp.multihost.sync_global_processes(f"axtrain_move_{self._moves}")
    self._manager.reload()
    return dest

  def wait_until_finished(self) -> None:
    """Waits for the save in flight. One the disk had no room for raises disk.NoSpace, its
    temporary folder removed: the committed checkpoints are untouched."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except  (read by _failed)
      raise self._failed(e) from None
    self._in_flight = None
    self._reports.stop()

  def _failed(self, error: Exception) -> Exception:
    """What a failed save raises: disk.NoSpace for a disk without room, else `error`. Stops the
    save's reports once its abandoned writes are collected, and removes its temporary folder."""
    step, needed = self._in_flight or (None, None)
    self._in_flight = None
    self._reports.stop(failure=error)
    if step is not None and jax.process_index() == 0:
      for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
        shutil.rmtree(partial, ignore_errors=True)
    if disk.no_room(error):  # what is free counts the partial checkpoint as removed
      return disk.as_no_space(error, path=self.directory / str(step), needed=needed)
    return error

  def close(self) -> None:
    try:
      self.wait_until_finished()
    finally:
      self._manager.close()


# -- checks before a run writes anything ---------------------------------------------------

def _read(step: int, abstract_state, shardings, restore: Callable, *,
          filter_warnings: bool = True) -> Restored:
  """`step` read by `restore(args)` (Orbax's Composite of the state and the data state), its
  state placed in `shardings`; CheckpointError if it does not read."""
  target = _with_shardings(abstract_state, shardings)
  with _one_read(filter_warnings=filter_warnings):
    out = restore(ocp.args.Composite(**{STATE: ocp.args.StandardRestore(target),
                                        DATA: ocp.args.JsonRestore()}))
  return Restored(step=step, state=out[STATE], data_state=dict(out[DATA] or {}))


def read_step(directory: pathlib.Path | str, step: int, abstract_state, shardings) -> Restored:
  """`step` of a checkpoints/ directory as Checkpointer.restore reads it, without a
  CheckpointManager (which cleans its directory): nothing on disk changes
  (trainer/early_restore.py, in a thread: Python's warnings filters are left alone);
  CheckpointError if it does not read."""
  path = pathlib.Path(directory).absolute() / str(step)
  check_step(path)
  reader = ocp.Checkpointer(ocp.CompositeCheckpointHandler(handler_registry=handlers(Transfers())))
  try:
    return _read(step, abstract_state, shardings, lambda args: reader.restore(path, args=args),
                 filter_warnings=False)
  finally:
    reader.close()


def check_restore_step(directory: pathlib.Path | str, step: int) -> None:
  """ConfigError unless `step` (checkpoint.restore_step; 0 = latest) is committed in `directory`."""
  if not step:
    return
  steps = committed_steps(directory)
  if step not in steps:
    raise ConfigError(f"checkpoint.restore_step={step}: {directory} holds no committed "
                      f"checkpoint of step {step} (committed steps: "
                      f"{', '.join(map(str, steps)) if steps else 'none'})")


def _step_dir(run_dir: pathlib.Path | str, step: int | None = None) -> pathlib.Path:
  """checkpoints/<step> of `run_dir` (absolute, as Orbax wants): the newest committed one, or
  `step`, which must be committed."""
  directory = pathlib.Path(run_dir) / "checkpoints"
  if not directory.is_dir():
    raise CheckpointError(f"{run_dir} holds no checkpoints/ directory")
  steps = steps_holding(directory, step)
  return (directory / str(steps[-1] if step is None else step)).absolute()


def _names(tree, prefix: str) -> dict[str, tuple[int, ...]]:
  """Orbax's array names ("params.layers.mlp.wi") -> shape, of an abstract pytree."""
  def key_name(k):
    return str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
  leaves = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(tree))[0]
  return {".".join([prefix, *map(key_name, path)]): tuple(leaf.shape) for path, leaf in leaves}


def check_params_compatible(run_dir: pathlib.Path | str, abstract_params, *,
                            field: str | None = None) -> None:
  """ConfigError unless the newest checkpoint of `run_dir` reads back with these parameters.

  For init.from_run (and --rewrite_config: `field`, what the message names): every parameter
  of the model must be in the checkpoint with the same shape, and the checkpoint may hold no
  others. Reads metadata only.
  """
  field = field or f"init.from_run={run_dir}"
  try:
    step_dir = _step_dir(run_dir)
    saved = check_step(step_dir, items=(STATE,))
  except CheckpointError as e:
    raise ConfigError(f"{field}: {e}") from None
  saved = {name: info.shape for name, info in saved.items() if name.startswith("params.")}
  want = _names(abstract_params, "params")
  where = f"the checkpoint ({step_dir})"
  checkpoint_layout.check(saved, want, field=field, where=where)
  for name, shape in want.items():
    if name not in saved:
      raise ConfigError(f"{field}: parameter {name} {shape} of this model is not in {where}")
    if saved[name] != shape:
      raise ConfigError(f"{field}: parameter {name} has shape {saved[name]} in {where} but "
                        f"{shape} in this model")
  extra = sorted(set(saved) - set(want))
  if extra:
    raise ConfigError(f"{field}: {where} holds parameter {extra[0]} {saved[extra[0]]} that this "
                      f"model does not have ({len(extra)} such)")


# -- whole-directory helpers (axtrain convert, init.from_run) ------------------------------

def write_initial(run_dir: pathlib.Path | str, state) -> None:
  """Synchronous step-0 checkpoint of `state` (a TrainState or a dict with "params")."""
  ckpt = Checkpointer(pathlib.Path(run_dir) / "checkpoints", CheckpointConfig())
  try:
    ckpt.save(0, state, {})
    ckpt.wait_until_finished()
  finally:
    ckpt.close()


def load_params(run_dir: pathlib.Path | str, abstract_params, shardings, *,
                step: int | None = None):
  """The parameters of the newest (or `step`'s) committed checkpoint of `run_dir`, in `shardings`.

  Only the "params" subtree is read, so optimizer state (if any) is ignored and
  a converted model (`axtrain convert`) works the same as a training run.
  """
  step_dir = _step_dir(run_dir, step)
  try:
    check_step(step_dir, items=(STATE,))
  except CheckpointError as e:
    raise CheckpointError(f"checkpoint {step_dir} is unreadable ({e})") from None
  target = {"params": _with_shardings(abstract_params, shardings)}
  restore_args = ocp.checkpoint_utils.construct_restore_args(target)
  with _one_read(), ocp.PyTreeCheckpointer() as reader:
    out = reader.restore(step_dir / STATE, args=ocp.args.PyTreeRestore(
        item=target, restore_args=restore_args, partial_restore=True))
  return out["params"]
