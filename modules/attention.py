"""Causal self-attention with MHA / GQA / MQA, optional biases, and a position child.

The attention itself is one of the registered implementations (modules/attn_registry.py:
IMPLEMENTATIONS, one file `modules/attn_<name>.py` each), named by `implementation`; the layer
dispatches through the registry, which refuses in one line what an implementation does not
declare, and hands it this layer's config as the one node its options come in.

With `decode=True` attention keeps its own key/value cache in the flax "cache" collection
(modules/kv_cache.py: the slots its mask needs, a ring buffer of `sliding_window` slots with a
window): each call attends to the cache and its own tokens' keys under the layer's mask, then
stores them at their positions (`positions_BxL`, consecutive per row; negative: padding).
The first call is the prefill (the prompt), the following ones decode a token each; rows may
stand at different positions (prompts of unequal length). It attends with the configured
implementation if that one declares decoding, else with `xla`. The rest of the model only
passes the flag through. See trainer/generate.py.

The mask of every call (training, decoding, context shards) is the one of modules/masks.py,
made from this layer's mask options (`masks.Spec.of(cfg)`).
"""

import dataclasses
import math
from typing import Any, Literal

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from modules import attn_registry, context, kv_cache, masks
from modules.attn_registry import Context, option
from modules.masks import Mask
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
  # q, k and v as one matmul (MaxText's `fused_qkv`) by one kernel `qkv` [embed, kv_heads,
  # heads / kv_heads + 2, head_dim]: each kv head's group of query heads, then its key and
  # value (Megatron's grouped layout, so GQA and MQA fuse too); the `model` axis splits it by kv
  # head (`kv_heads`), never across q/k/v. The same math as separate projections (their
  # concatenation), but another parameter layout, drawn otherwise at init: a checkpoint restores
  # only into the layout it was written in. False: q, k, v of their own (as before).
  fused_qkv: bool = False
  out_bias: bool = False  # bias on the output projection (GPT-2: True)
  # A name of modules/attn_registry.py:IMPLEMENTATIONS, each in modules/attn_<name>.py. `xla`:
  # reference einsum/softmax; `dot_product`: jax.nn.dot_product_attention (its XLA path on every
  # platform in jax 0.10.2; cuDNN's needs cuDNN, docs/plan.md); `chunked`: the `xla` math over
  # blocks of query_chunk_size queries, one block's [queries, keys] logits at a time; `splash`:
  # the Pallas TPU splash-attention kernel, sharded over batch and heads, in Pallas interpret
  # mode off TPU (slow: for tests); `pallas_hd64`: our Pallas TPU kernel for head_dim 64, two
  # heads a block (modules/attn_pallas_hd64.py), in interpret mode off TPU.
  implementation: str = "xla"
  query_chunk_size: int = 512  # queries per block of `chunked` (a divisor of the length)
  # dtype of the [queries, keys] logits that `xla` and `chunked` write to memory: `compute`
  # (the matmul's output in the compute dtype, bfloat16 on TPU/GPU, as MaxText's default) or
  # `float32`. The softmax runs in float32 either way; on CPU both are float32.
  logits_dtype: Literal["compute", "float32"] = "compute"
  splash_block_size: int = 1024  # queries and keys per block of `splash` (a multiple of 128)
  pallas_block_q: int = 512  # queries per block of `pallas_hd64` (a multiple of 128)
  pallas_block_kv: int = 512  # keys per block of `pallas_hd64` (a multiple of 128)
  # How `pallas_hd64` computes the products with a 64-wide output (P V and the gradients):
  # `transposed`, a head's 64 rows streamed through the MXU against the probabilities held in
  # it; `padded`, 128 lanes wide with the other head's half discarded (not yet timed on a chip:
  # benchmarks/attention.py times both).
  pallas_products: Literal["transposed", "padded"] = "transposed"
  init_std: float = 0.02  # stddev of the normal initialiser of the projections
  position: Any = child("position")  # rope / none
  # QK-norm (OLMo-2, Qwen3): a norm node applied to each head's queries and keys (over
  # head_dim, one scale per head_dim shared by the heads) before the position encoding;
  # None = off. On: --config.model.block.attention.norm.kind=rmsnorm
  norm: Any = child("norm", None)
  # Gemma-2's attention logit soft-capping: each scaled logit becomes cap * tanh(logit / cap)
  # before the mask, bounding it to (-cap, cap) (Gemma-2: 50.0); None = off. A per-layer option:
  # only the implementations that declare it run with it (xla, chunked, splash).
  logit_softcap: float | None = option(None)
  # Sliding-window attention (Mistral; Gemma 2's local layers): a query sees itself and the
  # sliding_window - 1 positions before it (Hugging Face's `sliding_window`); None = off. A mask
  # option (modules/masks.py): training, the KV cache (of this many slots) and context shards
  # all apply it; every implementation supports it.
  sliding_window: int | None = option(None)
  # The logits scaled by query_pre_attn_scalar**-0.5 instead of head_dim**-0.5 (Gemma 2/3's
  # `query_pre_attn_scalar`: 256, or dim / num_heads for Gemma-2 27B); None = head_dim. Applied
  # to the queries by the layer, so every implementation, the cache and context shards take it.
  query_pre_attn_scalar: float | None = None

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
    for name in ("splash_block_size", "pallas_block_q", "pallas_block_kv"):
      if getattr(self, name) <= 0 or getattr(self, name) % 128:
        raise ConfigError(f"attention.{name} must be a positive multiple of 128, got "
                          f"{getattr(self, name)}")
    if self.logit_softcap is not None and not 0 < self.logit_softcap < math.inf:
      raise ConfigError(f"attention.logit_softcap must be a positive number (None = off), got "
                        f"{self.logit_softcap}")
    if self.sliding_window is not None and self.sliding_window <= 0:
      raise ConfigError(f"attention.sliding_window must be a positive number of positions "
                        f"(None = off), got {self.sliding_window}")
    if self.query_pre_attn_scalar is not None and not (
        0 < self.query_pre_attn_scalar < math.inf):
      raise ConfigError(f"attention.query_pre_attn_scalar must be a positive number (None = "
                        f"head_dim), got {self.query_pre_attn_scalar}")
    heads, kv, _ = self.heads(dim)
    if heads % kv:
      raise ConfigError(f"attention: num_heads {heads} is not a multiple of num_kv_heads {kv}")
    attn_registry.choose(self)  # a registered implementation that supports the options set


@ATTENTION.register("attention", AttentionConfig)
class Attention(nn.Module):
  cfg: AttentionConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL, *, decode: bool = False):
    cfg = self.cfg
    h, g, k = cfg.heads(self.dim)
    init = nn.initializers.normal(cfg.init_std)

    def proj(name, heads: tuple[int, ...], axes: tuple[str | None, ...]):
      w = self.param(name, nn.with_logical_partitioning(init, ("embed", *axes, "head_dim")),
                     (self.dim, *heads, k))
      ends = "hk" if len(heads) == 1 else "gjk"  # separate: [B, L, H, K]; fused: [B, L, G, J, K]
      y = jnp.einsum(f"bld,d{ends}->bl{ends}", x_BxLxD, w.astype(x_BxLxD.dtype))
      if cfg.qkv_bias:
        bias = self.param(f"{name}_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, (*axes, "head_dim")), (*heads, k))
        y = y + bias.astype(y.dtype)
      y = nn.with_logical_constraint(y, ("act_batch", "act_length", "act_heads",
                                         *[None] * len(axes)))
      return checkpoint_name(y, "qkv_proj")

    if cfg.fused_qkv:  # [B, L, G, R + 2, K]: each group's R query heads, its key, its value
      y = proj(QKV, (g, h // g + 2), ("kv_heads", "qkv"))
      q, kk, v = split_heads(y, h)
      q, kk, v = (nn.with_logical_constraint(t, ("act_batch", "act_length", "act_heads", None))
                  for t in (q, kk, v))
    else:
      q, kk, v = (proj("q", (h,), ("heads",)), proj("k", (g,), ("kv_heads",)),
                  proj("v", (g,), ("kv_heads",)))
    if cfg.norm is not None:  # QK-norm, before RoPE
      q = NORMS.build(cfg.norm, dim=k, name="q_norm")(q)
      kk = NORMS.build(cfg.norm, dim=k, name="k_norm")(kk)
    position = POSITIONS.build(cfg.position, head_dim=k, name="position")
    q, kk = position(q, kk, positions_BxL)
    if cfg.query_pre_attn_scalar is not None:  # the kernels scale by k**-0.5: make it scalar**-0.5
      q = q * jnp.asarray(math.sqrt(k / cfg.query_pre_attn_scalar), q.dtype)
    out = self._attend(q, kk, v, positions_BxL, segment_ids_BxL, decode=decode)
    out = checkpoint_name(out, "attn_out")
    w_o = self.param("o", nn.with_logical_partitioning(init, ("heads", "head_dim", "embed")),
                     (h, k, self.dim))
    y = jnp.einsum("blhk,hkd->bld", out, w_o.astype(out.dtype))
    if cfg.out_bias:
      y = y + self.param("o_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                         (self.dim,)).astype(y.dtype)
    return y

  def _attend(self, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, positions_BxL, segment_ids_BxL, *,
              decode: bool):
    """The configured implementation, chosen through the registry (attn_registry.choose), on
    the layer's mask options (masks.Spec) in the form of the call: a decode step's mask over the
    cache; under context parallelism, each shard's mask over the gathered keys
    (context.attention) unless the implementation splits the work itself; else over the row,
    by segment ids."""
    cfg = self.cfg
    spec = masks.Spec.of(cfg)
    shards = 1 if decode else context.shards()[1]
    impl = attn_registry.choose(cfg, segments=segment_ids_BxL is not None and not decode,
                                context=shards, decode=decode)
    if decode:
      k_BxSxGxK, v_BxSxGxK, mask = kv_cache.KVCache(spec=spec, name="kv_cache")(
          k_BxLxGxK, v_BxLxGxK, positions_BxL)
      return impl.attend(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, Mask(explicit_Bx1xLxS=mask), cfg)
    if shards > 1 and impl.supports.context is Context.GATHERED:
      return context.attention(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, spec=spec,
                               attend=lambda q, k, v, mask: impl.attend(
                                   q, k, v, Mask(explicit_Bx1xLxS=mask), cfg))
    return impl.attend(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK,
                       Mask(spec=spec, segment_ids_BxL=segment_ids_BxL), cfg)


# -- the fused layout (fused_qkv) ------------------------------------------------------------

QKV = "qkv"  # the fused kernel's name (and QKV + "_bias")


def split_heads(y, heads: int):
  """(q [..., H, K], k [..., G, K], v [..., G, K]) of the fused layout's [..., G, H/G + 2, K]:
  query head i of kv head i // (H/G), as every implementation groups them."""
  r = heads // y.shape[-3]
  return y[..., :r, :].reshape(*y.shape[:-3], heads, y.shape[-1]), y[..., r, :], y[..., r + 1, :]


def fuse_qkv(p: dict) -> dict:
  """A layer's attention tree with separate q, k, v (and biases) in the fused layout: `qkv`
  [..., embed, G, H/G + 2, K] (and `qkv_bias` [..., G, H/G + 2, K]); numpy or jax arrays,
  leading (layer) axes kept, other entries unchanged. A concatenation: bit for bit."""
  xp = np if isinstance(p["q"], np.ndarray) else jnp
  g = p["k"].shape[-2]
  out = {name: x for name, x in p.items() if name not in ("q", "k", "v", "q_bias", "k_bias",
                                                         "v_bias")}
  for suffix in ("", "_bias"):
    if "q" + suffix in p:
      q = p["q" + suffix]
      grouped = q.reshape(*q.shape[:-2], g, q.shape[-2] // g, q.shape[-1])
      out[QKV + suffix] = xp.concatenate(
          [grouped, p["k" + suffix][..., None, :], p["v" + suffix][..., None, :]], axis=-2)
  return out


def split_qkv(p: dict) -> dict:
  """The inverse of fuse_qkv: a fused attention tree with separate q, k, v (and biases)."""
  out = {name: x for name, x in p.items() if name not in (QKV, QKV + "_bias")}
  for suffix in ("", "_bias"):
    if QKV + suffix in p:
      y = p[QKV + suffix]
      heads = y.shape[-3] * (y.shape[-2] - 2)
      out["q" + suffix], out["k" + suffix], out["v" + suffix] = split_heads(y, heads)
  return out
