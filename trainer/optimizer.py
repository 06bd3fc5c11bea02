"""Optimizers (registry `optimizer`), built from config and the parameters' logical axes.

Every optimizer is the same frame around its own chain of optax transforms:

    clip the global gradient norm (clip_norm) -> the kind's chain (Adam, Lion, ...), holding
    WEIGHT_DECAY where its + weight_decay * param on weights goes (trainer/param_axes.py)
    -> * -schedule(step)

so clipping, weight decay and the schedule are written once (`_assemble`), and the fields
for them live in `OptimizerConfig`, which each kind's config extends. Weight decay is
decoupled (AdamW): it is multiplied by the learning rate, not by the gradient statistics; a
kind says where it goes in its chain (after its direction for every kind here; a trust ratio,
as LAMB's, goes after it). A transform that reads a statistic over a whole parameter (a norm,
an RMS) goes through `per_layer`, so that it is each layer's over a scanned stack.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Literal, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from core.registry import REQUIRED, Registry, child
from trainer.param_axes import ParamAxes, decay_mask
from trainer.ranges import NON_NEGATIVE, POSITIVE, UNIT, Interval, check_ranges
from trainer.schedules import SCHEDULES

OPTIMIZERS = Registry("optimizer")
__all__ = ["OPTIMIZERS", "SCHEDULES", "WEIGHT_DECAY", "Optimizer", "OptimizerConfig",
           "clip_by_global_norm", "direction", "per_layer"]


@dataclasses.dataclass(frozen=True)
class Optimizer:
  tx: optax.GradientTransformation
  schedule: optax.Schedule  # step -> learning rate, for the metrics
  # tx is chain(clip, *after_clip's parts) when clip_norm is set, else after_clip: its state is
  # (clip's empty state, *after_clip's state) or after_clip's. Host offload (trainer/offload.py)
  # clips over all the gradients at once, then updates one parameter at a time with
  # after_clip of `for_axes(that parameter's axes)`: the same optimizer built for a part of the
  # parameters (a subtree of the logical axes, with the full tree's keys).
  after_clip: optax.GradientTransformation | None = None
  clip_norm: float | None = None
  for_axes: Callable[[Any], "Optimizer"] | None = dataclasses.field(default=None, compare=False)
  # after_clip updates each entry of a parameter from that entry's gradient and state alone
  # (OptimizerConfig.ELEMENTWISE), so it may update a parameter in pieces of rows.
  elementwise: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
  """The fields every optimizer has; each kind's config adds its own."""
  kind: str = REQUIRED
  learning_rate: float = REQUIRED  # peak learning rate; the schedule scales it per step
  schedule: Any = child("schedule")  # learning-rate schedule node (trainer/schedules.py)
  clip_norm: float | None = 1.0  # clip the global L2 norm of the gradients to this; None = off
  weight_decay: float = 0.1  # decoupled, times the learning rate; weights only, never norms/biases
  decay_embeddings: bool = True  # also decay the token table and learned positions
  state_dtype: Literal["float32", "bfloat16"] = "float32"  # dtype of the momentum state
  RANGES: ClassVar = {"learning_rate": POSITIVE, "weight_decay": NON_NEGATIVE,
                      "clip_norm": POSITIVE}
  # Whether the kind's update of an entry reads that entry's gradient and state alone (Adam,
  # Lion, SGD), not statistics over a parameter's rows or columns (Adafactor) or the whole
  # matrix (Muon): host offload then streams a parameter in pieces (trainer/offload.py).
  ELEMENTWISE: ClassVar = False
  # What a switch to another optimizer keeps; a kind's own fields (b1, b2, eps...) take the
  # new kind's defaults even where the names agree (core/registry.py).
  SHARED: ClassVar = ("learning_rate", "schedule", "clip_norm", "weight_decay",
                      "decay_embeddings", "state_dtype")

  def check(self, *, total_steps: int, axes: Any):
    del total_steps, axes
    check_ranges(self, "optimizer")


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """optax.clip_by_global_norm as one scalar factor on every gradient.

  optax selects between the clipped and unclipped tree (lax.select), which XLA on
  CPU does not fuse into the Adam update: the optimizer step took twice as long
  (0.49 s against 0.24 s for 79M parameters). Unclipped gradients are unchanged
  (x * 1.0); clipped ones may differ from optax in the last bit.
  """
  def update(updates, state, params=None):
    del params
    norm = optax.tree.norm(updates)
    scale = jnp.where(norm < max_norm, 1.0, max_norm / norm)
    return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

  return optax.GradientTransformation(optax.init_empty_state, update)


class _Slot:
  """A place in a kind's chain that `_assemble` fills."""

  def __init__(self, name: str):
    self.name = name

  def __repr__(self) -> str:
    return self.name


# Where a kind's chain takes the decoupled weight decay (+ weight_decay * param on weights).
WEIGHT_DECAY = _Slot("WEIGHT_DECAY")


def _assemble(cfg: OptimizerConfig, chain: Sequence, *, total_steps: int,
              axes: Any) -> Optimizer:
  """The optimizer whose update is `chain` (optax transforms, in order, holding WEIGHT_DECAY
  once: where the weight decay goes), after the global clip and before -schedule(step) (see
  the module docstring)."""
  if sum(part is WEIGHT_DECAY for part in chain) != 1:
    raise ValueError(f"optimizer {cfg.kind!r}: its chain must hold WEIGHT_DECAY once, where "
                     f"its weight decay goes")
  schedule = SCHEDULES.build(cfg.schedule, peak=cfg.learning_rate, total_steps=total_steps)
  clip = [] if cfg.clip_norm is None else [clip_by_global_norm(cfg.clip_norm)]
  decay = optax.add_decayed_weights(cfg.weight_decay, decay_mask(
      axes, decay_embeddings=cfg.decay_embeddings))
  parts = [decay if part is WEIGHT_DECAY else part for part in chain]
  parts.append(optax.scale_by_learning_rate(schedule))
  return Optimizer(optax.chain(*clip, *parts), schedule, after_clip=optax.chain(*parts),
                   clip_norm=cfg.clip_norm, elementwise=cfg.ELEMENTWISE,
                   for_axes=lambda sub: OPTIMIZERS.build(cfg, total_steps=total_steps, axes=sub))


def direction(kind: str, config_cls: type) -> Callable:
  """Registers the optimizer `kind` whose chain is its direction, then the weight decay: the
  decorated `fn(cfg, axes)` returns the direction (an optax transform). A kind that takes its
  weight decay elsewhere registers a factory that calls `_assemble` itself."""
  def register(fn: Callable) -> Callable:
    @OPTIMIZERS.register(kind, config_cls)
    def build(*, cfg: OptimizerConfig, total_steps: int, axes: Any) -> Optimizer:
      return _assemble(cfg, [fn(cfg, axes), WEIGHT_DECAY], total_steps=total_steps, axes=axes)
    return fn
  return register


def per_layer(tx: optax.GradientTransformation, axes: Any) -> optax.GradientTransformation:
  """`tx` on each parameter alone and, over a stack, on each layer alone.

  A transform whose update of a parameter reads a statistic over the whole parameter (a norm,
  an RMS, Adafactor's row and column means, a trust ratio) must take it per layer over a
  scanned stack, or a scanned model trains otherwise than the same model unrolled: `tx` is
  vmapped over the parameter's leading stack axes (`layers`, `experts`:
  trainer/param_axes.py:STACK_AXES), each copy on its own as a separate parameter would be.
  Every such transform goes through here; tests/test_optimizer_stacks.py trains every
  optimizer kind scanned and unrolled and compares.

  `axes`: the parameters' logical axes (trainer/param_axes.py:logical_axes). The state is a
  tree shaped like the parameters holding, at each parameter, `tx`'s state of it with a
  leading axis per stack axis (step counts too); a state array shaped like its parameter
  carries the parameter's logical axis names, the others are replicated.
  """
  is_box = lambda x: isinstance(x, nn.Partitioned)

  def lifted(fn, a: ParamAxes):
    for _ in range(a.stack_depth()):
      fn = jax.vmap(fn)
    return fn

  def init(params):
    boxes, treedef = jax.tree.flatten(params, is_leaf=is_box)
    states = []
    for box, a in zip(boxes, treedef.flatten_up_to(axes)):
      value = box.value if is_box(box) else box  # boxed with its axis names at init
      state = lifted(tx.init, a)(value)
      if is_box(box):
        state = jax.tree.map(lambda x, b=box, v=value: b.replace_boxed(x)
                             if x.shape == v.shape else x, state)
      states.append(state)
    return jax.tree.unflatten(treedef, states)

  def update(updates, state, params=None):
    leaves, treedef = jax.tree.flatten(updates)
    params = [None] * len(leaves) if params is None else treedef.flatten_up_to(params)
    out = [lifted(tx.update, a)(u, s, p) for u, s, p, a in zip(
        leaves, treedef.flatten_up_to(state), params, treedef.flatten_up_to(axes))]
    return (jax.tree.unflatten(treedef, [u for u, _ in out]),
            jax.tree.unflatten(treedef, [s for _, s in out]))

  return optax.GradientTransformation(init, update)


_BETAS = {"b1": UNIT, "b2": UNIT, "eps": POSITIVE}


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdamWConfig(OptimizerConfig):
  kind: str = "adamw"
  b1: float = 0.9  # first-moment decay, [0, 1)
  b2: float = 0.95  # second-moment decay, [0, 1)
  eps: float = 1e-8  # added to the denominator sqrt(second moment)
  RANGES: ClassVar = {**OptimizerConfig.RANGES, **_BETAS}
  ELEMENTWISE: ClassVar = True


def scale_by_adam(b1: float, b2: float, eps: float, mu_dtype) -> optax.GradientTransformation:
  """optax.scale_by_adam (its state too), the bias corrections applied as factors:
  mu * (1 / (1 - b1^t)) / (sqrt(nu * (1 / (1 - b2^t))) + eps).

  optax divides by the corrections: mu / (1 - b1^t) / (sqrt(nu / (1 - b2^t)) + eps), which
  XLA rewrites by how many arrays share the scalar (CPU: A / broadcast(B) => A * (1 / B)
  where B has one use; every backend: (A / B) / C => A / (B * C)). The whole tree shares one
  correction; host offload updates one parameter at a time, each with its own
  (trainer/offload.py): the two rounded the direction differently (up to 3 float32 ulps) and
  the runs drifted apart. Written as factors, there is nothing left to rewrite."""
  def update(updates, state, params=None):
    del params
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    count = optax.safe_increment(state.count)
    c1, c2 = 1 / (1 - b1 ** count), 1 / (1 - b2 ** count)
    direction = jax.tree.map(
        lambda m, v: m * c1.astype(m.dtype) / (jnp.sqrt(v * c2.astype(v.dtype)) + eps), mu, nu)
    return direction, optax.ScaleByAdamState(count=count, mu=optax.tree.cast(mu, mu_dtype),
                                             nu=optax.tree.cast_like(nu, state.nu))

  return optax.GradientTransformation(optax.scale_by_adam(mu_dtype=mu_dtype).init, update)


@direction("adamw", AdamWConfig)
def adamw(cfg: AdamWConfig, axes: Any) -> optax.GradientTransformation:
  del axes
  return scale_by_adam(cfg.b1, cfg.b2, cfg.eps, jnp.dtype(cfg.state_dtype))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LionConfig(OptimizerConfig):
  """Lion's update is a sign (size 1 per entry): use a 3-10x smaller learning rate than AdamW."""
  kind: str = "lion"
  b1: float = 0.9  # interpolation between momentum and gradient for the sign, [0, 1)
  b2: float = 0.99  # momentum decay, [0, 1)
  RANGES: ClassVar = {**OptimizerConfig.RANGES, "b1": UNIT, "b2": UNIT}
  ELEMENTWISE: ClassVar = True


@direction("lion", LionConfig)
def lion(cfg: LionConfig, axes: Any) -> optax.GradientTransformation:
  del axes
  return optax.scale_by_lion(b1=cfg.b1, b2=cfg.b2, mu_dtype=jnp.dtype(cfg.state_dtype))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SgdConfig(OptimizerConfig):
  kind: str = "sgd"
  momentum: float = 0.9  # decay of the momentum (heavy ball) trace, [0, 1); 0 = plain SGD
  nesterov: bool = False  # Nesterov momentum
  RANGES: ClassVar = {**OptimizerConfig.RANGES, "momentum": UNIT}
  ELEMENTWISE: ClassVar = True


@direction("sgd", SgdConfig)
def sgd(cfg: SgdConfig, axes: Any) -> optax.GradientTransformation:
  del axes
  return optax.trace(decay=cfg.momentum, nesterov=cfg.nesterov,
                     accumulator_dtype=jnp.dtype(cfg.state_dtype))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdafactorConfig(OptimizerConfig):
  """Adafactor (Shazeer & Stern 2018): second moments kept as row and column averages."""
  kind: str = "adafactor"
  factored: bool = True  # factor the second moments of matrices; False = full, like Adam
  decay_rate: float = 0.8  # second-moment decay is 1 - (step + 1) ** -decay_rate, (0, 1]
  decay_offset: int = 0  # steps added to the step count in that decay
  min_dim_size_to_factor: int = 128  # factor only when both largest dims are at least this
  eps: float = 1e-30  # added to the squared gradients
  clipping_threshold: float | None = 1.0  # clip each update's RMS to this; None = off
  multiply_by_parameter_scale: bool = False  # scale updates by each parameter's RMS
  momentum: float | None = None  # first-moment decay, [0, 1); None = no first moment (memory)
  RANGES: ClassVar = {**OptimizerConfig.RANGES, "decay_rate": Interval(0, 1, low_closed=False,
                                                                      high_closed=True),
                      "decay_offset": NON_NEGATIVE, "min_dim_size_to_factor": Interval(1),
                      "eps": POSITIVE, "clipping_threshold": POSITIVE, "momentum": UNIT}


@direction("adafactor", AdafactorConfig)
def adafactor(cfg: AdafactorConfig, axes: Any) -> optax.GradientTransformation:
  parts = [optax.scale_by_factored_rms(cfg.factored, cfg.decay_rate, cfg.decay_offset,
                                       cfg.min_dim_size_to_factor, cfg.eps)]
  if cfg.clipping_threshold is not None:
    parts.append(optax.clip_by_block_rms(cfg.clipping_threshold))
  if cfg.multiply_by_parameter_scale:
    parts.append(optax.scale_by_param_block_rms())
  if cfg.momentum is not None:
    parts.append(optax.ema(cfg.momentum, debias=False,
                           accumulator_dtype=jnp.dtype(cfg.state_dtype)))
  # Row and column means and the RMS clip and scale are statistics of each layer's matrix.
  return per_layer(optax.chain(*parts), axes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MuonConfig(OptimizerConfig):
  """Muon (Jordan et al. 2024) on hidden weight matrices, AdamW on everything else.

  Which parameters are matrices, and their input and output axes, come from their logical
  axis names (trainer/param_axes.py); the layer stack and experts are batch axes.
  """
  kind: str = "muon"
  beta: float = 0.95  # momentum decay, [0, 1)
  nesterov: bool = True  # Nesterov momentum (also for the AdamW part, as in optax)
  ns_steps: int = 5  # Newton-Schulz iterations that orthogonalize the momentum
  consistent_rms: float | None = 0.2  # scale updates to this RMS x sqrt(max(fan_in, fan_out)),
  # so one learning rate suits both parts (Liu et al. 2025); None = sqrt(max(1, out / in))
  adam_b1: float = 0.9  # AdamW part: first-moment decay, [0, 1)
  adam_b2: float = 0.95  # AdamW part: second-moment decay, [0, 1)
  eps: float = 1e-8  # added to denominators (Newton-Schulz normalization and AdamW)
  RANGES: ClassVar = {**OptimizerConfig.RANGES, "beta": UNIT, "ns_steps": Interval(1),
                      "consistent_rms": POSITIVE, "adam_b1": UNIT, "adam_b2": UNIT,
                      "eps": POSITIVE}


def muon_dimension_numbers(axes: Any) -> Any:
  """Per parameter: optax MuonDimensionNumbers for Muon's matrices, None for the AdamW part."""
  def dims(a):
    if not a.uses_muon:
      return None
    reduction, output = a.muon_axes()
    return optax.contrib.MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)
  return jax.tree.map(dims, axes)


@direction("muon", MuonConfig)
def muon(cfg: MuonConfig, axes: Any) -> optax.GradientTransformation:
  # optax's muon at learning rate 1 and no weight decay gives minus the direction.
  return optax.chain(
      optax.contrib.muon(
          1.0, ns_steps=cfg.ns_steps, beta=cfg.beta, eps=cfg.eps, weight_decay=0.0,
          mu_dtype=jnp.dtype(cfg.state_dtype), nesterov=cfg.nesterov, adam_b1=cfg.adam_b1,
          adam_b2=cfg.adam_b2, adam_weight_decay=0.0, consistent_rms=cfg.consistent_rms,
          muon_weight_dimension_numbers=muon_dimension_numbers(axes)),
      optax.scale(-1.0))
