"""Position-wise feed-forward layers (the `ffn` registry): dense MLP with SwiGLU or GELU."""

import dataclasses
import math
from typing import ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

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
  init_std: float = 0.02  # stddev of the normal initialiser
  # kept by a switch to another ffn kind (moe: each expert's width and activation)
  SHARED: ClassVar = ("hidden_dim", "activation", "gated", "init_std")

  def check(self, *, dim: int):
    if not self.init_std >= 0 or math.isinf(self.init_std):
      raise ConfigError(f"mlp.init_std must be a finite number >= 0, got {self.init_std}")
    if self.hidden_dim <= 0:
      raise ConfigError(f"mlp.hidden_dim must be positive, got {self.hidden_dim}")


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
    h = act(dense("wi", x_BxLxD, (self.dim, cfg.hidden_dim), ("embed", "mlp")))
    if cfg.gated:
      h = h * dense("wu", x_BxLxD, (self.dim, cfg.hidden_dim), ("embed", "mlp"))
    h = nn.with_logical_constraint(h, ("act_batch", "act_length", "act_mlp"))
    return dense("wo", h, (cfg.hidden_dim, self.dim), ("mlp", "embed"))
