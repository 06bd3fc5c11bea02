"""Sampling from a decoder LM with its attention KV caches: prefill, then one jitted loop.

    result = generate(params, prompts_BxP, lengths_B, key, model=model, options=options)

Prompts of unequal length are right-padded to P and carry their own lengths:
the prefill runs all P positions, those past a row's length at position -1
(padding, which attention neither sees nor caches: modules/kv_cache.py), then
row b decodes from position lengths[b] on. Each row thus keeps its own
positions, and its tokens are those it gets alone. The decode steps are
one `lax.while_loop` that ends when every row has emitted EOS or after
`max_new_tokens`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from core.registry import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingOptions:
  max_new_tokens: int = 64  # tokens generated per prompt, at most
  temperature: float = 1.0  # logits are divided by this; 0 = greedy (argmax)
  top_k: int = 0  # keep the k most likely tokens; 0 = all
  top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches this (nucleus)
  eos_id: int | None = None  # stop a row when it emits this token; None = never
  cache_length: int = 0  # KV cache slots (tokens): prompt + new tokens must fit; 0 = just enough

  def check(self, *, max_length: int | None = None):
    if self.max_new_tokens <= 0:
      raise ConfigError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
    if not 0 <= self.temperature < math.inf:
      raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got "
                        f"{self.temperature}")
    if self.top_k < 0:
      raise ConfigError(f"top_k must be >= 0 (0 = no limit), got {self.top_k}")
    if not 0 < self.top_p <= 1:
      raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
    if max_length is not None and self.cache_length > max_length:
      raise ConfigError(f"cache_length {self.cache_length} exceeds the model's maximum length "
                        f"{max_length}")


class Generation(flax.struct.PyTreeNode):
  tokens: jax.Array  # [B, max_new_tokens] int32; past a row's end: its EOS id (or 0)
  num_tokens: jax.Array  # [B] int32: tokens generated per row, its EOS included
  hit_eos: jax.Array  # [B] bool: the row stopped at EOS (else at max_new_tokens)


def init_cache(model: nn.Module, *, batch: int, length: int):
  """The model's "cache" collection for `batch` rows of `length` tokens, as boxed abstract arrays.

  Its logical axes are those of the attention activations (modules/kv_cache.py:CACHE_AXES).
  """
  tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  return jax.eval_shape(lambda t: model.init(jax.random.key(0), t, decode=True), tokens)["cache"]


def zeros_like_cache(abstract_cache, dtype):
  """An empty cache: zeros, its keys and values in `dtype` (slot positions keep their ints)."""
  return jax.tree.map(
      lambda x: jnp.zeros(x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype),
      nn.meta.unbox(abstract_cache))


def sample(logits_BxV, key, options: SamplingOptions):
  """One token per row: argmax at temperature 0, else from the tempered, truncated softmax."""
  logits = logits_BxV.astype(jnp.float32)
  if options.temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / options.temperature
  floor = jnp.finfo(jnp.float32).min
  if options.top_k:
    kth_Bx1 = jax.lax.top_k(logits, min(options.top_k, logits.shape[-1]))[0][:, -1:]
    logits = jnp.where(logits < kth_Bx1, floor, logits)
  if options.top_p < 1:
    sorted_BxV = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_BxV, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens more likely than each
    keep = before < options.top_p  # the most likely token is always kept
    cutoff_Bx1 = jnp.min(jnp.where(keep, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff_Bx1, floor, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("model", "options"))
def generate(params, prompts_BxP, lengths_B, key, *, model: nn.Module,
             options: SamplingOptions) -> Generation:
  """Prefill the prompts (right-padded, `lengths_B` real tokens each), then decode in one loop.

  `params` are used as given (cast them to the compute dtype first); the cache
  takes the dtype of the parameters' floating leaves.
  """
  batch, prompt_len = prompts_BxP.shape
  cache_length = options.cache_length or prompt_len + options.max_new_tokens
  dtype = next(x.dtype for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating))
  cache = zeros_like_cache(init_cache(model, batch=batch, length=cache_length), dtype)

  def step(cache, tokens_BxL, positions_BxL):
    logits, variables = model.apply({"params": params, "cache": cache}, tokens_BxL,
                                    positions_BxL, decode=True, mutable=["cache"])
    return logits, variables["cache"]

  index = jnp.broadcast_to(jnp.arange(prompt_len, dtype=jnp.int32), prompts_BxP.shape)
  positions = jnp.where(index < lengths_B[:, None], index, -1)  # -1: padding
  logits_BxPxV, cache = step(cache, prompts_BxP, positions)
  rows = jnp.arange(batch)
  key, sub = jax.random.split(key)
  token_B = sample(logits_BxPxV[rows, lengths_B - 1], sub, options)
  eos = -1 if options.eos_id is None else options.eos_id
  fill = 0 if options.eos_id is None else options.eos_id
  out = jnp.full((batch, options.max_new_tokens), fill, jnp.int32).at[:, 0].set(token_B)
  done_B = token_B == eos
  count_B = jnp.ones((batch,), jnp.int32)

  def cond(carry):
    i, _, _, _, done_B, _, _ = carry
    return (i < options.max_new_tokens) & ~jnp.all(done_B)

  def body(carry):
    i, token_B, cache, out, done_B, count_B, key = carry
    positions_Bx1 = (lengths_B + i - 1)[:, None]
    logits_Bx1xV, cache = step(cache, token_B[:, None], positions_Bx1)
    key, sub = jax.random.split(key)
    token_B = jnp.where(done_B, fill, sample(logits_Bx1xV[:, 0], sub, options))
    out = out.at[:, i].set(token_B)
    count_B = count_B + (~done_B).astype(jnp.int32)
    done_B = done_B | (token_B == eos)
    return i + 1, token_B, cache, out, done_B, count_B, key

  carry = (jnp.int32(1), token_B, cache, out, done_B, count_B, key)
  _, _, _, out, done_B, count_B, _ = jax.lax.while_loop(cond, body, carry)
  return Generation(tokens=out, num_tokens=count_B, hit_eos=done_B)
