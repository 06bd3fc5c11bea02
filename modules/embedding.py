"""Token and absolute-position embeddings."""

import dataclasses
import math

import flax.linen as nn
import jax.numpy as jnp

from core.registry import ConfigError, Registry
from modules import context

EMBEDDINGS = Registry("embedding")
POSITION_EMBEDDINGS = Registry("position_embedding")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenEmbeddingConfig:
  kind: str = "token"
  init_std: float = 0.02  # stddev of the normal initialiser
  # The looked-up vectors times sqrt(dim), in their dtype (Gemma; the Transformer's embeddings,
  # Vaswani et al. 2017); a tied LM head reads the table unscaled
  scale_by_sqrt_dim: bool = False

  def check(self, *, vocab_size: int, dim: int):
    del vocab_size, dim
    if not self.init_std >= 0 or math.isinf(self.init_std):
      raise ConfigError(f"embedding.init_std must be a finite number >= 0, got {self.init_std}")


@EMBEDDINGS.register("token", TokenEmbeddingConfig)
class TokenEmbedding(nn.Module):
  cfg: TokenEmbeddingConfig
  vocab_size: int
  dim: int

  def setup(self):
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(self.cfg.init_std), ("vocab", "embed")),
        (self.vocab_size, self.dim))

  def __call__(self, tokens_BxL):
    x = jnp.take(_whole_rows(self.embedding, "vocab"), tokens_BxL, axis=0)
    if self.cfg.scale_by_sqrt_dim:
      x = x * jnp.asarray(math.sqrt(self.dim), x.dtype)
    return x

  def attend(self, x_BxLxD):
    """Logits against the embedding matrix (a tied LM head)."""
    return jnp.einsum("bld,vd->blv", x_BxLxD, self.embedding.astype(x_BxLxD.dtype))


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoPositionEmbeddingConfig:
  kind: str = "none"


@POSITION_EMBEDDINGS.register("none", NoPositionEmbeddingConfig)
class NoPositionEmbedding(nn.Module):
  """Positions enter elsewhere (e.g. RoPE inside attention)."""
  cfg: NoPositionEmbeddingConfig
  dim: int

  def __call__(self, positions_BxL):
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnedPositionEmbeddingConfig:
  kind: str = "learned"
  max_length: int = 1024  # positions available (tokens)
  init_std: float = 0.01  # stddev of the normal initialiser

  def check(self, *, dim: int):
    if not self.init_std >= 0 or math.isinf(self.init_std):
      raise ConfigError(f"position_embedding.init_std must be a finite number >= 0, got "
                        f"{self.init_std}")
    if self.max_length <= 0:
      raise ConfigError(f"position_embedding.max_length must be positive, got {self.max_length}")


@POSITION_EMBEDDINGS.register("learned", LearnedPositionEmbeddingConfig)
class LearnedPositionEmbedding(nn.Module):
  """A learned vector per absolute position, added to the token embeddings (GPT-2)."""
  cfg: LearnedPositionEmbeddingConfig
  dim: int

  @nn.compact
  def __call__(self, positions_BxL):
    if positions_BxL.shape[1] > self.cfg.max_length:
      raise ConfigError(f"sequence length {positions_BxL.shape[1]} exceeds the "
                        f"{self.cfg.max_length} learned positions; set "
                        f"--config.model.position_embedding.max_length="
                        f"{positions_BxL.shape[1]} or a shorter --config.data.seq_len")
    table = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(self.cfg.init_std), (None, "embed")),
        (self.cfg.max_length, self.dim))
    return jnp.take(_whole_rows(table, None), positions_BxL, axis=0)


def _whole_rows(table_VxD, rows: str | None):
  """The table with its `embed` side gathered (FSDP's all-gather, as every other weight gets
  before it is used) where the mesh in force splits the batch over an axis that the table's
  embed side is not split over (data x fsdp, data x expert): a lookup in the embed-split table
  there sends the batch-split cotangent to the table's embed split in the backward, which XLA's
  SPMD partitioner can do only by replicating it whole ("Involuntary full rematerialization").
  Gathered, the lookup gives batch-split rows directly and its backward adds each device's rows
  into a table gradient that is reduce-scattered. Elsewhere (fsdp alone, fsdp x model) the
  table stays split: the cotangent reaches the embed split by one all-to-all of the activations'
  size, where the gather would hold the whole float32 table and its whole gradient on every
  device (1 GiB each for a 128k x 2048 table: llm_1b's step 3.4 -> 5.0 GB on tpu-v5p-128)."""
  batch_axes, _ = context.split("act_batch")
  embed_axes, _ = context.split("embed")
  if set(batch_axes) <= set(embed_axes):
    return table_VxD
  return nn.with_logical_constraint(table_VxD, (rows, None))
