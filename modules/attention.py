"""Causal self-attention with MHA / GQA / MQA, optional biases, and a position child.

With `decode=True` attention keeps its own key/value cache in the flax "cache"
collection ([B, S, G, K] per layer, S = the cache length): each call writes the
keys and values of its tokens at their positions (`positions_BxL`, consecutive
per row) and attends to every cached slot at or before each query's position.
The first call is the prefill (the prompt), the following ones decode a token
each; rows may stand at different positions (prompts of unequal length). The
rest of the model only passes the flag through. See trainer/generate.py.
"""

import dataclasses
import functools
import math
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from modules import context, splash
from modules.norms import NORMS
from modules.position import POSITIONS
from core.registry import REQUIRED, ConfigError, Registry, child

ATTENTION = Registry("attention")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionConfig:
  kind: str = "attention"
  num_heads: int = REQUIRED  # query heads
  num_kv_heads: int | None = None  # key/value heads; None = num_heads (MHA), 1 = MQA
  head_dim: int | None = None  # per-head width; None or 0 = dim // num_heads
  qkv_bias: bool = False  # bias on the q, k, v projections (GPT-2: True)
  out_bias: bool = False  # bias on the output projection (GPT-2: True)
  # `xla`: reference einsum/softmax; `dot_product`: jax.nn.dot_product_attention (its XLA
  # path on every platform in jax 0.10.2; cuDNN's needs cuDNN, docs/plan.md); `chunked`: the
  # `xla` math over blocks of query_chunk_size queries, one block's [queries, keys] logits at a
  # time; `splash`: the Pallas TPU splash-attention kernel (modules/splash.py), sharded over
  # batch and heads, in Pallas interpret mode off TPU (slow: for tests).
  implementation: Literal["xla", "dot_product", "chunked", "splash"] = "xla"
  query_chunk_size: int = 512  # queries per block of `chunked` (a divisor of the length)
  # dtype of the [queries, keys] logits that `xla` and `chunked` write to memory: `compute`
  # (the matmul's output in the compute dtype, bfloat16 on TPU/GPU, as MaxText's default) or
  # `float32`. The softmax runs in float32 either way; on CPU both are float32.
  logits_dtype: Literal["compute", "float32"] = "compute"
  splash_block_size: int = 512  # queries and keys per block of `splash` (a multiple of 128)
  init_std: float = 0.02  # stddev of the normal initialiser of the projections
  position: Any = child("position")  # rope / none
  # QK-norm (OLMo-2, Qwen3): a norm node applied to each head's queries and keys (over
  # head_dim, one scale per head_dim shared by the heads) before the position encoding;
  # None = off. On: --config.model.block.attention.norm.kind=rmsnorm
  norm: Any = child("norm", None)

  def heads(self, dim: int) -> tuple[int, int, int]:
    kv = self.num_kv_heads or self.num_heads
    return self.num_heads, kv, self.head_dim or dim // self.num_heads

  def check(self, *, dim: int):
    if not self.init_std >= 0 or math.isinf(self.init_std):
      raise ConfigError(f"attention.init_std must be a finite number >= 0, got {self.init_std}")
    if self.num_heads <= 0 or (self.num_kv_heads is not None and self.num_kv_heads <= 0):
      raise ConfigError(f"attention: num_heads ({self.num_heads}) and num_kv_heads "
                        f"({self.num_kv_heads}) must be positive")
    if self.head_dim is not None and self.head_dim < 0:
      raise ConfigError(f"attention.head_dim must be positive, or 0 (or None) for dim // "
                        f"num_heads, got {self.head_dim}")
    if not self.head_dim and dim % self.num_heads:
      raise ConfigError(f"attention: dim {dim} is not divisible by num_heads {self.num_heads};"
                        f" change one of them or set attention.head_dim")
    if self.query_chunk_size <= 0:
      raise ConfigError(f"attention.query_chunk_size must be positive, got "
                        f"{self.query_chunk_size}")
    if self.splash_block_size <= 0 or self.splash_block_size % 128:
      raise ConfigError(f"attention.splash_block_size must be a positive multiple of 128, got "
                        f"{self.splash_block_size}")
    heads, kv, _ = self.heads(dim)
    if heads % kv:
      raise ConfigError(f"attention: num_heads {heads} is not a multiple of num_kv_heads {kv}")


def causal_mask(segment_ids_BxL, length: int):
  """[B, 1, L, L] boolean: attend to earlier-or-same positions of the same segment."""
  causal_LxL = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
  if segment_ids_BxL is None:
    return causal_LxL[None, None]
  same_BxLxL = segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :]
  return (causal_LxL[None] & same_BxLxL)[:, None]


# The cache holds keys/values like the activations they come from (same logical axes).
CACHE_AXES = ("act_batch", "act_length", "act_heads", None)


def decode_mask(positions_BxL, cache_length: int):
  """[B, 1, L, S] boolean: query at position p sees cache slots 0..p."""
  return (jnp.arange(cache_length)[None, None, :] <= positions_BxL[:, :, None])[:, None]


def write_cache(cache_BxSxGxK, new_BxLxGxK, start_B):
  """Writes each row's L new entries at slots start..start+L-1 of that row."""
  return jax.vmap(lambda c, x, s: jax.lax.dynamic_update_slice(c, x, (s, 0, 0)))(
      cache_BxSxGxK, new_BxLxGxK.astype(cache_BxSxGxK.dtype), start_B)


def xla_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask_Bx1xLxS, *, logits_dtype=None):
  """Reference math; softmax in float32. G kv heads each serve R = H/G query heads.

  Heads are moved ahead of length so that both products are plain batched
  matmuls over (B, G); the R query heads of a group go one at a time (a [B, G, L, S] logits
  tensor live, not R of them: on llm_1b packed, v5e:4x4, 3.9 against 5.50 GiB of
  temporaries). The packed mask is recomputed with the layer under remat, not saved: saving
  it cost 0.36 GiB more temporaries at the same step and bytes.

  What is written to memory at [queries, keys] size is in the compute dtype: the logits as
  the first matmul leaves them (`logits_dtype`, None: the inputs' dtype) and the softmax's
  numerators exp(logit - max), which the second matmul reads. The float32 max and exponent
  happen inside the fusions that read them; the row sums come out of the second matmul, from
  a column of ones after the values (no pass of its own over [queries, keys]: on llm_1b packed,
  369 -> 355 GB accessed, 0.697 -> 0.672 s cost-model step), and the output is divided by
  them after it (as flash attention does), not the [queries, keys] weights.
  """
  b, length, h, k = q_BxLxHxK.shape
  g = k_BxSxGxK.shape[2]
  r = h // g
  q_RxBxGxLxK = q_BxLxHxK.reshape(b, length, g, r, k).transpose(3, 0, 2, 1, 4)
  k_BxGxSxK = k_BxSxGxK.transpose(0, 2, 1, 3)
  v_BxGxSxK = v_BxSxGxK.transpose(0, 2, 1, 3)
  ones_BxGxSx1 = jnp.ones((*v_BxGxSxK.shape[:3], 1), v_BxGxSxK.dtype)
  v_BxGxSxK1 = jnp.concatenate([v_BxGxSxK, ones_BxGxSx1], axis=-1)  # the last column: row sums
  outs = []
  for q_BxGxLxK in q_RxBxGxLxK:  # the R query heads of each kv group, one at a time
    logits = jnp.einsum("bgqk,bgsk->bgqs", q_BxGxLxK, k_BxGxSxK,
                        preferred_element_type=logits_dtype)
    # The mask is applied in the logits' dtype, so that the matmul's fusion writes them in it
    # (a float32 cast right after the matmul would be folded into it: float32 logits in memory).
    logits_BxGxLxS = jnp.where(mask_Bx1xLxS, logits,
                               jnp.finfo(logits.dtype).min).astype(jnp.float32) * (k ** -0.5)
    top = jax.lax.stop_gradient(jnp.max(logits_BxGxLxS, axis=-1, keepdims=True))
    exp_BxGxLxS = jnp.exp(logits_BxGxLxS - top)
    out_BxLxGxK1 = jnp.einsum("bgqs,bgsk->bqgk", exp_BxGxLxS.astype(v_BxSxGxK.dtype), v_BxGxSxK1,
                              preferred_element_type=jnp.float32)
    out, sums_BxLxGx1 = out_BxLxGxK1[..., :-1], out_BxLxGxK1[..., -1:]
    outs.append((out / sums_BxLxGx1).astype(v_BxSxGxK.dtype))
  return jnp.stack(outs, axis=3).reshape(b, length, h, k)


def chunked_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask_Bx1xLxS, *, chunk: int,
                      logits_dtype=None):
  """`xla_attention` over blocks of `chunk` queries, one block at a time (lax.map), each
  block recomputed in the backward pass: the float32 [queries, keys] logits and probabilities
  exist for one block, not the whole length (memory-efficient attention, Rabe & Staats 2021).
  The result equals xla_attention's; a length that `chunk` does not divide runs unchunked."""
  b, length, h, k = q_BxLxHxK.shape
  if length <= chunk or length % chunk:
    return xla_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask_Bx1xLxS,
                         logits_dtype=logits_dtype)
  n = length // chunk
  q_NxBxCxHxK = q_BxLxHxK.reshape(b, n, chunk, h, k).swapaxes(0, 1)
  mask_NxBx1xCxS = mask_Bx1xLxS.reshape(mask_Bx1xLxS.shape[0], 1, n, chunk, -1).transpose(
      2, 0, 1, 3, 4)

  @jax.checkpoint
  def block(args):
    q_BxCxHxK, mask_Bx1xCxS = args
    return xla_attention(q_BxCxHxK, k_BxSxGxK, v_BxSxGxK, mask_Bx1xCxS,
                         logits_dtype=logits_dtype)

  out_NxBxCxHxK = jax.lax.map(block, (q_NxBxCxHxK, mask_NxBx1xCxS))
  return out_NxBxCxHxK.swapaxes(0, 1).reshape(b, length, h, k)


def masked_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask_Bx1xLxS, *, implementation: str,
                     chunk: int, logits_dtype=None):
  """Attention under an explicit mask by `implementation` (any but `splash`)."""
  if implementation == "chunked":
    return chunked_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask_Bx1xLxS, chunk=chunk,
                             logits_dtype=logits_dtype)
  if implementation == "dot_product":
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask=mask_Bx1xLxS)
  return xla_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask_Bx1xLxS, logits_dtype=logits_dtype)


@ATTENTION.register("attention", AttentionConfig)
class Attention(nn.Module):
  cfg: AttentionConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL, *, decode: bool = False):
    cfg = self.cfg
    h, g, k = cfg.heads(self.dim)
    init = nn.initializers.normal(cfg.init_std)

    def proj(name, heads, axes):
      w = self.param(name, nn.with_logical_partitioning(init, ("embed", axes, "head_dim")),
                     (self.dim, heads, k))
      y = jnp.einsum("bld,dhk->blhk", x_BxLxD, w.astype(x_BxLxD.dtype))
      if cfg.qkv_bias:
        bias = self.param(f"{name}_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, (axes, "head_dim")), (heads, k))
        y = y + bias.astype(y.dtype)
      y = nn.with_logical_constraint(y, ("act_batch", "act_length", "act_heads", None))
      return checkpoint_name(y, "qkv_proj")

    q, kk, v = proj("q", h, "heads"), proj("k", g, "kv_heads"), proj("v", g, "kv_heads")
    if cfg.norm is not None:  # QK-norm, before RoPE
      q = NORMS.build(cfg.norm, dim=k, name="q_norm")(q)
      kk = NORMS.build(cfg.norm, dim=k, name="k_norm")(kk)
    position = POSITIONS.build(cfg.position, head_dim=k, name="position")
    q, kk = position(q, kk, positions_BxL)
    length = x_BxLxD.shape[1]
    logits_dtype = jnp.float32 if cfg.logits_dtype == "float32" else None
    if decode:
      kk, v = self._cached(kk, v, positions_BxL)
      out = xla_attention(q, kk, v, decode_mask(positions_BxL, kk.shape[1]))
    elif cfg.implementation != "splash" and context.shards()[1] > 1:
      out = context.attention(q, kk, v, segment_ids_BxL, attend=functools.partial(
          masked_attention, implementation=cfg.implementation, chunk=cfg.query_chunk_size,
          logits_dtype=logits_dtype))
    elif cfg.implementation == "xla":
      out = xla_attention(q, kk, v, causal_mask(segment_ids_BxL, length),
                          logits_dtype=logits_dtype)
    elif cfg.implementation == "chunked":
      out = chunked_attention(q, kk, v, causal_mask(segment_ids_BxL, length),
                              chunk=cfg.query_chunk_size, logits_dtype=logits_dtype)
    elif cfg.implementation == "splash":
      out = splash.splash_attention(q, kk, v, segment_ids_BxL, block=cfg.splash_block_size)
    else:
      mask = None if segment_ids_BxL is None else causal_mask(segment_ids_BxL, length)
      out = jax.nn.dot_product_attention(q, kk, v, mask=mask, is_causal=mask is None)
    out = checkpoint_name(out, "attn_out")
    w_o = self.param("o", nn.with_logical_partitioning(init, ("heads", "head_dim", "embed")),
                     (h, k, self.dim))
    y = jnp.einsum("blhk,hkd->bld", out, w_o.astype(out.dtype))
    if cfg.out_bias:
      y = y + self.param("o_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                         (self.dim,)).astype(y.dtype)
    return y

  def _cached(self, k_BxLxGxK, v_BxLxGxK, positions_BxL):
    """(keys, values) of the whole cache after writing this call's; made on first use.

    The cache is created by `model.init(..., decode=True)` on tokens of the cache
    length (trainer/generate.py:init_cache), so its shape is that call's k/v shape.
    """
    make = nn.with_logical_partitioning(jnp.zeros, CACHE_AXES)
    cached_k = self.variable("cache", "key", make, k_BxLxGxK.shape, k_BxLxGxK.dtype)
    cached_v = self.variable("cache", "value", make, v_BxLxGxK.shape, v_BxLxGxK.dtype)
    start_B = positions_BxL[:, 0]
    cached_k.value = nn.with_logical_constraint(
        write_cache(cached_k.value, k_BxLxGxK, start_B), CACHE_AXES)
    cached_v.value = nn.with_logical_constraint(
        write_cache(cached_v.value, v_BxLxGxK, start_B), CACHE_AXES)
    return cached_k.value, cached_v.value
