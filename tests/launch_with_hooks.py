"""axtrain with test callbacks, for tests that need a real process (signals, exit codes).

    python tests/launch_with_hooks.py \\
        [--pause_after_step=N | --pause_at_eval=N --paused_file=PATH] [--nan_at_step=N] \\
        [--hold_after_step=N --held_file=PATH --release_file=PATH [--then_sleep_s=S]] \\
        [--save_params_at_start=PATH] [--fill_disk_after_step=N --filler=PATH] \\
        [--end_late_process=N --end_late_s=S] \\
        [--no_room_check] -- --config=... (axtrain's own arguments)

The callbacks are also used in-process (`launcher.main.main(argv, callbacks=[...])`).
"""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

from trainer.callbacks import Callback


class PauseAfter(Callback):
  """Holds the loop after step `step` until a stop is requested (a signal), so that
  signals land at a known step; `paused_file` is written when the hold begins."""

  def __init__(self, step: int, paused_file: pathlib.Path):
    self.step, self.paused_file = step, pathlib.Path(paused_file)

  def on_step_end(self, step: int, loop) -> None:
    if step == self.step:
      self.paused_file.write_text(str(step))
      while not loop.stop_requested():
        time.sleep(0.01)


class PauseAtEval(PauseAfter):
  """Holds the loop as the evaluation after step `step` reports (its record), like PauseAfter."""

  def on_step_end(self, step: int, loop) -> None:
    del step, loop

  def on_record(self, record: dict) -> None:
    if record["step"] == self.step and "eval_loss" in record:
      self.paused_file.write_text(str(self.step))
      while not self.loop.stop_requested():
        time.sleep(0.01)

  def on_train_start(self, loop) -> None:
    self.loop = loop  # pylint: disable=attribute-defined-outside-init


class HoldAfter(Callback):
  """Holds the loop after step `step` until `release_file` exists (`held_file`.<process index>
  is written when the hold begins), then sleeps `then_sleep_s` after each later step.

  For multi-process runs, where a SIGTERM's stop is agreed between the processes at a later
  step (launcher/distributed.py), so PauseAfter's wait for a stop request would never end: the
  test signals the held processes, waits until they heard it, releases them, and the slow steps
  after the hold leave time for the agreement. Also holds processes for a SIGKILL.
  """

  def __init__(self, step: int, held_file: pathlib.Path, release_file: pathlib.Path,
               then_sleep_s: float = 0.0):
    self.step, self.then_sleep_s = step, then_sleep_s
    self.held_file, self.release_file = pathlib.Path(held_file), pathlib.Path(release_file)

  def on_step_end(self, step: int, loop) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    if step == self.step:
      pathlib.Path(f"{self.held_file}.{jax.process_index()}").write_text(str(step))
      while not self.release_file.exists():
        time.sleep(0.05)
    elif step > self.step:
      time.sleep(self.then_sleep_s)


class EndLate(Callback):
  """Process `process` ends its run `seconds` late (its other processes are done by then), as a
  slow host does: what it sees of the coordination service while it lingers is what a process
  of several sees of a peer that left first."""

  def __init__(self, process: int, seconds: float):
    self.process, self.seconds = process, seconds

  def on_train_end(self, loop) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    if jax.process_index() == self.process:
      time.sleep(self.seconds)


class StopAfter(Callback):
  """Requests a stop after step `step`, as a first SIGTERM would: the loop saves a checkpoint of
  that step and the run exits 75 (preempted). For in-process runs, where no signal is sent."""

  def __init__(self, step: int):
    self.step = step

  def on_step_end(self, step: int, loop) -> None:
    if step == self.step:
      loop.stop_requested = lambda: True


class NanAt(Callback):
  """Gives the batch of `step` NaN loss weights: a non-finite loss and gradient."""

  def __init__(self, step: int):
    self.step = step

  def on_batch(self, step: int, batch: dict) -> dict:
    if step == self.step:
      return dict(batch, weights=np.full_like(batch["weights"], np.nan))
    return batch


class FillDisk(Callback):
  """After step `step`, once no checkpoint is being written beside `filler` (so that the
  run's next write to fail is not a save in flight), writes `filler` until its filesystem has
  no room left, as another job on a shared disk would; deleting it frees the space again."""

  def __init__(self, step: int, filler: pathlib.Path):
    self.step, self.filler = step, pathlib.Path(filler)

  def on_step_end(self, step: int, loop) -> None:
    if step == self.step:
      while any(self.filler.parent.rglob("*.orbax-checkpoint-tmp*")):
        time.sleep(0.01)
      fill(self.filler)


def fill(filler: pathlib.Path) -> None:
  """Writes `filler` until its filesystem is full (ENOSPC)."""
  block = b"\0" * 4096
  with open(filler, "ab", buffering=0) as f:
    try:
      while True:
        f.write(block)
    except OSError:
      pass


class SaveParamsAtStart(Callback):
  """Writes the parameters the loop starts from (restored or initialised) to `path`, an .npz
  keyed as tests/ckpt_util.py:params keys a checkpoint's, to compare them with what was saved."""

  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)

  def on_train_start(self, loop) -> None:
    import jax  # pylint: disable=import-outside-toplevel
    leaves = jax.tree_util.tree_flatten_with_path(loop.state.params)[0]
    with open(self.path, "wb") as f:
      np.savez(f, **{jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves})


def parse(args: list[str]) -> tuple[list[Callback], list[str]]:
  """(callbacks, axtrain arguments) from this script's arguments."""
  split = args.index("--")
  options = dict(a.removeprefix("--").partition("=")[::2] for a in args[:split])
  callbacks: list[Callback] = []
  if "pause_after_step" in options:
    callbacks.append(PauseAfter(int(options.pop("pause_after_step")),
                                pathlib.Path(options.pop("paused_file"))))
  if "pause_at_eval" in options:
    callbacks.append(PauseAtEval(int(options.pop("pause_at_eval")),
                                 pathlib.Path(options.pop("paused_file"))))
  if "hold_after_step" in options:
    callbacks.append(HoldAfter(int(options.pop("hold_after_step")),
                               pathlib.Path(options.pop("held_file")),
                               pathlib.Path(options.pop("release_file")),
                               float(options.pop("then_sleep_s", 0))))
  if "end_late_process" in options:
    callbacks.append(EndLate(int(options.pop("end_late_process")),
                             float(options.pop("end_late_s"))))
  if "save_params_at_start" in options:
    callbacks.append(SaveParamsAtStart(pathlib.Path(options.pop("save_params_at_start"))))
  if "nan_at_step" in options:
    callbacks.append(NanAt(int(options.pop("nan_at_step"))))
  if "fill_disk_after_step" in options:
    callbacks.append(FillDisk(int(options.pop("fill_disk_after_step")),
                              pathlib.Path(options.pop("filler"))))
  if "no_room_check" in options:  # a disk that fills while a checkpoint is written (a race)
    from trainer import disk  # pylint: disable=import-outside-toplevel
    options.pop("no_room_check")
    disk.check_room = lambda path, needed: None
  if options:
    raise SystemExit(f"launch_with_hooks: unknown options {sorted(options)}")
  return callbacks, args[split + 1:]


if __name__ == "__main__":
  from launcher import main  # pylint: disable=import-outside-toplevel
  hooks, axtrain_args = parse(sys.argv[1:])
  main.run(["axtrain", *axtrain_args], callbacks=hooks)
