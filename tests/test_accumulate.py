"""trainer/step.py:accumulate: microbatch gradients summed in a scan, its gradient function traced
once (the accumulator's shapes and the scan's body share one trace), the sums those of the
microbatches (tests/test_sharding.py: equal to one batch on every mesh)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from trainer import step


def _grad_fn(calls: list, params, batch):
  calls.append(1)  # once per trace: a jitted function's Python runs only while it is traced
  loss = (batch["x"] @ params["w"]).sum()
  return ({"w": batch["x"].T @ jnp.ones((batch["x"].shape[0], 3), batch["x"].dtype)},
          {"loss_sum": loss, "weight_sum": jnp.float32(batch["x"].shape[0]),
           "aux_loss": jnp.float32(0.0), "metrics": {"m": loss}})


def test_the_gradient_function_is_traced_once_and_the_sums_are_the_microbatches():
  calls: list = []
  params = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3)}
  batch = {"x": jnp.arange(16, dtype=jnp.float32).reshape(8, 2)}
  grad_fn = functools.partial(_grad_fn, calls)
  accumulate = jax.jit(functools.partial(step.accumulate, grad_fn=grad_fn, grad_accum_steps=4))
  grads, stats = accumulate(params, batch)
  assert len(calls) == 1  # the shapes' eval_shape and the scan's body: one trace
  parts = [_grad_fn([], params, {"x": batch["x"][i::4]}) for i in range(4)]
  np.testing.assert_allclose(grads["w"], sum(p[0]["w"] for p in parts))
  np.testing.assert_allclose(stats["loss_sum"], sum(p[1]["loss_sum"] for p in parts))
  np.testing.assert_allclose(stats["metrics"]["m"], sum(p[1]["metrics"]["m"] for p in parts) / 4)
