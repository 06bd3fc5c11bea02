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
"""

import dataclasses
import math
from typing import ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from modules.mlp import ACTIVATIONS, FFN
from core.registry import REQUIRED, ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeConfig:
  kind: str = "moe"
  num_experts: int = REQUIRED  # experts (each a dense MLP)
  top_k: int = 2  # experts per token
  hidden_dim: int = REQUIRED  # hidden width of each expert
  activation: Literal["silu", "gelu", "gelu_tanh", "relu"] = "silu"
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
    if self.capacity_factor < 0 or self.aux_loss_coef < 0:
      raise ConfigError("moe: capacity_factor and aux_loss_coef must be >= 0")

  def capacity(self, length: int) -> int:
    return min(length, math.ceil(self.capacity_factor * length * self.top_k / self.num_experts))


def load_balancing_loss(probs_BxLxE, chosen_BxLxKxE):
  """num_experts * sum_e f_e * P_e (1 when balanced); f counts top-k choices, each 1/k."""
  num_experts = probs_BxLxE.shape[-1]
  fraction_E = jnp.mean(jnp.sum(chosen_BxLxKxE, axis=2), axis=(0, 1)) / chosen_BxLxKxE.shape[2]
  mean_prob_E = jnp.mean(probs_BxLxE, axis=(0, 1))
  return num_experts * jnp.sum(fraction_E * mean_prob_E)


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
    logits_BxLxE = jnp.einsum("bld,de->ble", x_BxLxD.astype(jnp.float32),
                              router.astype(jnp.float32))
    probs_BxLxE = jax.nn.softmax(logits_BxLxE, axis=-1)
    gates_BxLxK, experts_BxLxK = jax.lax.top_k(probs_BxLxE, cfg.top_k)
    if cfg.renormalize:
      gates_BxLxK = gates_BxLxK / jnp.sum(gates_BxLxK, axis=-1, keepdims=True)
    chosen_BxLxKxE = jax.nn.one_hot(experts_BxLxK, e, dtype=jnp.float32)
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
      h = act(jnp.einsum("becd,edf->becf", x_BxExCxD, w_in))
      if cfg.gated:
        h = h * jnp.einsum("becd,edf->becf", x_BxExCxD, w_up)
      h = nn.with_logical_constraint(h, ("act_batch", "act_experts", None, "act_mlp"))
      return jnp.einsum("becf,efd->becd", h, w_out)

    if cfg.capacity_factor == 0:
      combine_BxLxE = jnp.einsum("blk,blke->ble", gates_BxLxK, chosen_BxLxKxE)
      x_BxExLxD = jnp.broadcast_to(x_BxLxD[:, None], (x_BxLxD.shape[0], e, *x_BxLxD.shape[1:]))
      y_BxExLxD = experts(x_BxExLxD)
      return jnp.einsum("ble,beld->bld", combine_BxLxE.astype(y_BxExLxD.dtype), y_BxExLxD)

    b, length, k = experts_BxLxK.shape
    c = cfg.capacity(length)
    # Slot of each (token, choice) in its expert's queue, in token order: a
    # token's slot depends only on earlier tokens, so routing stays causal.
    chosen_BxLKxE = chosen_BxLxKxE.reshape(b, length * k, e)
    slot_BxLxKxE = (jnp.cumsum(chosen_BxLKxE, axis=1) * chosen_BxLKxE - 1).reshape(
        b, length, k, e)
    slot_BxLxK = jnp.sum(slot_BxLxKxE * chosen_BxLxKxE, axis=-1).astype(jnp.int32)
    kept_BxLxK = slot_BxLxK < c
    # one_hot of an out-of-range slot is all zeros: dropped tokens dispatch nowhere.
    slots_BxLxKxC = jax.nn.one_hot(jnp.where(kept_BxLxK, slot_BxLxK, c), c, dtype=jnp.float32)
    dispatch_BxLxExC = jnp.einsum("blke,blkc->blec", chosen_BxLxKxE, slots_BxLxKxC)
    combine_BxLxExC = jnp.einsum("blke,blkc,blk->blec", chosen_BxLxKxE, slots_BxLxKxC,
                                 gates_BxLxK)
    x_BxExCxD = jnp.einsum("blec,bld->becd", dispatch_BxLxExC.astype(x_BxLxD.dtype), x_BxLxD)
    x_BxExCxD = nn.with_logical_constraint(x_BxExCxD, ("act_batch", "act_experts", None,
                                                       "act_embed"))
    y_BxExCxD = experts(x_BxExCxD)
    return jnp.einsum("blec,becd->bld", combine_BxLxExC.astype(y_BxExCxD.dtype), y_BxExCxD)
