"""Pure functions of the train step: state init, loss, train_step, eval_step.

They take the model and optimizer as static arguments; `trainer.loop` jits them
with shardings and donation. Tests call them directly.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from trainer.optimizer import Optimizer


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array  # int32 scalar: optimizer steps taken
  params: Any  # float32 parameters
  opt_state: Any


def init_params(key, *, model: nn.Module, seq_len: int):
  """Parameters, boxed with their logical axis names. Use under eval_shape/jit."""
  return model.init(key, jnp.zeros((1, seq_len), jnp.int32))["params"]


def init_state(key, *, model: nn.Module, optimizer: Optimizer, seq_len: int) -> TrainState:
  """Parameters (boxed with logical axis names) and optimizer state. Use under eval_shape/jit."""
  params = init_params(key, model=model, seq_len=seq_len)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.tx.init(params))


def cast_floats(tree, dtype):
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      tree)


def loss_sums(params, batch, *, model: nn.Module, compute_dtype) -> tuple[jax.Array, dict]:
  """(sum of token losses + weighted aux losses, stats) for one (micro)batch, in float32."""
  logits, variables = model.apply(
      {"params": cast_floats(params, compute_dtype)}, batch["inputs"], batch.get("positions"),
      batch.get("segment_ids"), mutable=["losses"])
  logits = logits.astype(jnp.float32)
  token_loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
  weights = batch["weights"].astype(jnp.float32)
  loss_sum = jnp.sum(token_loss * weights)
  weight_sum = jnp.sum(weights)
  aux = sum((jnp.sum(x) for x in jax.tree.leaves(variables.get("losses", {}))), jnp.float32(0))
  # Aux losses (e.g. MoE load balancing) are means; scale them like the token sum.
  return loss_sum + aux * weight_sum, {"loss_sum": loss_sum, "weight_sum": weight_sum,
                                       "aux_loss": aux}


def _microbatches(batch, n: int):
  """[B, ...] -> [n, B/n, ...] where microbatch i takes rows i, i + n, ...

  Strided, not contiguous: each device then holds its share of every microbatch
  (a contiguous split would put a microbatch on only 1/n of the batch shards).
  """
  def split(x):
    x = x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)
    return nn.with_logical_constraint(x, (None, "batch", *(None,) * (x.ndim - 2)))
  return jax.tree.map(split, batch)


def train_step(state: TrainState, batch, *, model: nn.Module, optimizer: Optimizer,
               compute_dtype=jnp.float32, grad_accum_steps: int = 1, skip_nonfinite: bool = False):
  """One optimizer step on a global batch; returns (new state, metrics of this step).

  metrics["nonfinite"] is 1.0 when the loss or gradient norm is NaN/Inf; with
  `skip_nonfinite` such a step keeps the old parameters and optimizer state
  (the step counter still advances, so the data stream stays aligned).
  """
  grad_fn = jax.grad(functools.partial(loss_sums, model=model, compute_dtype=compute_dtype),
                     has_aux=True)
  if grad_accum_steps == 1:
    grads, stats = grad_fn(state.params, batch)
  else:
    def body(acc, micro):
      g, s = grad_fn(state.params, micro)
      return jax.tree.map(jnp.add, acc, (g, s)), None

    zeros = (jax.tree.map(jnp.zeros_like, state.params),
             {"loss_sum": jnp.float32(0), "weight_sum": jnp.float32(0), "aux_loss": jnp.float32(0)})
    (grads, stats), _ = jax.lax.scan(body, zeros, _microbatches(batch, grad_accum_steps))
    stats = dict(stats, aux_loss=stats["aux_loss"] / grad_accum_steps)
  denom = jnp.maximum(stats["weight_sum"], 1.0)
  grads = jax.tree.map(lambda g: g / denom, grads)
  updates, opt_state = optimizer.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  loss, grad_norm = stats["loss_sum"] / denom, optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  if skip_nonfinite:
    keep_old = lambda new, old: jnp.where(finite, new, old)
    params = jax.tree.map(keep_old, params, state.params)
    opt_state = jax.tree.map(keep_old, opt_state, state.opt_state)
  metrics = {
      "loss": loss,
      "aux_loss": stats["aux_loss"],
      "grad_norm": grad_norm,
      "param_norm": optax.tree.norm(params),
      "update_norm": optax.tree.norm(updates),  # the optimizer's update, before a skip
      "learning_rate": optimizer.schedule(state.step),
      "nonfinite": 1.0 - finite.astype(jnp.float32),
  }
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch, *, model: nn.Module, compute_dtype=jnp.float32):
  """(loss sum, weight sum) of one held-out batch."""
  _, stats = loss_sums(params, batch, model=model, compute_dtype=compute_dtype)
  return stats["loss_sum"], stats["weight_sum"]
