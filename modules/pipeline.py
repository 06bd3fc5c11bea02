"""Pipeline parallelism: the scanned layer stack cut into stages over the mesh axes of `layers`.

Which mesh axes those are (the `stage` axis in trainer/meshes.py) comes from the logical rules
and the mesh in force (`jax.set_mesh`), as in modules/attn_splash.py; with none, or one of size 1,
`modules/decoder.py:DecoderLM` scans its layers as usual.

The parameters keep their shape: the stack [layers, ...] that `nn.scan` makes, its leading
axis split over the S stages, so stage s holds layers s*L/S ... (s+1)*L/S - 1 (a checkpoint
restores into a mesh with or without stages). The schedule is GPipe's (Huang et al. 2019): the
batch is cut into M microbatches (rows m, m+M, ...: every data shard keeps its share of each);
at tick t stage s runs its layers on microbatch t - s and passes the result to stage s + 1
with `ppermute`; after M + S - 1 ticks the last stage holds every microbatch's output. Each
stage idles (computes on nothing) for S - 1 of the ticks: the bubble, a fraction
(S - 1) / (M + S - 1) of the step. The backward pass is the autodiff of the same loop, the
transposed ppermutes running the stages in reverse. Inside a stage the other mesh axes (data,
fsdp, context, model) stay with the compiler, so FSDP gathers each layer as it runs.

Outside the stages (embedding, final norm, LM head, loss) the stage axes split the batch like
data parallelism (trainer/meshes.py maps `batch` and `act_batch` to them too): stage 0 gathers
the rows of every stage before the first tick, and the last stage's outputs are spread back
over the stages after the last one. Inside, the rules in force drop the stage axes (`without`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from core.registry import ConfigError
from modules import context


def stages() -> tuple[tuple[str, ...], int]:
  """(mesh axes, stage count) of the layer stack in force; ((), 1) when not split."""
  return context.split("layers")


def without(axes: tuple[str, ...]):
  """The logical rules in force with `axes` taken out of every mapping (inside the stages they
  are manual; the batch, split over them outside, is whole in each stage)."""
  def drop(target):
    if target is None or isinstance(target, str):
      return None if target in axes else target
    kept = tuple(a for a in target if a not in axes)
    return kept or None
  return tuple((name, drop(target)) for name, target in nn.get_logical_axis_rules())


def bubble(stage_count: int, microbatches: int) -> float:
  """GPipe's idle fraction of a step: (S - 1) / (M + S - 1)."""
  return (stage_count - 1) / (microbatches + stage_count - 1)


def check(*, num_layers: int, repeats: int, scan_layers: bool, stage_count: int,
          batch: int, microbatches: int) -> None:
  """The stack must be scanned and split evenly (a block group's repeats whole), the batch into
  whole microbatches."""
  if stage_count <= 1:
    return
  if not scan_layers:
    raise ConfigError(f"{stage_count} pipeline stages split the scanned layer stack, but "
                      f"model.scan_layers is False; set --config.model.scan_layers=true")
  if repeats % stage_count:
    groups = "" if repeats == num_layers else f", {repeats} repeats of its block group"
    raise ConfigError(f"{stage_count} pipeline stages must divide model.num_layers "
                      f"({num_layers}{groups}) into equal groups; pick a divisor")
  if batch % microbatches:
    raise ConfigError(f"the pipeline's {microbatches} microbatches "
                      f"(model.pipeline_microbatches) must divide the batch of {batch} rows")


def gpipe(layer_fn, params, x_BxLxD, extras, *, axes: tuple[str, ...], stage_count: int,
          microbatches: int):
  """All layers of the stack `params` (leaves [layers, ...]) applied to `x_BxLxD` as a pipeline.

  `layer_fn(layer_params, x_BxLxD, extras) -> (x_BxLxD, aux)` applies one layer; `extras` is a
  pytree of [B, ...] arrays each layer reads (positions, segment ids); `aux` a pytree of
  scalars (the layer's losses, its metrics). Returns the output and each aux leaf summed over
  layers, averaged over microbatches.
  """
  m = microbatches
  rules = without(axes)
  split = lambda a: _microbatches(a, m, rules)
  # The input is stage 0's alone: the other stages get zeros in its place (they read what the
  # stage before them sends), so its gradient is stage 0's, with no sum over stages.
  xs = split(x_BxLxD)
  xs = jnp.concatenate([xs[None], jnp.zeros((stage_count - 1, *xs.shape), xs.dtype)])
  extras = jax.tree.map(split, extras)

  def run(params, xs, extras):
    with nn.logical_axis_rules(rules):
      return _stages_loop(layer_fn, params, xs[0], extras, axes=axes, stage_count=stage_count,
                          microbatches=m)

  spec = jax.P(axes)
  outputs, aux = jax.shard_map(run, in_specs=(spec, spec, jax.P()), out_specs=(spec, spec),
                               axis_names=set(axes), check_vma=False)(params, xs, extras)
  # The last stage's outputs, whose rows the caller's constraints spread over the stages again.
  y = outputs[-1].swapaxes(0, 1).reshape(x_BxLxD.shape)
  return y, jax.tree.map(lambda a: jnp.sum(a, axis=0) / m, aux)


def _microbatches(a, m: int, rules):
  """[B, ...] -> [M, B/M, ...], microbatch i = rows i, i + M, ...; under `rules` (the rows of
  every stage)."""
  a = a.reshape(a.shape[0] // m, m, *a.shape[1:]).swapaxes(0, 1)
  names = ("act_batch", "act_length", "act_embed")[:a.ndim - 1]
  with nn.logical_axis_rules(rules):
    return nn.with_logical_constraint(a, (None, *names))


def _stages_loop(layer_fn, params, xs, extras, *, axes, stage_count: int, microbatches: int):
  """One stage's part of the GPipe schedule (inside `jax.shard_map` over the stage axes): its
  layers `params` on microbatch t - s at tick t, what it computed sent to the next stage.
  Returns its outputs and aux sums with a leading stage axis of 1."""
  m = microbatches
  s = jax.lax.axis_index(axes)
  ticks = m + stage_count - 1

  def stage(x, extra):
    x, aux = jax.lax.scan(lambda x, p: layer_fn(p, x, extra), x, params)
    return x, jax.tree.map(lambda a: jnp.sum(a, axis=0), aux)

  def tick(carry, t):
    received, outputs, aux = carry
    i = t - s  # the microbatch at this stage now
    valid = (i >= 0) & (i < m)
    i = jnp.clip(i, 0, m - 1)
    take = lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False)
    x = jnp.where(s == 0, take(xs), received)
    y, a = stage(x, jax.tree.map(take, extras))
    aux = jax.tree.map(lambda total, new: total + jnp.where(valid, new, 0.0), aux, a)
    done = valid & (s == stage_count - 1)
    outputs = jax.lax.dynamic_update_index_in_dim(outputs, jnp.where(done, y, take(outputs)),
                                                  i, 0)
    sent = jax.lax.ppermute(y, axes, [(j, j + 1) for j in range(stage_count - 1)])
    return (sent, outputs, aux), None

  aux_shape = jax.eval_shape(lambda: stage(xs[0], jax.tree.map(lambda a: a[0], extras))[1])
  zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), aux_shape)
  start = (jnp.zeros_like(xs[0]), jnp.zeros_like(xs), zeros)
  (_, outputs, aux), _ = jax.lax.scan(tick, start, jnp.arange(ticks))
  # Only the last stage's outputs are filled; every stage returns its own (mapped over the
  # stage axes) and the caller keeps the last: no replication claim for autodiff to undo.
  return outputs[None], jax.tree.map(lambda a: a[None], aux)
