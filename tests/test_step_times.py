"""Each metrics record times its own steps, the last included, in either state placement; a
save's and an evaluation's time go into records of their own (trainer/step_clock.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from configs.base import lm_config
from modules import llama
from trainer import checkpoint, config as config_lib, experiment, loop, meshes
from trainer.callbacks import Callback
from trainer.step_clock import StepClock

SLOW = 0.75  # seconds of host time injected into step 3, into the saves and into the evaluations


class _SlowBatch(Callback):
  def on_batch(self, step, batch):
    if step == 3:
      time.sleep(SLOW)
    return batch


@pytest.fixture(scope="module", params=["device", "host"])
def records(request, tmp_path_factory):
  """Six steps, a record each, a save and an evaluation at step 4 and at the end, step 3's
  batch, both saves and both evaluations each SLOW seconds longer than they take."""
  cfg = lm_config(llama.model_node("test"), max_steps=6, learning_rate=1e-3, batch_size=8,
                  seq_len=32, warmup_steps=2, data_kind="synthetic")
  cfg.eval.batch_size, cfg.eval.num_batches, cfg.eval.every_steps = 8, 1, 4
  cfg.checkpoint.every_steps = 4
  cfg.trainer.peak_flops = 1e12
  cfg.trainer.log_every = 1
  cfg.trainer.state_memory = request.param
  exp = experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))
  patch = pytest.MonkeyPatch()
  save, evaluate = checkpoint.Checkpointer.save, loop.evaluate
  patch.setattr(checkpoint.Checkpointer, "save",
                lambda *a, **k: (time.sleep(SLOW), save(*a, **k))[1])
  patch.setattr(loop, "evaluate", lambda *a, **k: (time.sleep(SLOW), evaluate(*a, **k))[1])
  try:
    result = loop.train(exp, checkpoint_dir=tmp_path_factory.mktemp("ckpt"),
                        callbacks=[_SlowBatch()])
  finally:
    patch.undo()
  return result.records


def test_a_step_record_holds_its_own_steps_time(records):
  """Step 3's slow batch is step 3's, in no other record; the last step is timed too (it was
  0.0025 s on the chip with the state in host memory, and step 2's record held two steps)."""
  times = {r["step"]: r["step_time_s"] for r in records if "loss" in r}
  assert sorted(times) == [1, 2, 3, 4, 5, 6]
  assert times[3] >= 0.9 * SLOW  # (the sleep starts while step 2 still runs, on the devices)
  for step in (2, 4, 5, 6):
    assert 0 < times[step] < SLOW, (step, times)  # steps of the test model take milliseconds


def test_saves_and_evaluations_are_timed_in_records_of_their_own(records):
  saves = {r["step"]: r["save_time_s"] for r in records if "save_time_s" in r}
  evals = {r["step"]: r["eval_time_s"] for r in records if "eval_loss" in r}
  assert sorted(saves) == [4, 6] and sorted(evals) == [4, 6]
  assert min(saves.values()) >= SLOW and min(evals.values()) >= SLOW
  assert [r["step"] for r in records] == sorted(r["step"] for r in records)


class _Flag:
  """A step's flag that becomes ready when the test says so, at the test's clock time."""

  def __init__(self):
    self.ready = threading.Event()

  def block_until_ready(self):
    self.ready.wait()


def test_the_clock_charges_each_step_from_the_one_before_and_skips_pauses():
  now = [0.0]
  clock = StepClock(now=lambda: now[0])
  flags = {step: _Flag() for step in range(1, 5)}

  def finish(step, at):
    now[0] = at
    flags[step].ready.set()
    clock.wait(step)

  clock.dispatched(1, flags[1])
  finish(1, 10.0)  # the first step (compilation) ends at 10
  clock.dispatched(2, flags[2])
  clock.dispatched(3, flags[3])
  finish(2, 12.0)
  finish(3, 15.0)
  with clock.paused() as pause:
    now[0] = 115.0
  assert pause.seconds == 100.0
  clock.dispatched(4, flags[4])  # dispatched 5 s after the pause ended: the step's own time
  finish(4, 124.0)
  clock.close()
  assert [clock.seconds(1, 2), clock.seconds(2, 3), clock.seconds(3, 4)] == [2.0, 3.0, 9.0]


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="the machine's RAM in use: Linux")
def test_records_carry_the_machines_ram_in_use_and_a_saves_peak(records):
  """The figure `axtrain plan`'s host verdict is calibrated against (docs/observe.md): the
  machine's RAM in use in each step record, before and at the peak of each save."""
  steps = [r for r in records if "loss" in r]
  saves = [r for r in records if "save_time_s" in r]
  assert steps and all(r["host_ram_in_use_bytes"] > 0 for r in steps), steps
  assert saves and all(
      0 < r["host_ram_in_use_before_bytes"] <= r["host_ram_in_use_peak_bytes"] for r in saves)
