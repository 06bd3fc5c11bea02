"""KV-cache decoding and sampling (trainer/generate.py) on tiny random models, in float32."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from core.registry import registry
from modules import gemma, gpt2, llama
from modules.decoder import MODELS
from trainer.generate import SamplingOptions, generate, init_cache, zeros_like_cache

V = 64
WINDOW = 3


def _llama(scan):
  node = llama.node(llama.Size(32, 2, 4, 2, 64, V))  # GQA: 4 query heads, 2 kv heads, RoPE
  node.scan_layers = scan
  return node


def _llama_window(scan):
  """LLaMA with a sliding window of 3 positions: its cache is a ring of 3 slots."""
  node = _llama(scan)
  node.block.attention.sliding_window = WINDOW
  return node


def _llama_fused(scan):
  """LLaMA with q/k/v and gate/up each one matmul (attention.fused_qkv, mlp.fused_gate_up)."""
  node = _llama(scan)
  node.block.attention.fused_qkv = node.block.ffn.fused_gate_up = True
  return node


def _gpt2(scan):
  node = gpt2.node(gpt2.Size(32, 2, 4, vocab_size=V, max_length=32))  # learned positions, biases
  node.scan_layers = scan
  return node


def _moe_parallel(scan):
  """Parallel block, dropless MoE (capacity drops depend on the sequence), LLaMA-3 RoPE, MQA."""
  node = llama.node(llama.Size(32, 2, 4, 1, 64, V, rope_scaling=(8.0, 1.0, 4.0, 8)))
  r = registry
  block = node.block
  node.block = r("block").node("parallel", attention=block.attention, norm=block.norm,
                               ffn=r("ffn").node("moe", num_experts=4, top_k=2, hidden_dim=32,
                                                 capacity_factor=0.0))
  node.scan_layers = scan
  return node


def _gemma_remainder(scan):
  """Gemma-style layers (sliding window 3, full) x 2, then a sliding layer: the group's remainder,
  whose cache follows the scanned repeats' (modules/block_group.py)."""
  node = gemma.node(gemma.Size(32, 5, 4, 2, 8, 64, V, WINDOW, pattern=("sliding", "full"),
                               query_pre_attn_scalar=8.0, qk_norm=True))
  node.scan_layers = scan
  return node


def _model(node):
  return MODELS.build(MODELS.parse(node, "model"))


@functools.cache
def _random(make, scan):
  model = _model(make(scan))
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  return model, jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, params,
                             is_leaf=lambda x: hasattr(x, "unbox"))


@pytest.mark.parametrize("make,scan", [(_llama, True), (_llama, False), (_gpt2, True),
                                       (_gpt2, False), (_moe_parallel, False),
                                       (_llama_window, True), (_llama_fused, True),
                                       (_gemma_remainder, True)],
                         ids=["llama-scan", "llama-unrolled", "gpt2-scan", "gpt2-unrolled",
                              "moe-parallel-unrolled", "llama-window-scan", "llama-fused-scan",
                              "gemma-remainder-scan"])
def test_cached_decoding_matches_full_forward(make, scan):
  model, params = _random(make, scan)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, V)
  full = jax.jit(model.apply)({"params": params}, tokens)

  @jax.jit
  def step(cache, tokens_BxL, positions_BxL):
    logits, variables = model.apply({"params": params, "cache": cache}, tokens_BxL, positions_BxL,
                                    decode=True, mutable=["cache"])
    return logits, variables["cache"]

  cache = zeros_like_cache(init_cache(model, batch=2, length=16), jnp.float32)
  prefill = 4  # longer than the window: the ring wraps within the prefill
  logits, cache = step(cache, tokens[:, :prefill], jnp.broadcast_to(jnp.arange(prefill), (2, 4)))
  got = [logits]
  for p in range(prefill, 12):
    logits, cache = step(cache, tokens[:, p:p + 1], jnp.full((2, 1), p))
    got.append(logits)
  np.testing.assert_allclose(np.concatenate(got, axis=1), full, atol=1e-5, rtol=0)


def test_cache_carries_activation_axes():
  model, _ = _random(_llama, True)
  boxed = init_cache(model, batch=2, length=16)
  cache = boxed["layers"]["block"]["attention"]["kv_cache"]
  assert cache["key"].names == ("layers", "act_batch", "act_length", "act_heads", None)
  assert cache["key"].value.shape == (2, 2, 16, 2, 8)  # layers, batch, length, kv heads, head_dim
  assert cache["position"].names == ("layers", "act_batch", "act_length")


def _cache_bytes(model, length: int) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(
      nn.meta.unbox(init_cache(model, batch=2, length=length))))


def test_a_window_cache_holds_the_window_whatever_the_length():
  """Its keys and values have `sliding_window` slots, so its bytes do not grow with the length;
  those of the same model without a window do."""
  model, _ = _random(_llama_window, True)
  key = init_cache(model, batch=2, length=1024)["layers"]["block"]["attention"]["kv_cache"]["key"]
  assert key.value.shape == (2, 2, WINDOW, 2, 8)
  # per layer: keys and values of 2 rows x 3 slots x 2 heads x 8 (float32), and the slots' int32
  # positions
  assert _cache_bytes(model, 1024) == _cache_bytes(model, 16) == 2 * (2 * 2 * WINDOW * 2 * 8 * 4
                                                                      + 2 * WINDOW * 4)
  full, _ = _random(_llama, True)
  assert _cache_bytes(full, 1024) == 64 * _cache_bytes(full, 16)


def test_window_generation_equals_the_full_forward_pass():
  """Greedy tokens from the ring cache, prompts of unequal length (longer and shorter than the
  window) in one batch, equal those of full forward passes over each row's tokens so far."""
  model, params = _random(_llama_window, False)
  tokens, _, _ = _generate(model, params, PROMPTS, temperature=0.0)
  forward = jax.jit(model.apply)
  for row, prompt in enumerate(PROMPTS):
    seq = list(prompt)
    for _ in range(tokens.shape[1]):
      padded = jnp.asarray([seq + [0] * (32 - len(seq))])  # causal: the tail changes nothing
      seq.append(int(jnp.argmax(forward({"params": params}, padded)[0, len(seq) - 1])))
    np.testing.assert_array_equal(tokens[row], seq[len(prompt):], err_msg=f"prompt {row}")


def _generate(model, params, prompts, **options):
  """Right-pads `prompts` (lists of ids) into one batch and generates."""
  longest = max(map(len, prompts))
  batch = np.zeros((len(prompts), longest), np.int32)
  for i, p in enumerate(prompts):
    batch[i, :len(p)] = p
  seed = options.pop("seed", 0)
  opts = SamplingOptions(**{"max_new_tokens": 10, **options})
  out = generate(params, jnp.asarray(batch), jnp.asarray([len(p) for p in prompts], jnp.int32),
                 jax.random.key(seed), model=model, options=opts)
  return np.asarray(out.tokens), np.asarray(out.num_tokens), np.asarray(out.hit_eos)


PROMPTS = [[5, 9, 2], [7, 1, 3, 3, 8, 20, 11], [40, 41, 42, 43, 44]]


def test_batched_prompts_of_unequal_length_match_one_at_a_time():
  # GPT-2 and LLaMA batches are also checked against transformers (test_generate_cli.py).
  model, params = _random(_llama, False)
  batched, _, _ = _generate(model, params, PROMPTS, temperature=0.0)
  for i, prompt in enumerate(PROMPTS):
    alone, _, _ = _generate(model, params, [prompt], temperature=0.0)
    np.testing.assert_array_equal(batched[i], alone[0], err_msg=f"prompt {i}")


def test_stops_at_eos_per_row():
  model, params = _random(_llama, False)
  free, _, _ = _generate(model, params, PROMPTS, temperature=0.0)
  eos = int(free[1, 3])  # row 1 emits this as its 4th token
  tokens, counts, hit = _generate(model, params, PROMPTS, temperature=0.0, eos_id=eos)
  first = [int(np.argmax(row == eos)) + 1 if (row == eos).any() else 10 for row in free]
  np.testing.assert_array_equal(counts, first)
  assert hit[1] and counts[1] <= 4
  for row, n in zip(range(3), counts):
    np.testing.assert_array_equal(tokens[row, :n], free[row, :n])
    assert (tokens[row, n:] == eos).all()


def test_seeded_sampling_is_reproducible_and_filters_reduce_to_greedy():
  model, params = _random(_llama, False)
  greedy, _, _ = _generate(model, params, PROMPTS, temperature=0.0)
  sample = functools.partial(_generate, model, params, PROMPTS, temperature=1.0)
  a, b = sample(seed=1)[0], sample(seed=1)[0]
  np.testing.assert_array_equal(a, b)
  assert (a != sample(seed=2)[0]).any(), "different seeds drew the same 30 tokens"
  assert (a != greedy).any(), "temperature 1 drew the greedy tokens"
  np.testing.assert_array_equal(sample(seed=3, top_k=1)[0], greedy)
  np.testing.assert_array_equal(sample(seed=3, top_p=1e-6)[0], greedy)


def test_top_k_and_top_p_keep_only_the_likely_tokens():
  from trainer.generate import sample
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]] * 2000))
  keys = jax.random.key(0)
  top2 = np.asarray(sample(logits, keys, SamplingOptions(top_k=2)))
  assert set(top2.tolist()) == {0, 1}
  nucleus = np.asarray(sample(logits, keys, SamplingOptions(top_p=0.9)))  # 0.5 + 0.3 < 0.9
  assert set(nucleus.tolist()) == {0, 1, 2}
  assert abs(np.mean(nucleus == 0) - 0.5 / 0.95) < 0.05
