"""Position encodings that attention owns: rotary (RoPE) or none."""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from modules.registry import ConfigError, Registry

POSITIONS = Registry("position")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoPositionConfig:
  kind: str = "none"


@POSITIONS.register("none", NoPositionConfig)
class NoPosition(nn.Module):
  """Leaves queries and keys alone (e.g. GPT-2, which adds learned positions at the input)."""
  cfg: NoPositionConfig
  head_dim: int

  def __call__(self, q_BxLxHxK, k_BxLxHxK, positions_BxL):
    return q_BxLxHxK, k_BxLxHxK


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeConfig:
  kind: str = "rope"
  theta: float = 10_000.0  # base wavelength of the rotary frequencies

  def check(self, *, head_dim: int):
    if head_dim % 2:
      raise ConfigError(f"rope needs an even head_dim, got {head_dim}")


def rotate(x_BxLxHxK, inv_freq_K2, positions_BxL):
  """Rotates pairs (i, i + K/2) by position * inv_freq (the Hugging Face LLaMA layout)."""
  angles_BxLxK2 = positions_BxL[..., None].astype(jnp.float32) * inv_freq_K2
  sin = jnp.sin(angles_BxLxK2)[:, :, None, :]
  cos = jnp.cos(angles_BxLxK2)[:, :, None, :]
  x = x_BxLxHxK.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxK.dtype)


@POSITIONS.register("rope", RopeConfig)
class Rope(nn.Module):
  """Rotary position embedding (Su et al. 2021)."""
  cfg: RopeConfig
  head_dim: int

  def inv_freq(self):
    return 1.0 / (self.cfg.theta ** (jnp.arange(0, self.head_dim, 2, dtype=jnp.float32)
                                     / self.head_dim))

  def __call__(self, q_BxLxHxK, k_BxLxHxK, positions_BxL):
    inv_freq = self.inv_freq()
    return rotate(q_BxLxHxK, inv_freq, positions_BxL), rotate(k_BxLxHxK, inv_freq, positions_BxL)
