"""What a metrics record reports of the train steps (trainer/train_metrics.py): every registered
metric, each summed up over the steps since the previous record by its summaries, on the device,
and named in docs/observe.md. The metrics come from the registry: a new one is checked here with
no list to extend (its meaning is its own test's); the two that sum up more than the logged
step (`grad_norm_max`, `grad_clipped_fraction`) are checked against a loop of our own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.base import lm_config
from modules import llama
from tests.conftest import ROOT
from trainer import config as config_lib, experiment, loop, meshes, train_metrics
from trainer.train_metrics import SUMMARIES, TRAIN_METRICS, Interval, TrainMetric, record_keys

MAX_STEPS, LOG_EVERY, CLIP = 7, 3, 0.87  # the test model's gradient norms: 0.85 to 0.9


@pytest.fixture(scope="module")
def runs():
  """The loop's records (every 3 steps, and the last), and each step's metrics fetched at once
  by a plain loop of the same steps."""
  cfg = lm_config(llama.model_node("test"), max_steps=MAX_STEPS, learning_rate=1e-3,
                  batch_size=8, seq_len=32, warmup_steps=2, data_kind="synthetic")
  cfg.trainer.log_every, cfg.trainer.peak_flops, cfg.optimizer.clip_norm = LOG_EVERY, 1e12, CLIP
  cfg.eval.batch_size, cfg.eval.num_batches = 8, 1
  exp = experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))
  records = [r for r in loop.train(exp).records if "loss" in r]
  data = exp.source.train_iterator(process_index=0, process_count=1)
  state, steps = exp.init(), {}
  with exp.context():
    for step in range(1, MAX_STEPS + 1):
      state, m = exp.step_fn(state, exp.global_batch(next(data)))
      steps[step] = {k: float(v) for k, v in jax.device_get(m).items()}
  return records, steps


def test_every_registered_metric_is_in_every_record(runs):
  records, steps = runs
  assert [r["step"] for r in records] == [3, 6, 7]
  on = [name for name in TRAIN_METRICS if name in steps[1]]  # z_loss is off here
  assert set(TRAIN_METRICS) - set(on) == {"z_loss"}
  for r in records:
    missing = [k for name in on for k in record_keys(name) if k not in r]
    assert not missing, (r["step"], missing)


def test_the_interval_summaries_are_those_of_the_steps(runs):
  """grad_norm_max is the largest gradient norm since the previous record, and
  grad_clipped_fraction the share of those steps whose norm was over optimizer.clip_norm."""
  records, steps = runs
  fractions = []
  for r, after in zip(records, [0, *(r["step"] for r in records)]):
    norms = [steps[s]["grad_norm"] for s in range(after + 1, r["step"] + 1)]
    assert r["grad_norm"] == steps[r["step"]]["grad_norm"]
    assert r["loss"] == steps[r["step"]]["loss"]
    assert r["grad_norm_max"] == max(norms)
    assert r["grad_clipped_fraction"] == pytest.approx(np.mean([n > CLIP for n in norms]))
    fractions.append(r["grad_clipped_fraction"])
  assert any(0 < f < 1 for f in fractions), fractions  # the clip falls among the norms


def test_each_summary_folds_on_the_device_and_finishes_at_the_record(monkeypatch):
  """A metric with every summary, over two records of 4 and 1 steps, against numpy."""
  monkeypatch.setitem(TRAIN_METRICS, "x", TrainMetric(lambda v: None, tuple(SUMMARIES)))
  values = [np.float32(v) for v in (3.0, -1.0, 7.5, 2.0, 0.25)]
  flags = [np.float32(v) for v in (1, 0, 1, 1, 0)]
  interval = Interval()
  for v, f in zip(values[:4], flags[:4]):
    interval.add({"x": jnp.asarray(v), "sown": jnp.asarray(f)})
  first = interval.take().record()
  interval.add({"x": jnp.asarray(values[4]), "sown": jnp.asarray(flags[4])})
  second = interval.take().record()
  four = np.array(values[:4])
  assert first == {"x": 2.0, "x_mean": pytest.approx(float(np.mean(four))), "x_max": 7.5,
                   "x_min": -1.0, "x_fraction": pytest.approx(float(np.mean(four))),
                   "sown": 1.0}  # what the modules sow: the last step's
  assert second == {"x": 0.25, "x_mean": 0.25, "x_max": 0.25, "x_min": 0.25,
                    "x_fraction": 0.25, "sown": 0.0}


def test_every_record_key_is_named_in_the_docs():
  text = (ROOT / "docs" / "observe.md").read_text()
  missing = [k for name in TRAIN_METRICS for k in record_keys(name) if f"`{k}`" not in text]
  assert not missing, f"docs/observe.md does not name {missing}"


@pytest.mark.parametrize("name, summaries, message", [
    ("loss", (), "'loss' is taken"),
    ("grad_norm", ("mean",), "'grad_norm' is taken"),
    ("grad", ("norm_max",), "unknown summary 'norm_max'"),
    ("grad_norm_max", (), "'grad_norm_max' is taken"),  # grad_norm's max
    ("nonfinite", (), "'nonfinite' is taken"),  # the loop's flag
])
def test_a_taken_name_or_an_unknown_summary_is_refused(name, summaries, message):
  before = dict(TRAIN_METRICS)
  with pytest.raises(ValueError, match=message):
    train_metrics.train_metric(name, *summaries)(lambda v: v.loss)
  assert TRAIN_METRICS == before
