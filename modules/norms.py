"""Normalisation layers: RMSNorm and LayerNorm, computed in float32."""

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from core.registry import ConfigError, Registry

NORMS = Registry("norm")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RMSNormConfig:
  kind: str = "rmsnorm"
  eps: float = 1e-5  # added to the mean square before the rsqrt
  # The learned scale w enters as (scale_offset + w), w initialised at 1 - scale_offset (a fresh
  # norm multiplies by 1): Gemma's RMSNorm is x / rms(x) * (1 + w), w from 0 (1.0); 0.0 = LLaMA's
  scale_offset: float = 0.0
  SHARED: ClassVar = ("eps",)  # kept by a switch to another norm kind (core/registry.py)

  def check(self, *, dim: int):
    _check_eps(self, dim=dim)
    if not math.isfinite(self.scale_offset):
      raise ConfigError(f"rmsnorm.scale_offset must be a finite number, got {self.scale_offset}")


def _check_eps(cfg, *, dim: int) -> None:
  del dim
  if not 0 <= cfg.eps < math.inf:
    raise ConfigError(f"{cfg.kind}.eps must be a finite number >= 0, got {cfg.eps}")


@NORMS.register("rmsnorm", RMSNormConfig)
class RMSNorm(nn.Module):
  """x / rms(x) * scale (LLaMA), or x / rms(x) * (scale_offset + scale) (Gemma: 1 + scale)."""
  cfg: RMSNormConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD):
    offset = self.cfg.scale_offset
    init = nn.initializers.constant(1.0 - offset) if offset else nn.initializers.ones
    scale = self.param("scale", nn.with_logical_partitioning(init, ("norm",)), (self.dim,))
    x = x_BxLxD.astype(jnp.float32)
    y = x * jnp.reciprocal(jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.cfg.eps))
    scale = scale.astype(jnp.float32)
    return (y * (scale + offset if offset else scale)).astype(x_BxLxD.dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerNormConfig:
  kind: str = "layernorm"
  eps: float = 1e-5  # added to the variance before the rsqrt
  use_bias: bool = True  # learned additive bias after the scale
  SHARED: ClassVar = ("eps",)

  def check(self, *, dim: int):
    _check_eps(self, dim=dim)


@NORMS.register("layernorm", LayerNormConfig)
class LayerNorm(nn.Module):
  """(x - mean) / std * scale + bias (GPT-2)."""
  cfg: LayerNormConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD):
    x = x_BxLxD.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jnp.reciprocal(jnp.sqrt(var + self.cfg.eps)) * self.vector("scale", 1.0)
    return (y + self.vector("bias", 0.0) if self.cfg.use_bias else y).astype(x_BxLxD.dtype)

  def vector(self, name: str, value: float):
    """The learned [dim] parameter `name` (logical axis `norm`, all `value` at first), float32."""
    init = nn.with_logical_partitioning(nn.initializers.constant(value), ("norm",))
    return self.param(name, init, (self.dim,)).astype(jnp.float32)
