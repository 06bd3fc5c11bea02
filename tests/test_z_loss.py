"""trainer.z_loss: PaLM's z-loss, coefficient x log(Z)^2 per counted token, in the training
objective only (the reported losses stay the cross-entropy)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modules  # noqa: F401  (registers the layer library)
from tests.test_modules import padded_vocab_setup
from trainer import optimizer as optimizer_lib
from trainer.step import TrainState, loss_sums, train_step

VOCAB, SEQ, COEF = 200, 16, 0.3


def _setup():
  return padded_vocab_setup(VOCAB, SEQ, rows=2)  # pad columns must not count in log(Z)


def _by_hand(logits, batch, coef):
  """sum(w * (log Z - logit[target])) + coef * sum(w * (log Z)^2) in float64 NumPy."""
  logits = np.asarray(logits, np.float64)[..., :VOCAB]  # the real ids only
  top = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
  target = np.take_along_axis(logits, np.asarray(batch["targets"])[..., None], -1)[..., 0]
  w = np.asarray(batch["weights"], np.float64)
  return np.sum(w * (log_z - target)), np.sum(w * log_z ** 2)


@pytest.mark.parametrize("chunk", [0, 8])  # whole logits; the chunked loss
def test_the_objective_adds_the_coefficient_times_log_z_squared(chunk):
  model, batch, params = _setup()
  logits = model.apply({"params": params}, batch["inputs"])
  cross_entropy, z_sum = _by_hand(logits, batch, COEF)
  for coef in (0.0, COEF):
    total, stats = jax.jit(functools.partial(
        loss_sums, model=model, compute_dtype=jnp.float32, loss_chunk_size=chunk,
        z_loss=coef))(params, batch)
    np.testing.assert_allclose(stats["loss_sum"], cross_entropy, rtol=1e-5)
    np.testing.assert_allclose(stats["z_sum"], z_sum if coef else 0.0, rtol=1e-5)
    np.testing.assert_allclose(total, cross_entropy + coef * z_sum, rtol=1e-5)


def test_a_step_reports_it_and_its_gradient_lowers_log_z():
  """With z-loss the step's `loss` is still the cross-entropy and `z_loss` the mean log(Z)^2;
  its gradient moves the head toward log Z = 0, so a step with it ends with a smaller mean
  log(Z)^2 than the same step without it."""
  model, batch, params = _setup()
  opt = optimizer_lib.Optimizer(tx=optax.sgd(1.0), schedule=optax.constant_schedule(1.0))
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=opt.tx.init(params))
  after = {}
  for coef in (0.0, COEF):
    new, metrics = jax.jit(functools.partial(train_step, model=model, optimizer=opt,
                                             z_loss=coef))(state, batch)
    logits = model.apply({"params": new.params}, batch["inputs"])
    cross_entropy, z_sum = _by_hand(model.apply({"params": params}, batch["inputs"]), batch, 0)
    weight = float(np.sum(batch["weights"]))
    np.testing.assert_allclose(metrics["loss"], cross_entropy / weight, rtol=1e-5)
    assert ("z_loss" in metrics) == bool(coef)
    if coef:
      np.testing.assert_allclose(metrics["z_loss"], z_sum / weight, rtol=1e-5)
    after[coef] = _by_hand(logits, batch, 0)[1] / weight
  assert after[COEF] < after[0.0] - 0.1, after


def test_a_bad_coefficient_is_refused_in_one_line(tmp_path, capsys):
  from launcher import main as main_lib  # pylint: disable=import-outside-toplevel
  out = tmp_path / "run"
  assert main_lib.main(["axtrain", "--config=configs/llama.py:size=test",
                        "--config.trainer.z_loss=-1e-4", f"--output_dir={out}"]) == 2
  assert capsys.readouterr().err.strip() == (
      "axtrain: error: trainer.z_loss must be a finite number >= 0 (0 = off), got -0.0001")
  assert main_lib.main(["axtrain", "--config=configs/llama.py:size=test",
                        "--config.trainer.z_loss=1e300", f"--output_dir={out}"]) == 2
  assert capsys.readouterr().err.strip() == (
      "axtrain: error: trainer.z_loss must be a finite number >= 0 (0 = off), got 1e+300, inf "
      "in float32 (the precision the steps compute in)")
  assert not out.exists()
