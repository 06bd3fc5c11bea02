"""Position-wise feed-forward layers (the `ffn` registry): dense MLP with SwiGLU or GELU."""

import dataclasses
import math
from typing import ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core.registry import REQUIRED, ConfigError, Registry

FFN = Registry("ffn")

# The activations by name, declared here once: the type of every ffn kind's `activation`
# field (`Activation`, which the config check reads its choices from) is made of these names.
ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's "gelu_new"
    "relu": jax.nn.relu,
    "relu2": lambda x: jnp.square(jax.nn.relu(x)),  # squared ReLU (Primer, So et al. 2021)
}
Activation = Literal[tuple(ACTIVATIONS)]  # one of the names of ACTIVATIONS


@dataclasses.dataclass(frozen=True, kw_only=True)
class MlpConfig:
  kind: str = "mlp"
  hidden_dim: int = REQUIRED  # width of the hidden layer
  activation: Activation = "silu"  # a name of ACTIVATIONS
  gated: bool = True  # act(x W_gate) * (x W_up), i.e. SwiGLU with silu (LLaMA)
  use_bias: bool = False  # biases on both projections (GPT-2: True)
  # The gate and up projections of a gated MLP as one matmul (MaxText's `fused_mlp`) by one
  # kernel `wi_wu` [embed, 2, hidden_dim] (gate, then up); the `model` axis splits its hidden
  # units (`mlp`), never gate from up. The same math as separate projections, but another
  # parameter layout, drawn otherwise at init: a checkpoint restores only into the layout it
  # was written in. False: wi and wu of their own (as before).
  fused_gate_up: bool = False
  init_std: float = 0.02  # stddev of the normal initialiser
  # kept by a switch to another ffn kind (moe: each expert's width and activation)
  SHARED: ClassVar = ("hidden_dim", "activation", "gated", "init_std")

  def check(self, *, dim: int):
    if not self.init_std >= 0 or math.isinf(self.init_std):
      raise ConfigError(f"mlp.init_std must be a finite number >= 0, got {self.init_std}")
    if self.hidden_dim <= 0:
      raise ConfigError(f"mlp.hidden_dim must be positive, got {self.hidden_dim}")
    if self.fused_gate_up and not self.gated:
      raise ConfigError("mlp.fused_gate_up fuses the gate and up projections of a gated MLP, "
                        "and gated is False; set fused_gate_up=False (or gated=True)")


@FFN.register("mlp", MlpConfig)
class Mlp(nn.Module):
  cfg: MlpConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.cfg
    init = nn.initializers.normal(cfg.init_std)

    def dense(name, x, shape, axes):
      w = self.param(name, nn.with_logical_partitioning(init, axes), shape)
      y = jnp.einsum("bld,df->blf", x, w.astype(x.dtype))
      if cfg.use_bias:
        y = y + self.param(f"{name}_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, axes[-1:]), shape[-1:]).astype(y.dtype)
      return y

    act = ACTIVATIONS[cfg.activation]
    if cfg.fused_gate_up:  # [B, L, 2, F]: gate, then up
      w = self.param(WI_WU, nn.with_logical_partitioning(init, ("embed", "gate_up", "mlp")),
                     (self.dim, 2, cfg.hidden_dim))
      y = jnp.einsum("bld,dnf->blnf", x_BxLxD, w.astype(x_BxLxD.dtype))
      if cfg.use_bias:
        y = y + self.param(f"{WI_WU}_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, ("gate_up", "mlp")), (2, cfg.hidden_dim)).astype(y.dtype)
      y = nn.with_logical_constraint(y, ("act_batch", "act_length", None, "act_mlp"))
      h = act(y[:, :, 0]) * y[:, :, 1]
    else:
      h = act(dense("wi", x_BxLxD, (self.dim, cfg.hidden_dim), ("embed", "mlp")))
      if cfg.gated:
        h = h * dense("wu", x_BxLxD, (self.dim, cfg.hidden_dim), ("embed", "mlp"))
    h = nn.with_logical_constraint(h, ("act_batch", "act_length", "act_mlp"))
    return dense("wo", h, (cfg.hidden_dim, self.dim), ("mlp", "embed"))


# -- the fused layout (fused_gate_up) --------------------------------------------------------

WI_WU = "wi_wu"  # the fused kernel's name (and WI_WU + "_bias")


def fuse_gate_up(p: dict) -> dict:
  """A gated MLP's tree with separate wi, wu (and biases) in the fused layout: `wi_wu`
  [..., embed, 2, hidden] (and `wi_wu_bias` [..., 2, hidden]); numpy or jax arrays, leading
  (layer) axes kept, other entries unchanged. A stack: bit for bit."""
  xp = np if isinstance(p["wi"], np.ndarray) else jnp
  out = {name: x for name, x in p.items() if name not in ("wi", "wu", "wi_bias", "wu_bias")}
  for suffix in ("", "_bias"):
    if "wi" + suffix in p:
      out[WI_WU + suffix] = xp.stack([p["wi" + suffix], p["wu" + suffix]], axis=-2)
  return out


def split_gate_up(p: dict) -> dict:
  """The inverse of fuse_gate_up: a fused MLP tree with separate wi, wu (and biases)."""
  out = {name: x for name, x in p.items() if name not in (WI_WU, WI_WU + "_bias")}
  for suffix in ("", "_bias"):
    if WI_WU + suffix in p:
      both = p[WI_WU + suffix]
      out["wi" + suffix], out["wu" + suffix] = both[..., 0, :], both[..., 1, :]
  return out
