"""What an evaluation reports (trainer/step.py:EVAL_METRICS): every metric summed alike over the
whole logits, the chunked loss's chunks and eval microbatches, made into `eval_<name>` means by
eval_record, and named in docs/observe.md. The metrics come from the registry: a new one is
tested here with no list to extend (its own meaning is its own test's)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from tests.conftest import ROOT
from tests.test_modules import padded_vocab_setup
from trainer.step import EVAL_METRICS, eval_metric, eval_record, eval_step

VOCAB, SEQ = 200, 16


@pytest.fixture(scope="module")
def setup():
  return padded_vocab_setup(VOCAB, SEQ, rows=4)  # 56 pad columns, masked; row 1 padded


def _sums(model, params, batch, **options):
  fn = jax.jit(functools.partial(eval_step, model=model, **options))
  return {k: float(v) for k, v in jax.device_get(fn(params, batch)).items()}


def test_every_metric_sums_alike_whole_chunked_and_in_microbatches(setup):
  model, batch, params = setup
  whole = _sums(model, params, batch)
  assert set(whole) == {*EVAL_METRICS, "tokens"}
  for options in (dict(loss_chunk_size=8), dict(microbatches=2),
                  dict(loss_chunk_size=4, microbatches=4)):
    got = _sums(model, params, batch, **options)
    assert set(got) == set(whole)
    for name, value in whole.items():
      assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-5), (options, name)


def test_the_record_holds_the_means_and_the_loss_by_hand(setup):
  model, batch, params = setup
  record = eval_record(_sums(model, params, batch))
  assert set(record) == {"eval_perplexity", "eval_tokens", *(f"eval_{n}" for n in EVAL_METRICS)}
  logits = np.asarray(model.apply({"params": params}, batch["inputs"]), np.float64)[..., :VOCAB]
  top = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
  target = np.take_along_axis(logits, np.asarray(batch["targets"])[..., None], -1)[..., 0]
  w = np.asarray(batch["weights"], np.float64)
  loss = np.sum(w * (log_z - target)) / np.sum(w)
  assert record["eval_tokens"] == int(np.sum(w)) == 4 * SEQ - 6
  assert record["eval_loss"] == pytest.approx(loss, rel=1e-5)
  assert record["eval_perplexity"] == pytest.approx(np.exp(loss), rel=1e-5)


def test_every_metric_is_named_in_the_docs():
  text = (ROOT / "docs" / "observe.md").read_text()
  missing = [f"eval_{name}" for name in EVAL_METRICS if f"`eval_{name}`" not in text]
  assert not missing, f"docs/observe.md does not name {missing}"


@pytest.mark.parametrize("name", ["loss", "tokens", "perplexity"])
def test_a_taken_name_is_refused(name):
  with pytest.raises(ValueError, match="is taken"):
    eval_metric(name)(lambda logits, targets: targets)
  assert "tokens" not in EVAL_METRICS and "perplexity" not in EVAL_METRICS
