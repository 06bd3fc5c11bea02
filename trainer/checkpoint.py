"""Orbax checkpoints of a run: `<run_dir>/checkpoints/<step>/{state,data}`.

    state  the TrainState pytree (step, params, opt_state), one array file set per leaf
    data   the data iterator's get_state() as JSON

Saves are asynchronous: `save` returns once the arrays are copied off the
devices and the write finishes in a background thread. A step directory
appears under its final name only when Orbax has committed it (atomic rename
of a temporary directory), so a process killed at any moment leaves the
committed checkpoints intact. Old checkpoints are garbage-collected after a
newer one commits: the latest `keep` stay, plus every step divisible by
`keep_every_steps` when that is set.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib
import shutil
import sys
import types
import warnings
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

STATE, DATA = "state", "data"
# Checkpoints taken out of use are moved next to checkpoints/ rather than deleted:
QUARANTINE = "corrupt_checkpoints"  # unreadable ones
SUPERSEDED = "superseded_checkpoints"  # newer than checkpoint.restore_step when resuming from it


def _with_shardings(abstract, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, shardings)


@dataclasses.dataclass
class Restored:
  step: int
  state: Any
  data_state: dict
  skipped: list[tuple[int, str]]  # (step, reason) of newer checkpoints that could not be read


@functools.cache  # installs once per process
def _quiet_abandoned_reads() -> None:
  """Silences the late reports of the reads a failed restore left in flight.

  When one array of a restore fails to read, Orbax's event loop stops and
  closes while TensorStore still has the other reads in flight. They report
  afterwards, from other threads or when garbage-collected, in four ways:
  "RuntimeError: Event loop is closed" and a suspended read's coroutine
  raising as the GC closes it, both through sys.unraisablehook; "Task (or
  _GatheringFuture) exception was never retrieved" on the asyncio logger;
  and "coroutine ... was never awaited" RuntimeWarnings: dozens of
  tracebacks interleaved with the one warning that already names the
  unreadable checkpoint (CI saw them garble it). Only those exact reports
  are dropped, in processes that restore.
  """
  default_hook = sys.unraisablehook

  def hook(unraisable):
    exc = unraisable.exc_value
    loop_closed = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
    # A suspended read collected by the GC is closed with GeneratorExit, which Orbax's
    # `except BaseException` turns into an Exception: "Exception ignored in: <coroutine ...>".
    closed_read = (isinstance(unraisable.object, types.CoroutineType) and exc is not None
                   and isinstance(exc.__cause__ or exc.__context__, GeneratorExit))
    if not (loop_closed or closed_read):
      default_hook(unraisable)

  sys.unraisablehook = hook
  # "<class> exception was never retrieved": Task, Future, _GatheringFuture (asyncio.gather).
  logging.getLogger("asyncio").addFilter(
      lambda record: not str(record.msg).partition("\n")[0].endswith(
          " exception was never retrieved"))
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited",
                          category=RuntimeWarning)


class Checkpointer:
  """Saves and restores one run's checkpoints; every process of a run makes one."""

  def __init__(self, directory: pathlib.Path | str, cfg, *, read_only: bool = False):
    self.directory = pathlib.Path(directory).absolute()
    self.cfg = cfg
    keep = [policies.LatestN(n=cfg.keep)]
    if getattr(cfg, "keep_every_steps", 0):
      keep.append(policies.EveryNSteps(interval_steps=cfg.keep_every_steps))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy(keep),
        enable_async_checkpointing=True,
        # Temporary directories of saves cut short by a crash are never committed steps.
        cleanup_tmp_directories=not read_only,
        read_only=read_only,
        create=not read_only,
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._moves = 0

  def due(self, step: int) -> bool:
    """Whether the schedule (checkpoint.every_steps) asks for a checkpoint after `step`."""
    return bool(self.cfg.every_steps) and step % self.cfg.every_steps == 0

  def save(self, step: int, state, data_state: dict, *, force: bool = False) -> bool:
    """Starts an asynchronous save if due (or `force`); False if skipped or already on disk."""
    if not (force or self.due(step)) or step in self.all_steps():
      return False
    self._manager.save(step, force=True, args=ocp.args.Composite(**{
        STATE: ocp.args.StandardSave(state), DATA: ocp.args.JsonSave(data_state)}))
    return True

  def all_steps(self) -> list[int]:
    """Committed steps, oldest first (plus the one whose save is in flight, if any)."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, step: int, abstract_state, shardings) -> tuple[Any, dict]:
    """(state placed in `shardings`, data iterator state) of a committed step.

    The shardings are the current mesh's: a checkpoint written on another mesh
    or device count is resharded while reading.
    """
    target = _with_shardings(abstract_state, shardings)
    out = self._manager.restore(step, args=ocp.args.Composite(**{
        STATE: ocp.args.StandardRestore(target), DATA: ocp.args.JsonRestore()}))
    return out[STATE], dict(out[DATA] or {})

  def restore_latest(self, abstract_state, shardings, *, step: int | None = None,
                     warn: Callable[[str], None] = logging.warning) -> Restored | None:
    """Restores `step` (or the newest committed step that reads back); None if there are none.

    A checkpoint that fails to read is reported through `warn`, moved to
    `<run_dir>/corrupt_checkpoints/` (so its step can be written again) and the
    next older one is tried. Raises CheckpointError when checkpoints exist
    but none reads back.
    """
    _quiet_abandoned_reads()  # before the first read: late reports may race the exception
    steps = self.all_steps()
    if step is not None:
      if step not in steps:
        raise CheckpointError(f"checkpoint.restore_step={step} is not a committed checkpoint in "
                              f"{self.directory} (committed: {steps or 'none'})")
      steps = [s for s in steps if s <= step]
    skipped = []
    for candidate in reversed(steps):
      try:
        state, data_state = self.restore(candidate, abstract_state, shardings)
      except Exception as e:  # pylint: disable=broad-except  (any read failure means unusable)
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        moved = self._move(candidate, QUARANTINE)
        older = [s for s in steps if s < candidate]
        warn(f"checkpoint {self.directory / str(candidate)} is unreadable ({reason}); moved it to "
             f"{moved}; {f'falling back to step {older[-1]}' if older else 'no older checkpoint'}")
        skipped.append((candidate, reason))
        continue
      return Restored(step=candidate, state=state, data_state=data_state, skipped=skipped)
    if skipped:
      raise CheckpointError(
          f"no usable checkpoint in {self.directory}: steps {[s for s, _ in skipped]} are all "
          f"unreadable (moved to {self.directory.parent / QUARANTINE}); pass --overwrite to "
          f"start the run over")
    return None

  def set_aside(self, steps: list[int]) -> pathlib.Path:
    """Moves committed steps out of checkpoints/ (their step numbers can be saved again)."""
    for step in steps:
      self._move(step, SUPERSEDED)
    return self.directory.parent / SUPERSEDED

  def _move(self, step: int, folder: str) -> pathlib.Path:
    dest = self.directory.parent / folder / str(step)
    if jax.process_index() == 0:
      dest.parent.mkdir(parents=True, exist_ok=True)
      n = 1
      while dest.exists():
        dest, n = dest.with_name(f"{step}.{n}"), n + 1
      shutil.move(str(self.directory / str(step)), dest)
    if jax.process_count() > 1:  # every process re-lists the directory after the move
      self._moves += 1  # barrier names must be unique and equal on every process
      ocp.multihost.sync_global_processes(f"axtrain_move_{self._moves}")
    self._manager.reload()
    return dest

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


class CheckpointError(Exception):
  """No usable checkpoint where one was expected."""


@dataclasses.dataclass(frozen=True)
class _SaveAll:
  every_steps: int = 0
  keep: int = 1_000_000
  keep_every_steps: int = 0


def write_initial(run_dir: pathlib.Path | str, state) -> None:
  """Synchronous step-0 checkpoint of `state` (a TrainState or a dict with "params")."""
  ckpt = Checkpointer(pathlib.Path(run_dir) / "checkpoints", _SaveAll())
  try:
    ckpt.save(0, state, {}, force=True)
    ckpt.wait_until_finished()
  finally:
    ckpt.close()


def load_params(run_dir: pathlib.Path | str, abstract_params, shardings, *,
                step: int | None = None):
  """The parameters of the newest (or `step`'s) committed checkpoint of `run_dir`, in `shardings`.

  Only the "params" subtree is read, so optimizer state (if any) is ignored and
  a converted model (`axtrain convert`) works the same as a training run.
  """
  directory = pathlib.Path(run_dir) / "checkpoints"
  if not directory.is_dir():
    raise CheckpointError(f"{run_dir} holds no checkpoints/ directory")
  ckpt = Checkpointer(directory, _SaveAll(), read_only=True)
  try:
    if ckpt.latest_step() is None:
      raise CheckpointError(f"{directory} holds no committed checkpoint")
    if step is None:
      step = ckpt.latest_step()
    elif step not in ckpt.all_steps():
      raise CheckpointError(f"{directory} holds no committed checkpoint of step {step}; steps: "
                            f"{', '.join(map(str, ckpt.all_steps()))}")
    target = {"params": _with_shardings(abstract_params, shardings)}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    with ocp.PyTreeCheckpointer() as reader:
      out = reader.restore(directory / str(step) / STATE, args=ocp.args.PyTreeRestore(
          item=target, restore_args=restore_args, partial_restore=True))
  finally:
    ckpt.close()
  return out["params"]
