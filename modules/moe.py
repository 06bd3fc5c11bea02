"""Mixture-of-experts feed-forward (`ffn` kind `moe`), a drop-in for the dense MLP.

A linear router scores the experts per token; each token goes to its `top_k`
experts and their outputs are summed with the router weights. The
load-balancing loss of Switch Transformer (Fedus et al. 2021, eq. 4),
num_experts * sum_e(fraction of routed tokens_e * mean router prob_e), is 1 for
balanced routing and grows as routing concentrates on few experts; `aux_loss_coef` times it is sown into
the "losses" collection, which the training loss adds.

Dispatch, per sequence (a group of L tokens):
  capacity_factor > 0: each expert takes at most C = ceil(capacity_factor * L *
    top_k / num_experts) tokens; tokens past it, in token order, are dropped
    from that expert (their output from it is zero; the residual carries them).
    Token order keeps a decoder causal (GShard's first-choices-first order
    would let a later token evict an earlier one). One-hot dispatch and
    combine einsums, so expert weights shard on `experts`.
  capacity_factor = 0: dropless. Every expert runs on every token and the
    outputs are combined with the (mostly zero) router weights: exact, at
    num_experts / top_k times the FLOPs of capacity dispatch.

Expert parallelism (`expert_parallel`): when the logical rules in force put the `experts`
axis on mesh axes of more than one device (`--config.mesh.expert=N`), each device holds
num_experts / N whole experts, and the dispatched slots [B, E, C, D] travel to the devices
that own their experts and back by two all-to-alls under `jax.shard_map`; routing, dispatch
and combine stay outside it, on the batch shards, so results equal the one-device run.
Capacity, not a ragged exchange: every slot buffer has a static shape and the all-to-all
lowers on CPU, GPU and TPU (XLA:CPU has no ragged-all-to-all, so fake-device tests could not
run a dropless ragged exchange); the price is the capacity padding and the dropped tokens
(docs/parallelism.md).

Router metrics go to the "metrics" collection (the step reports each sown scalar's mean):
`moe_tokens_per_expert/<e>`, the share of routed (token, choice) pairs that chose expert e
(1 / num_experts when balanced), and `moe_dropped_fraction`, the share dropped for want of
capacity.
"""

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from modules import context
from modules.mlp import ACTIVATIONS, FFN, Activation
from core.registry import REQUIRED, ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeConfig:
  kind: str = "moe"
  num_experts: int = REQUIRED  # experts (each a dense MLP)
  top_k: int = 2  # experts per token
  hidden_dim: int = REQUIRED  # hidden width of each expert
  activation: Activation = "silu"  # a name of modules/mlp.py:ACTIVATIONS
  gated: bool = True  # experts are SwiGLU (act(x W_gate) * x W_up) like Mixtral
  capacity_factor: float = 1.25  # expert capacity as a multiple of an even share; 0 = dropless
  renormalize: bool = True  # top-k router weights rescaled to sum to 1 (Mixtral)
  aux_loss_coef: float = 0.01  # weight of the load-balancing loss in the training loss
  init_std: float = 0.02  # stddev of the normal initialiser
  SHARED: ClassVar = ("hidden_dim", "activation", "gated", "init_std")  # as mlp's

  def check(self, *, dim: int):
    if not self.init_std >= 0 or math.isinf(self.init_std):
      raise ConfigError(f"moe.init_std must be a finite number >= 0, got {self.init_std}")
    if self.num_experts <= 0 or self.hidden_dim <= 0:
      raise ConfigError(f"moe: num_experts ({self.num_experts}) and hidden_dim "
                        f"({self.hidden_dim}) must be positive")
    if not 1 <= self.top_k <= self.num_experts:
      raise ConfigError(f"moe: top_k {self.top_k} must be between 1 and num_experts "
                        f"{self.num_experts}")
    for name, what in (("capacity_factor", "0 = dropless"), ("aux_loss_coef", "0 = off")):
      value = getattr(self, name)
      if not 0 <= value < math.inf:
        raise ConfigError(f"moe.{name} must be a finite number >= 0 ({what}), got {value}")

  def capacity(self, length: int) -> int:
    return min(length, math.ceil(self.capacity_factor * length * self.top_k / self.num_experts))


def load_balancing_loss(probs_BxLxE, chosen_BxLxKxE):
  """num_experts * sum_e f_e * P_e (1 when balanced); f counts top-k choices, each 1/k."""
  num_experts = probs_BxLxE.shape[-1]
  fraction_E = jnp.mean(jnp.sum(chosen_BxLxKxE, axis=2), axis=(0, 1)) / chosen_BxLxKxE.shape[2]
  mean_prob_E = jnp.mean(probs_BxLxE, axis=(0, 1))
  return num_experts * jnp.sum(fraction_E * mean_prob_E)


def _expert_mlp(x_BxExCxD, w_in, w_up, w_out, act, constrain=lambda h: h):
  """Each expert's MLP on its slots: [B, E, C, D] with weights [E, D, F] ([E, F, D] out)."""
  h = act(jnp.einsum("becd,edf->becf", x_BxExCxD, w_in))
  if w_up is not None:
    h = h * jnp.einsum("becd,edf->becf", x_BxExCxD, w_up)
  return jnp.einsum("becf,efd->becd", constrain(h), w_out)


def _mesh_axes(logical: tuple, mesh) -> list[tuple[str, ...]]:
  """Per dimension, the mesh axes of more than one device that the logical rules in force
  map `logical` to."""
  out = []
  for axes in nn.logical_to_mesh_axes(logical):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    out.append(tuple(a for a in names if mesh.shape.get(a, 1) > 1))
  return out


def _size(axes: tuple[str, ...], mesh) -> int:
  return math.prod(mesh.shape[a] for a in axes)


def expert_parallel(x_BxExCxD, w_in, w_up, w_out, act):
  """The experts' MLP with expert parallelism, or None where the mesh and rules give none.

  Under `jax.shard_map`, with the mesh axes read from the logical rules in force: `experts`
  on the weights gives the expert axes X (each device holds E/X whole experts), `act_batch`
  the axes the tokens are split over, which must include X. One all-to-all over X sends each
  device's slots for expert e to the device that holds e ([b, E, C, D] -> [b*X, E/X, C, D]),
  the experts run there, and a second all-to-all returns the outputs. The weights enter as
  stored: their `embed` side is all-gathered inside (FSDP; the backward pass reduce-scatters
  their gradients), their `mlp` side stays split (tensor parallel: partial sums added). The
  slots split over the axes of `act_length` (context parallelism).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  expert_axes, embed_axes, mlp_axes = _mesh_axes(("experts", "embed", "mlp"), mesh)
  batch_axes = _mesh_axes(("act_batch",), mesh)[0]
  b, e = x_BxExCxD.shape[:2]
  if (not expert_axes or not set(expert_axes) <= set(batch_axes)
      or b % _size(batch_axes, mesh) or e % _size(expert_axes, mesh)):
    return None  # no expert axis in the rules in force: the compiler partitions the einsums
  d, f = w_in.shape[1:]
  embed_axes = embed_axes if d % _size(embed_axes, mesh) == 0 else ()
  mlp_axes = mlp_axes if f % _size(mlp_axes, mesh) == 0 else ()
  ep = expert_axes if len(expert_axes) > 1 else expert_axes[0]

  def local(x, w_in, w_up, w_out):
    if embed_axes:
      gather = lambda w, axis: jax.lax.all_gather(w, embed_axes, axis=axis, tiled=True)
      w_in, w_out = gather(w_in, 1), gather(w_out, 2)
      w_up = None if w_up is None else gather(w_up, 1)
    x = jax.lax.all_to_all(x, ep, split_axis=1, concat_axis=0, tiled=True)
    y = _expert_mlp(x, w_in, w_up, w_out, act)
    if mlp_axes:
      y = jax.lax.psum(y, mlp_axes)
    return jax.lax.all_to_all(y, ep, split_axis=0, concat_axis=1, tiled=True)

  # Under context parallelism each sequence's slots are split over the context axes too (the
  # slot buffer padded with empty slots to a multiple of them), so the context devices share
  # the experts' work rather than each doing all of it.
  length_axes = tuple(a for a in _mesh_axes(("act_length",), mesh)[0] if a not in batch_axes)
  c = x_BxExCxD.shape[2]
  pad = -c % _size(length_axes, mesh) if length_axes else 0
  if pad:
    x_BxExCxD = jnp.pad(x_BxExCxD, ((0, 0), (0, 0), (0, pad), (0, 0)))
  x_spec = jax.P(batch_axes, None, length_axes or None, None)
  w_in_spec = jax.P(expert_axes, embed_axes or None, mlp_axes or None)
  w_out_spec = jax.P(expert_axes, mlp_axes or None, embed_axes or None)
  return jax.shard_map(local, in_specs=(x_spec, w_in_spec, None if w_up is None else w_in_spec,
                                        w_out_spec), out_specs=x_spec)(
      x_BxExCxD, w_in, w_up, w_out)[:, :, :c]


def route(x_BxLxD, router_DxE, *, top_k: int, renormalize: bool):
  """(router probabilities [B, L, E], the top-k gates [B, L, K], the chosen experts one-hot
  [B, L, K, E]), scored in float32."""
  logits_BxLxE = jnp.einsum("bld,de->ble", x_BxLxD.astype(jnp.float32),
                            router_DxE.astype(jnp.float32))
  probs_BxLxE = jax.nn.softmax(logits_BxLxE, axis=-1)
  gates_BxLxK, experts_BxLxK = jax.lax.top_k(probs_BxLxE, top_k)
  if renormalize:
    gates_BxLxK = gates_BxLxK / jnp.sum(gates_BxLxK, axis=-1, keepdims=True)
  return probs_BxLxE, gates_BxLxK, jax.nn.one_hot(experts_BxLxK, router_DxE.shape[-1],
                                                  dtype=jnp.float32)


def capacity_slots(chosen_BxLxKxE, gates_BxLxK, capacity: int):
  """(dispatch [B, L, E, C], combine [B, L, E, C], the share of (token, choice) pairs
  dropped): each (token, choice) takes the next slot of its expert's queue, in token order, and
  is dropped past `capacity` slots.

  A token's slot depends only on earlier tokens, so routing stays causal. Under context
  parallelism the sequence arrives in the load-balanced layout (modules/context.py): the
  queues are counted in the original order, so the same tokens are dropped as on one device.
  """
  b, length, k, e = chosen_BxLxKxE.shape
  _, shards = context.shards()
  natural_BxLxKxE = context.unzigzag(chosen_BxLxKxE, shards) if shards > 1 else chosen_BxLxKxE
  chosen_BxLKxE = natural_BxLxKxE.reshape(b, length * k, e)
  slot_BxLxKxE = (jnp.cumsum(chosen_BxLKxE, axis=1) * chosen_BxLKxE - 1).reshape(
      b, length, k, e)
  slot_BxLxK = jnp.sum(slot_BxLxKxE * natural_BxLxKxE, axis=-1).astype(jnp.int32)
  if shards > 1:
    slot_BxLxK = context.zigzag(slot_BxLxK, shards)
  kept_BxLxK = slot_BxLxK < capacity
  # one_hot of an out-of-range slot is all zeros: dropped tokens dispatch nowhere.
  slots_BxLxKxC = jax.nn.one_hot(jnp.where(kept_BxLxK, slot_BxLxK, capacity), capacity,
                                 dtype=jnp.float32)
  dispatch_BxLxExC = jnp.einsum("blke,blkc->blec", chosen_BxLxKxE, slots_BxLxKxC)
  combine_BxLxExC = jnp.einsum("blke,blkc,blk->blec", chosen_BxLxKxE, slots_BxLxKxC,
                               gates_BxLxK)
  return dispatch_BxLxExC, combine_BxLxExC, 1 - jnp.mean(kept_BxLxK.astype(jnp.float32))


@FFN.register("moe", MoeConfig)
class Moe(nn.Module):
  cfg: MoeConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.cfg
    e, f, d = cfg.num_experts, cfg.hidden_dim, self.dim
    init = nn.initializers.normal(cfg.init_std)
    router = self.param("router", nn.with_logical_partitioning(init, ("embed", None)), (d, e))
    probs_BxLxE, gates_BxLxK, chosen_BxLxKxE = route(x_BxLxD, router, top_k=cfg.top_k,
                                                     renormalize=cfg.renormalize)
    self.sow("losses", "moe_load_balancing",
             cfg.aux_loss_coef * load_balancing_loss(probs_BxLxE, chosen_BxLxKxE))

    def weight(name, shape, axes):
      return self.param(name, nn.with_logical_partitioning(init, axes), shape).astype(
          x_BxLxD.dtype)

    w_in = weight("wi", (e, d, f), ("experts", "embed", "mlp"))
    w_up = weight("wu", (e, d, f), ("experts", "embed", "mlp")) if cfg.gated else None
    w_out = weight("wo", (e, f, d), ("experts", "mlp", "embed"))
    act = ACTIVATIONS[cfg.activation]

    def experts(x_BxExCxD):
      x_BxExCxD = nn.with_logical_constraint(x_BxExCxD, ("act_batch", "act_experts", None,
                                                         "act_embed"))
      y = expert_parallel(x_BxExCxD, w_in, w_up, w_out, act)
      if y is not None:
        return y
      return _expert_mlp(x_BxExCxD, w_in, w_up, w_out, act, constrain=lambda h: (
          nn.with_logical_constraint(h, ("act_batch", "act_experts", None, "act_mlp"))))

    # Router metrics, means over the batch (the step reports each sown scalar's mean over
    # layers): the share of routed tokens each expert is chosen for (1/E when balanced), and
    # the share of (token, choice) pairs dropped for want of capacity.
    share_E = jnp.mean(jnp.sum(chosen_BxLxKxE, axis=2), axis=(0, 1)) / cfg.top_k
    for i in range(e):
      self.sow("metrics", f"moe_tokens_per_expert/{i}", share_E[i])

    if cfg.capacity_factor == 0:
      self.sow("metrics", "moe_dropped_fraction", jnp.float32(0))
      combine_BxLxE = jnp.einsum("blk,blke->ble", gates_BxLxK, chosen_BxLxKxE)
      x_BxExLxD = jnp.broadcast_to(x_BxLxD[:, None], (x_BxLxD.shape[0], e, *x_BxLxD.shape[1:]))
      y_BxExLxD = experts(x_BxExLxD)
      return jnp.einsum("ble,beld->bld", combine_BxLxE.astype(y_BxExLxD.dtype), y_BxExLxD)

    dispatch_BxLxExC, combine_BxLxExC, dropped = capacity_slots(
        chosen_BxLxKxE, gates_BxLxK, cfg.capacity(x_BxLxD.shape[1]))
    self.sow("metrics", "moe_dropped_fraction", dropped)
    x_BxExCxD = jnp.einsum("blec,bld->becd", dispatch_BxLxExC.astype(x_BxLxD.dtype), x_BxLxD)
    y_BxExCxD = experts(x_BxExCxD)
    return jnp.einsum("blec,becd->bld", combine_BxLxExC.astype(y_BxExCxD.dtype), y_BxExCxD)
