"""Pure functions of the train step: state init, loss, train_step, eval_step.

They take the model and optimizer as static arguments; `trainer.loop` jits them
with shardings and donation. Tests call them directly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from modules.decoder import LmHead
from trainer import offload, train_metrics
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


# -- what the step sums over tokens ---------------------------------------------------------
# A token metric maps float32 logits [..., V] and integer targets [...] to one value per token
# [...]. The step sums it times the token weights (token_sums), over the whole logits or over
# the chunks of the chunked loss (chunked_loss_sum), so a metric never sees how it is summed.
#
# What an evaluation reports (eval_record): `eval_<name>`, the mean over the held-out tokens of
# each token metric registered with @eval_metric, beside `eval_perplexity` (exp(eval_loss)) and
# `eval_tokens` (the tokens counted). A new one is its function here, with its test and its name
# in docs/observe.md.
EVAL_METRICS: dict[str, Callable] = {}
_EVAL_TAKEN = ("tokens", "perplexity")  # eval_record's own keys


def eval_metric(name: str):
  """Registers a token metric as `eval_<name>`; a name is refused twice."""
  def register(fn: Callable) -> Callable:
    if name in EVAL_METRICS or name in _EVAL_TAKEN:
      raise ValueError(f"eval metric {name!r} is taken: "
                       f"{', '.join([*EVAL_METRICS, *_EVAL_TAKEN])}")
    EVAL_METRICS[name] = fn
    return fn
  return register


@eval_metric("loss")
def cross_entropy(logits, targets):
  """-log softmax(logits)[target]: the loss."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets)


def log_z_squared(logits, targets):
  """log(Z)^2, Z the softmax normaliser (logsumexp of the logits): PaLM's z-loss."""
  del targets
  return jnp.square(jax.nn.logsumexp(logits, axis=-1))


def token_sums(logits, targets, weights, *, metrics: Mapping[str, Callable]) -> dict:
  """{name: sum of weights * metric(logits, targets)} in float32, for each of `metrics`, of
  logits [..., V] against integer targets [...]."""
  logits = logits.astype(jnp.float32)
  return {name: jnp.sum(fn(logits, targets) * weights) for name, fn in metrics.items()}


def forward_sums(params, batch, *, model: nn.Module, compute_dtype,
                 metrics: Mapping[str, Callable], loss_chunk_size: int = 0) -> tuple[dict, Any]:
  """One forward pass of a (micro)batch: (token_sums of `metrics`, what the modules put in the
  "losses" and "metrics" collections).

  `loss_chunk_size` > 0: the LM head and the sums run over chunks of that many positions
  (chunked_loss_sum), never holding the [batch, seq, vocab] logits at once.
  """
  variables = {"params": cast_floats(params, compute_dtype)}
  args = (batch["inputs"], batch.get("positions"), batch.get("segment_ids"))
  weights = batch["weights"].astype(jnp.float32)
  # Named scopes label the compiled ops (`axtrain plan --ops`, profiles): loss, optimizer.
  if loss_chunk_size:
    (x, head), state = model.apply(variables, *args, head=False, mutable=["losses", "metrics"])
    with jax.named_scope("loss"):
      sums = chunked_loss_sum(x, head, batch["targets"], weights, chunk=loss_chunk_size,
                              metrics=metrics)
  else:
    logits, state = model.apply(variables, *args, mutable=["losses", "metrics"])
    with jax.named_scope("loss"):
      sums = token_sums(logits, batch["targets"], weights, metrics=metrics)
  return sums, state


def loss_sums(params, batch, *, model: nn.Module, compute_dtype,
              loss_chunk_size: int = 0, z_loss: float = 0.0) -> tuple[jax.Array, dict]:
  """(sum of token losses + weighted aux losses + z_loss * sum of log(Z)^2, stats) for one
  (micro)batch, in float32: the training objective, whose gradient train_step takes.

  stats: "loss_sum" (the cross-entropy's), "weight_sum", "aux_loss" (the modules' auxiliary
  losses, means), "z_sum" (the weighted sum of log(Z)^2 with `z_loss` > 0, else 0: PaLM's
  z-loss, which keeps the logits from drifting) and "metrics" (what the modules sowed into the
  "metrics" collection, sown_means).
  """
  metrics = {"loss": cross_entropy, **({"z": log_z_squared} if z_loss else {})}
  sums, state = forward_sums(params, batch, model=model, compute_dtype=compute_dtype,
                             metrics=metrics, loss_chunk_size=loss_chunk_size)
  weight_sum = jnp.sum(batch["weights"].astype(jnp.float32))
  aux = sum((jnp.sum(x) for x in jax.tree.leaves(state.get("losses", {}))), jnp.float32(0))
  z_sum = sums.get("z", jnp.float32(0))
  # Aux losses (e.g. MoE load balancing) are means; scale them like the token sum.
  return sums["loss"] + aux * weight_sum + z_loss * z_sum, {
      "loss_sum": sums["loss"], "weight_sum": weight_sum, "aux_loss": aux, "z_sum": z_sum,
      "metrics": sown_means(state.get("metrics", {}))}


def sown_means(collection) -> dict[str, jax.Array]:
  """{name: mean} of the scalars sown under each name, over every module and layer that sowed
  it (a scanned stack sows one per layer). Modules report router statistics this way
  (modules/moe.py) without the step knowing them."""
  groups: dict[str, list] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(collection)[0]:
    name = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)][-1]
    groups.setdefault(name, []).append(leaf)
  return {name: sum(jnp.sum(x) for x in leaves) / sum(x.size for x in leaves)
          for name, leaves in sorted(groups.items())}


def chunked_loss_sum(x_BxLxD, head: LmHead, targets_BxL, weights_BxL, *, chunk: int,
                     metrics: Mapping[str, Callable]) -> dict:
  """token_sums(x @ head, targets, weights, metrics=metrics) over sequence chunks of `chunk`
  positions.

  A scan over chunks whose body is rematerialised: forward and backward each hold one
  chunk's float32 logits [B, chunk, V], and the head's gradient accumulates across chunks.
  Chunk k takes positions k, k + n, k + 2n, ... (n = length / chunk): under context
  parallelism (positions split over devices in contiguous blocks) every chunk is spread over
  all of them, each computing chunk / shards positions, with no data moved.
  """
  b, length = x_BxLxD.shape[:2]
  n = length // chunk
  # The head gathered over its embed axis once for the loop, not once per chunk forward and
  # again backward; its gradient is reduced over the devices once, after the loop. (Its vocab
  # axis keeps the mesh's sharding, e.g. over `model`.)
  head = dataclasses.replace(head, weight_DxV=nn.with_logical_constraint(head.weight_DxV,
                                                                         (None, "vocab")))

  def split(a):  # [B, L, ...] -> [n, B, chunk, ...], chunk k = positions k, k + n, ...
    return jnp.moveaxis(a.reshape(b, chunk, n, *a.shape[2:]), 2, 0)

  @jax.checkpoint
  def body(totals, xs):
    x_BxCxD, targets_BxC, weights_BxC = xs
    logits = head.logits(x_BxCxD)
    logits = nn.with_logical_constraint(logits, ("act_batch", "act_length", "act_vocab"))
    sums = token_sums(logits, targets_BxC, weights_BxC, metrics=metrics)
    return {name: totals[name] + sums[name] for name in totals}, None

  zeros = {name: jnp.float32(0) for name in metrics}  # one carry per metric
  totals, _ = jax.lax.scan(body, zeros, (split(x_BxLxD), split(targets_BxL), split(weights_BxL)))
  return totals


def _microbatches(batch, n: int):
  """[B, ...] -> [n, B/n, ...] where microbatch i takes rows i, i + n, ...

  Strided, not contiguous: each device then holds its share of every microbatch
  (a contiguous split would put a microbatch on only 1/n of the batch shards).
  """
  def split(x):
    x = x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)
    return nn.with_logical_constraint(x, (None, "batch", *(None,) * (x.ndim - 2)))
  return jax.tree.map(split, batch)


def accumulate(params, batch, *, grad_fn, grad_accum_steps: int):
  """(float32 gradients of `params` summed over the batch's microbatches, the loss sums and
  statistics of grad_fn) for one global batch. With compute-dtype `params` (host offload)
  each microbatch's gradient is cast up before it is added: convert(gradient of the cast
  weights) is what the gradient of float32 parameters through that cast is."""
  up_dtype = lambda d: jnp.float32 if jnp.issubdtype(d, jnp.floating) else d
  up = lambda g: g.astype(up_dtype(g.dtype))
  if grad_accum_steps == 1:
    grads, stats = grad_fn(params, batch)
    return jax.tree.map(up, grads), stats

  # Traced once: the accumulator's shapes and the scan's body take the same trace of grad_fn
  # (an inlined jit's traces are cached by their inputs' types). Traced twice, llm_1b's train
  # step for tpu-v5e-1 took 7.9 s to trace on a 2-core CPU; once, 5.2 s (the same ops: the
  # TPU compiler's program differs in operand order, its code by 0.01%).
  grad_fn = jax.jit(grad_fn, inline=True)

  def body(acc, micro):
    g, s = grad_fn(params, micro)
    return jax.tree.map(jnp.add, acc, (jax.tree.map(up, g), s)), None

  micro = _microbatches(batch, grad_accum_steps)
  shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro))
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, up_dtype(s.dtype)), shapes)
  (grads, stats), _ = jax.lax.scan(body, zeros, micro)
  # Means over the microbatches; the loss and weight sums stay sums.
  return grads, dict(stats, aux_loss=stats["aux_loss"] / grad_accum_steps,
                     metrics={k: v / grad_accum_steps for k, v in stats["metrics"].items()})


def train_step(state: TrainState, batch, *, model: nn.Module, optimizer: Optimizer,
               compute_dtype=jnp.float32, grad_accum_steps: int = 1, skip_nonfinite: bool = False,
               loss_chunk_size: int = 0, z_loss: float = 0.0, axes: Any = None):
  """One optimizer step on a global batch; returns (new state, metrics of this step): each
  registered train metric by name (trainer/train_metrics.py), what the modules sowed, and
  "nonfinite".

  metrics["nonfinite"] is 1.0 when the loss or gradient norm is NaN/Inf; with
  `skip_nonfinite` such a step keeps the old parameters and optimizer state
  (the step counter still advances, so the data stream stays aligned).

  A state whose parameters live in host memory (trainer.state_memory="host") is updated
  through the device one parameter at a time (trainer/offload.py), which needs the
  parameters' logical `axes`; the math is the same.
  """
  offloaded = offload.any_on_host(state.params)
  grad_fn = jax.grad(functools.partial(loss_sums, model=model, compute_dtype=compute_dtype,
                                       loss_chunk_size=loss_chunk_size, z_loss=z_loss),
                     has_aux=True)
  weights = (offload.compute_weights(state.params, compute_dtype, axes) if offloaded
             else state.params)
  grads, stats = accumulate(weights, batch, grad_fn=grad_fn, grad_accum_steps=grad_accum_steps)
  denom = jnp.maximum(stats["weight_sum"], 1.0)
  with jax.named_scope("metrics"):
    loss = stats["loss_sum"] / denom
  with jax.named_scope("optimizer"):
    grads = jax.tree.map(lambda g: g / denom, grads)
  with jax.named_scope("metrics"):
    grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  keep_old = (lambda new, old: jnp.where(finite, new, old)) if skip_nonfinite else None
  with jax.named_scope("optimizer"):
    if offloaded:
      params, opt_state, squares = offload.streamed_update(
          optimizer, axes, grads, state.params, state.opt_state, keep_old=keep_old)
      param_norm, update_norm = jnp.sqrt(squares["params"]), jnp.sqrt(squares["updates"])
    else:
      updates, opt_state = optimizer.tx.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
      if keep_old is not None:
        params = jax.tree.map(keep_old, params, state.params)
        opt_state = jax.tree.map(keep_old, opt_state, state.opt_state)
      with jax.named_scope("metrics"):
        param_norm, update_norm = optax.tree.norm(params), optax.tree.norm(updates)
  values = train_metrics.StepValues(
      loss=loss, aux_loss=stats["aux_loss"], z_loss=stats["z_sum"] / denom if z_loss else None,
      grad_norm=grad_norm, param_norm=param_norm, update_norm=update_norm,
      learning_rate=optimizer.schedule(state.step), clip_norm=optimizer.clip_norm)
  # The registered metrics (trainer/train_metrics.py), what the modules sowed (e.g. MoE router
  # statistics), and the flag the loop reads.
  with jax.named_scope("metrics"):
    metrics = {**train_metrics.of_step(values, stats["metrics"]),
               "nonfinite": 1.0 - finite.astype(jnp.float32)}
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch, *, model: nn.Module, compute_dtype=jnp.float32,
              loss_chunk_size: int = 0, microbatches: int = 1) -> dict:
  """Sums over one held-out batch: {"tokens": the sum of the token weights, and for each of
  EVAL_METRICS its name: the sum of weight * metric}, in `microbatches` passes (strided rows,
  as train_step's accumulation) whose sums add up. Sums of several batches add up too;
  eval_record turns them into the evaluation's record."""
  params = offload.to_device(params)

  def sums(micro):
    out, _ = forward_sums(params, micro, model=model, compute_dtype=compute_dtype,
                          metrics=EVAL_METRICS, loss_chunk_size=loss_chunk_size)
    return {**out, "tokens": jnp.sum(micro["weights"].astype(jnp.float32))}

  if microbatches == 1:
    return sums(batch)
  add = lambda acc, micro: (jax.tree.map(jnp.add, acc, sums(micro)), None)
  zeros = {name: jnp.zeros((), jnp.float32) for name in (*EVAL_METRICS, "tokens")}
  totals, _ = jax.lax.scan(add, zeros, _microbatches(batch, microbatches))
  return totals


def eval_record(totals: Mapping[str, float]) -> dict:
  """The record of an evaluation from the sums of eval_step over its batches (host floats):
  `eval_loss`, `eval_perplexity`, `eval_tokens`, and `eval_<name>` for each other metric of
  EVAL_METRICS: means per counted token."""
  tokens = totals["tokens"]
  means = {f"eval_{name}": totals[name] / max(tokens, 1.0) for name in EVAL_METRICS}
  loss = means.pop("eval_loss")
  return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0)),
          "eval_tokens": int(tokens), **means}
