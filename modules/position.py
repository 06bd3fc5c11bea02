"""Position encodings that attention owns: rotary (RoPE), LLaMA-3-scaled RoPE, or none."""

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from core.registry import ConfigError, Registry

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
  # Positions divided by this (linear position interpolation, Hugging Face's rope_type "linear";
  # Gemma 3's global layers: 8.0); 1.0 = none
  linear_factor: float = 1.0
  SHARED: ClassVar = ("theta",)  # kept by a switch to another RoPE kind (core/registry.py)

  def check(self, *, head_dim: int):
    if not 0 < self.theta < math.inf:
      raise ConfigError(f"rope.theta must be a finite number > 0, got {self.theta}")
    if not 0 < self.linear_factor < math.inf:
      raise ConfigError(f"rope.linear_factor must be a finite number > 0, got "
                        f"{self.linear_factor}")
    if head_dim % 2:
      raise ConfigError(f"rope needs an even head_dim, got {head_dim}")


def base_inv_freq(theta: float, head_dim: int):
  """theta^(-2i/K) for i < K/2: RoPE's frequencies, before any scaling."""
  return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def rotate(x_BxLxHxK, inv_freq_K2, positions_BxL):
  """Rotates pairs (i, i + K/2) by position * inv_freq (the Hugging Face LLaMA layout).

  The pair partners (x2, x1) come from a product with a K x K permutation matrix, not from
  splitting the head in halves: every array stays K wide, where halves of K/2 (32 for a
  64-wide head) fill a quarter of a TPU's 128 lanes (one v5e chip, 1b's queries, forward and
  backward: 0.67 ms against 1.06 ms for split halves). The product is exact (a permutation, at
  full precision), so the result equals the split form's."""
  k = x_BxLxHxK.shape[-1]
  angles_BxLxK2 = positions_BxL[..., None].astype(jnp.float32) * inv_freq_K2
  cos_BxLxK2, sin_BxLxK2 = jnp.cos(angles_BxLxK2), jnp.sin(angles_BxLxK2)
  cos = jnp.concatenate([cos_BxLxK2, cos_BxLxK2], axis=-1)[:, :, None, :]
  sin = jnp.concatenate([-sin_BxLxK2, sin_BxLxK2], axis=-1)[:, :, None, :]
  partner_KxK = jnp.roll(jnp.eye(k, dtype=x_BxLxHxK.dtype), k // 2, axis=0)  # column j: x[j+-K/2]
  partner = jnp.einsum("blhk,kj->blhj", x_BxLxHxK, partner_KxK,
                       precision=jax.lax.Precision.HIGHEST)
  out = x_BxLxHxK.astype(jnp.float32) * cos + partner.astype(jnp.float32) * sin
  return out.astype(x_BxLxHxK.dtype)


@POSITIONS.register("rope", RopeConfig)
class Rope(nn.Module):
  """Rotary position embedding (Su et al. 2021)."""
  cfg: RopeConfig
  head_dim: int

  def inv_freq(self):
    inv_freq = base_inv_freq(self.cfg.theta, self.head_dim)
    return inv_freq if self.cfg.linear_factor == 1.0 else inv_freq / self.cfg.linear_factor

  def __call__(self, q_BxLxHxK, k_BxLxHxK, positions_BxL):
    inv_freq = self.inv_freq()
    return rotate(q_BxLxHxK, inv_freq, positions_BxL), rotate(k_BxLxHxK, inv_freq, positions_BxL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeLlama3Config:
  kind: str = "rope_llama3"
  theta: float = 500_000.0  # base wavelength of the rotary frequencies
  factor: float = 8.0  # long wavelengths are divided by this (context extension)
  low_freq_factor: float = 1.0  # wavelengths above original_max_position / this are fully scaled
  high_freq_factor: float = 4.0  # wavelengths below original_max_position / this are kept
  original_max_position: int = 8192  # context length (tokens) of pre-training before scaling
  SHARED: ClassVar = ("theta",)

  def check(self, *, head_dim: int):
    if not 0 < self.theta < math.inf:
      raise ConfigError(f"rope_llama3.theta must be a finite number > 0, got {self.theta}")
    if head_dim % 2:
      raise ConfigError(f"rope_llama3 needs an even head_dim, got {head_dim}")
    for name in ("factor", "original_max_position"):
      if not getattr(self, name) > 0:
        raise ConfigError(f"rope_llama3.{name} must be positive, got {getattr(self, name)}")
    if self.high_freq_factor <= self.low_freq_factor:
      raise ConfigError(f"rope_llama3: high_freq_factor ({self.high_freq_factor}) must exceed "
                        f"low_freq_factor ({self.low_freq_factor})")


@POSITIONS.register("rope_llama3", RopeLlama3Config)
class RopeLlama3(Rope):
  """RoPE with LLaMA-3.1 frequency scaling (Hugging Face `rope_type: llama3`).

  Wavelengths longer than original_max_position / low_freq_factor are divided by
  `factor`, those shorter than original_max_position / high_freq_factor kept, and
  the band in between interpolated smoothly.
  """
  cfg: RopeLlama3Config

  def inv_freq(self):
    cfg = self.cfg
    inv_freq = base_inv_freq(cfg.theta, self.head_dim)
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > cfg.original_max_position / cfg.low_freq_factor,
                       inv_freq / cfg.factor, inv_freq)
    smooth = ((cfg.original_max_position / wavelen - cfg.low_freq_factor)
              / (cfg.high_freq_factor - cfg.low_freq_factor))
    smoothed = (1 - smooth) * scaled / cfg.factor + smooth * scaled
    medium = ((wavelen >= cfg.original_max_position / cfg.high_freq_factor)
              & (wavelen <= cfg.original_max_position / cfg.low_freq_factor))
    return jnp.where(medium, smoothed, scaled)
