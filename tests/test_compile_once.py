"""The training loop compiles its step once and leaves the device alone between logs.

Device-to-host transfers are observed where jax makes them (`ArrayImpl._value`,
behind float(), np.asarray and jax.device_get, and `copy_to_host_async`): on CPU
`jax.transfer_guard` does not fire, because host and device share memory.
Steps are counted by wrapping the experiment's jitted step with a counter that
calls through to it.
"""

from __future__ import annotations

import jax
import pytest
from jax._src import array as jax_array

from configs.base import lm_config
from modules import llama
from trainer import config as config_lib, experiment, loop, meshes

MAX_STEPS, LOG_EVERY = 7, 3


def _experiment(max_steps: int) -> experiment.Experiment:
  cfg = lm_config(llama.model_node("test"), max_steps=max_steps, learning_rate=1e-3,
                  batch_size=8, seq_len=32, warmup_steps=2, data_kind="synthetic")
  cfg.trainer.log_every = LOG_EVERY
  cfg.eval.batch_size, cfg.eval.num_batches = 8, 1
  return experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))


class _Watch:
  """Counts dispatched steps, and notes the step count at every device-to-host transfer."""

  def __init__(self, exp: experiment.Experiment, monkeypatch):
    self.steps = 0
    self.transfer_steps: list[int] = []
    self.compile_steps: list[int] = []
    jitted = exp.step_fn

    def counted(*args, **kwargs):
      self.steps += 1
      return jitted(*args, **kwargs)

    counted.lower = jitted.lower  # the loop compiles through lower() once, for its statistics
    exp.__dict__["step_fn"] = counted  # the cached_property's slot; the real step runs
    value = jax_array.ArrayImpl._value
    copy = jax_array.ArrayImpl.copy_to_host_async

    def value_spy(arr):
      self.transfer_steps.append(self.steps)
      return value.fget(arr)

    def copy_spy(arr):
      self.transfer_steps.append(self.steps)
      return copy(arr)

    monkeypatch.setattr(jax_array.ArrayImpl, "_value", property(value_spy))
    monkeypatch.setattr(jax_array.ArrayImpl, "copy_to_host_async", copy_spy)
    self.jitted = jitted


@pytest.fixture(scope="module")
def run():
  """One training run of MAX_STEPS steps, and what was observed during it."""
  exp = _experiment(MAX_STEPS)
  with pytest.MonkeyPatch.context() as mp:
    watch = _Watch(exp, mp)

    def listener(event, duration, **kwargs):
      if event == "/jax/core/compile/backend_compile_duration":
        watch.compile_steps.append(watch.steps)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
      result = loop.train(exp)
    finally:
      jax.monitoring.unregister_event_duration_listener(listener)
  return watch, result


def test_step_compiles_once(run):
  watch, result = run
  assert watch.steps == MAX_STEPS
  assert [r["step"] for r in result.records if "loss" in r] == [3, 6, 7]
  assert watch.jitted._cache_size() == 1


def test_nothing_compiles_between_the_first_and_the_last_step(run):
  # 0: init, 1: the step, MAX_STEPS: evaluation at the end.
  watch, _ = run
  assert watch.compile_steps, "the listener saw no compilation at all"
  assert set(watch.compile_steps) <= {0, 1, MAX_STEPS}, watch.compile_steps


def test_metrics_reach_the_host_one_step_late(run):
  """Step s's record is fetched after step s + 1 is dispatched (the last one after the loop):
  no transfer while the step just dispatched is a logging step, none on other steps."""
  watch, _ = run
  logged = [*range(LOG_EVERY, MAX_STEPS, LOG_EVERY), MAX_STEPS]
  fetched_at = {min(s + 1, MAX_STEPS) for s in logged}
  assert watch.transfer_steps, "the spy saw no transfer at all: instrumentation is broken"
  assert set(watch.transfer_steps) <= {0, *fetched_at}, sorted(set(watch.transfer_steps))
  assert fetched_at <= set(watch.transfer_steps), sorted(set(watch.transfer_steps))
