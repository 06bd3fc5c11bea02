"""Layer-level properties: RoPE (plain and LLaMA-3 scaled), causality, shapes, scan vs unrolled."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from modules import llama
from modules.decoder import MODELS
from modules.position import POSITIONS
from core.registry import ConfigError, registry
from tests import tpu_tolerances


def _position(kind, head_dim=64, **values):
  cfg = POSITIONS.parse(registry("position").node(kind, **values), "position")
  return POSITIONS.build(cfg, head_dim=head_dim)


def _meta_llama3_scaling(freqs, *, factor, low, high, original):
  """Meta's reference `apply_scaling` (llama-models, llama3/reference_impl/model.py)."""
  out = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < original / high:
      out.append(freq)
    elif wavelen > original / low:
      out.append(freq / factor)
    else:
      smooth = (original / wavelen - low) / (high - low)
      out.append((1 - smooth) * freq / factor + smooth * freq)
  return np.array(out)


def test_rope_llama3_matches_meta_reference():
  head_dim, theta = 64, 500_000.0
  rope = _position("rope_llama3", head_dim, theta=theta, factor=32.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position=8192)
  plain = theta ** -(np.arange(0, head_dim, 2) / head_dim)
  expected = _meta_llama3_scaling(plain, factor=32.0, low=1.0, high=4.0, original=8192)
  got = np.asarray(rope.inv_freq())
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # all three bands are exercised at this head_dim
  assert (got == np.float32(plain)).any() and (got < plain / 31).any()
  assert ((got > plain / 31) & (got < plain * 0.999)).any()


@pytest.mark.parametrize("kind", ["rope", "rope_llama3"])
def test_rope_dot_product_depends_only_on_offset(kind):
  rope = _position(kind, 16)
  key = jax.random.key(0)
  q = jax.random.normal(key, (1, 1, 1, 16))
  k = jax.random.normal(jax.random.key(1), (1, 1, 1, 16))

  @jax.jit
  def dot(pq, pk):
    rq, _ = rope(q, q, jnp.reshape(pq, (1, 1)))
    rk, _ = rope(k, k, jnp.reshape(pk, (1, 1)))
    return jnp.sum(rq * rk)

  def score(pq, pk):
    return float(dot(pq, pk))

  base = score(7, 3)
  for shift in (1, 50, 1000):
    assert score(7 + shift, 3 + shift) == pytest.approx(base, abs=1e-4)
  assert abs(score(8, 3) - base) > 1e-3  # the offset itself does change it


def test_rope_needs_even_head_dim():
  with pytest.raises(ConfigError, match="even head_dim"):
    _position("rope_llama3", 15)


def test_llama32_rows_use_scaled_rope_and_others_do_not():
  assert llama.model_node("1b").block.attention.position.kind == "rope_llama3"
  assert llama.model_node("3b").block.attention.position.factor == 32.0
  for name in ("7b", "8b", "70b"):
    assert llama.model_node(name).block.attention.position.kind == "rope"


# -- whole models ------------------------------------------------------------------------

from modules import gpt2  # noqa: E402

TOKENS = jax.random.randint(jax.random.key(7), (2, 16), 0, 128)


def _gpt2_test():
  return gpt2.node(gpt2.Size(32, 2, 4, vocab_size=128, max_length=64))


def _parallel_moe():
  node = llama.model_node("test")
  block = node.block
  node.block = registry("block").node("parallel", attention=block.attention, norm=block.norm,
                                      ffn=registry("ffn").node("moe", num_experts=4, top_k=2,
                                                               hidden_dim=32, capacity_factor=0.0))
  return node


MODELS_UNDER_TEST = {"llama": lambda: llama.model_node("test"), "gpt2": _gpt2_test,
                     "parallel_moe": _parallel_moe}


def padded_vocab_setup(vocab: int, seq: int, rows: int):
  """The test LLaMA with `vocab` real ids padded to a multiple of 128 (the pad columns must
  count in no loss or metric), a batch of `rows` random rows of `seq` positions whose row 1
  is padding from position 10 on, and random parameters: (model, batch, params)."""
  node = llama.model_node("test")
  node.vocab_size, node.vocab_multiple = vocab, 128
  model = MODELS.build(MODELS.parse(node, "model"))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab, (rows, seq + 1))
  weights = np.ones((rows, seq), np.float32)
  weights[1, 10:] = 0
  batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
           "weights": jnp.asarray(weights)}
  return model, batch, random_params(model, batch["inputs"])


def random_params(module, *inputs, seed=0, std=0.1):
  """Parameters of `module` drawn with numpy from its abstract shapes.

  Tests use this instead of `module.init`: compiling flax's random initialisers
  costs seconds of CPU per model, drawing the same shapes with numpy nothing.
  Norm scales start near one so activations keep their size.
  """
  rng = np.random.default_rng(seed)
  abstract = nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), *inputs)["params"])

  def draw(path, leaf):
    noise = rng.normal(0.0, std, leaf.shape).astype(np.float32)
    return jnp.asarray(noise + 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else noise)

  return jax.tree_util.tree_map_with_path(draw, abstract)


def _model(node, **changes):
  for key, value in changes.items():
    node[key] = value
  return MODELS.build(MODELS.parse(node, "model"))


@pytest.fixture(scope="module", params=list(MODELS_UNDER_TEST))
def model_and_params(request):
  model = _model(MODELS_UNDER_TEST[request.param]())
  params = random_params(model, TOKENS)
  return request.param, model, params, jax.jit(model.apply)


def test_output_shape_and_dtype(model_and_params):
  name, model, params, apply = model_and_params
  logits = apply({"params": params}, TOKENS)
  assert logits.shape == (2, 16, model.cfg.vocab_size) and logits.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(logits)))


def test_changing_a_future_token_never_changes_earlier_logits(model_and_params):
  _, _, params, apply = model_and_params
  before = apply({"params": params}, TOKENS)
  for t in (5, 15):
    changed = TOKENS.at[:, t].set((TOKENS[:, t] + 1) % 128)
    after = apply({"params": params}, changed)
    np.testing.assert_array_equal(before[:, :t], after[:, :t])
    assert not np.allclose(before[:, t:], after[:, t:])


def _unstack(params, num_layers):
  out = {k: v for k, v in params.items() if k != "layers"}
  for i in range(num_layers):
    out[f"layers_{i}"] = jax.tree.map(lambda x, i=i: x[i], params["layers"])
  return out


def test_scan_and_unrolled_agree_on_outputs_and_gradients():
  model = _model(llama.model_node("test"))
  params = random_params(model, TOKENS)
  unrolled = _model(llama.model_node("test"), scan_layers=False)
  flat = _unstack(params, model.cfg.num_layers)
  assert (jax.tree.structure(nn.meta.unbox(jax.eval_shape(unrolled.init, jax.random.key(0),
                                                          TOKENS)["params"]))
          == jax.tree.structure(flat))

  def loss(m):
    def fn(p):
      logits, state = m.apply({"params": p}, TOKENS, mutable=["losses"])
      aux = sum(jnp.sum(v) for v in jax.tree.leaves(state.get("losses", {})))
      return jnp.mean(jax.nn.log_softmax(logits)[..., 3]) + aux
    return fn

  (ls, gs), (lu, gu) = (jax.jit(jax.value_and_grad(loss(model)))(params),
                        jax.jit(jax.value_and_grad(loss(unrolled)))(flat))
  np.testing.assert_allclose(ls, lu, rtol=1e-6)
  gs = _unstack(gs, model.cfg.num_layers)
  assert jax.tree.structure(gs) == jax.tree.structure(gu)
  for a, b in zip(jax.tree.leaves(gs), jax.tree.leaves(gu)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def _attention(implementation, **fields):
  """The attention layer with `implementation`, 4 query heads over 2 kv heads of width 8."""
  from modules.attention import ATTENTION
  node = registry("attention").node("attention", num_heads=4, num_kv_heads=2,
                                    implementation=implementation,
                                    position=registry("position").node("rope"), **fields)
  return ATTENTION.build(ATTENTION.parse(node, "attention"), dim=32)


@pytest.mark.usefixtures("highest_precision")  # on a TPU: float32 matmuls
def test_attention_implementations_agree():
  xla, other = _attention("xla"), _attention("dot_product")
  x = jax.random.normal(jax.random.key(0), (2, 16, 32))
  pos = jnp.broadcast_to(jnp.arange(16), (2, 16))
  params = {"params": random_params(xla, x, pos, None)}
  segments = jnp.repeat(jnp.array([[0, 1]]), 8, axis=1).repeat(2, axis=0)
  for seg in (None, segments):
    np.testing.assert_allclose(jax.jit(xla.apply)(params, x, pos, seg),
                               jax.jit(other.apply)(params, x, pos, seg), rtol=1e-4, atol=1e-5)


def _attention_cfg(**fields):
  """The node an implementation reads its settings from (the layer's AttentionConfig)."""
  from modules.attention import AttentionConfig
  return AttentionConfig(num_heads=4, position=None, **fields)


@pytest.mark.usefixtures("highest_precision")  # on a TPU: float32 matmuls
def test_xla_attention_gradients_equal_jax_dot_product_attention():
  """The softmax normalised after the second matmul, differentiated, against jax's own."""
  from modules.attn_xla import xla_attention
  from modules.masks import Mask
  q, k, v = (jax.random.normal(key, (2, 16, heads, 8))
             for key, heads in zip(jax.random.split(jax.random.key(1), 3), (4, 2, 2)))
  segments = jnp.repeat(jnp.array([[0, 1, 1, 2]]), 4, axis=1).repeat(2, axis=0)
  mask = Mask(segment_ids_BxL=segments).array(16)
  def loss(fn):
    return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)))
  cfg = _attention_cfg()
  ours = jax.grad(loss(lambda q, k, v: xla_attention(q, k, v, Mask(explicit_Bx1xLxS=mask), cfg)),
                  argnums=(0, 1, 2))(q, k, v)
  theirs = jax.grad(loss(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask)),
                    argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("highest_precision")  # on a TPU: float32 matmuls
def test_bfloat16_attention_with_float32_logits_on_request():
  """bfloat16 inputs: logits_dtype=float32 keeps the logits' float32 (closer to the float32
  result); the default writes them in bfloat16, within bfloat16's rounding of it."""
  from modules.masks import Mask
  from modules.attn_xla import xla_attention
  q, k, v = (jax.random.normal(key, (2, 64, heads, 16)) * 2
             for key, heads in zip(jax.random.split(jax.random.key(2), 3), (4, 2, 2)))
  mask, cfg = Mask(), _attention_cfg()
  want = xla_attention(q, k, v, mask, cfg)
  bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  compute = xla_attention(*bf, mask, cfg).astype(jnp.float32)
  wide = xla_attention(*bf, mask, _attention_cfg(logits_dtype="float32")).astype(jnp.float32)
  err_compute, err_wide = (float(jnp.abs(x - want).max()) for x in (compute, wide))
  assert err_wide < err_compute < 0.1


@pytest.mark.usefixtures("highest_precision")  # on a TPU: float32 matmuls
def test_chunked_attention_equals_xla_in_value_and_gradient():
  """Blocks of 4 queries over a length of 16, with and without packed documents."""
  xla, chunked = _attention("xla"), _attention("chunked", query_chunk_size=4)
  x = jax.random.normal(jax.random.key(0), (2, 16, 32))
  pos = jnp.broadcast_to(jnp.arange(16), (2, 16))
  params = {"params": random_params(xla, x, pos, None)}
  segments = jnp.repeat(jnp.array([[0, 1, 1, 2]]), 4, axis=1).repeat(2, axis=0)
  for seg in (None, segments):
    def loss(p, x, module):
      return jnp.sum(jnp.sin(module.apply(p, x, pos, seg)))
    want, want_grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)(
        params, x, xla)
    got, got_grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)(
        params, x, chunked)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _splash_case(packed):
  """[2, 256] tokens: 4 query heads over 2 kv heads of width 64; with packing, 3 documents a
  row whose boundaries fall inside the kernel's 128-token blocks."""
  q, k, v = (jax.random.normal(key, (2, 256, heads, 64))
             for key, heads in zip(jax.random.split(jax.random.key(0), 3), (4, 2, 2)))
  lengths = jnp.array([[60, 130, 66], [200, 20, 36]])
  seg = jax.vmap(lambda n: jnp.repeat(jnp.arange(3), n, total_repeat_length=256))(lengths)
  return q, k, v, seg if packed else None


def splash_against_xla(packed, *, mesh=False):
  """(splash's, xla's) (loss, (dq, dk, dv)) of a scalar loss of the attention output on
  `_splash_case(packed)`, splash in blocks of 128 (Pallas interpret mode off TPU, the native
  kernel on a TPU); with `mesh`, through shard_map on a one-device mesh with the trainer's
  logical rules. Also measured on the chip by tests/tpu_tolerances.py."""
  from modules.masks import Mask
  from modules.attn_splash import splash_attention
  q, k, v, seg = _splash_case(packed)
  mask, cfg = Mask(segment_ids_BxL=seg), _attention_cfg(splash_block_size=128)
  return against_xla(splash_attention, q, k, v, mask, cfg, mesh=mesh)


def against_xla(attend, q, k, v, mask, cfg, *, mesh: bool = False):
  """(attend's, xla's) (loss, (dq, dk, dv)) of a scalar loss of the attention output; with
  `mesh`, `attend` through shard_map on a one-device mesh with the trainer's logical rules."""
  from modules.attn_xla import xla_attention
  from trainer import meshes

  def loss(fn):
    return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, mask, cfg))),
                                      argnums=(0, 1, 2)))
  want = loss(xla_attention)(q, k, v)
  run = loss(attend)
  if not mesh:
    return run(q, k, v), want
  devices = np.array(jax.devices()[:1]).reshape((1,) * len(meshes.AXES))
  with (jax.set_mesh(jax.sharding.Mesh(devices, meshes.AXES)),
        nn.logical_axis_rules(meshes.DEFAULT_RULES)):
    return run(q, k, v), want


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("mesh", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_splash_attention_equals_xla_in_value_and_gradient(packed, mesh):
  """Pallas interpret mode on CPU; on a TPU the native kernel, whose own matmul precision puts
  it further from xla than float32 rounding: there the chip's tolerances."""
  (got, got_grads), (want, want_grads) = splash_against_xla(packed, mesh=mesh)
  if tpu_tolerances.on_tpu():
    tpu_tolerances.assert_within((got, got_grads), (want, want_grads), case="splash")
    return
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for a, b in zip(got_grads, want_grads):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_splash_blocks_are_multiples_of_128_that_divide_the_length():
  from modules.attn_splash import block_sizes
  with pytest.raises(ConfigError, match="positive multiple of 128"):
    _attention("splash", splash_block_size=100)
  assert block_sizes(256, 512).block_kv == 256  # clipped to the length
  with pytest.raises(ConfigError, match="length 384 must be a multiple of the block 256"):
    block_sizes(384, 256)


def test_parallel_block_sums_both_branches_of_one_input():
  from modules.attention import ATTENTION
  from modules.block import BLOCKS
  from modules.mlp import FFN
  node = registry("block").node(
      "parallel", attention=registry("attention").node("attention", num_heads=4,
                                                       position=registry("position").node("rope")),
      ffn=registry("ffn").node("mlp", hidden_dim=32), norm=registry("norm").node("rmsnorm"))
  block = BLOCKS.build(BLOCKS.parse(node, "block"), dim=16)
  x = jax.random.normal(jax.random.key(0), (1, 6, 16))
  pos = jnp.arange(6)[None]

  p = random_params(block, x, pos, None)

  @jax.jit
  def both(x):
    h = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5) * p["attention_norm"]["scale"]
    attn = ATTENTION.build(block.cfg.attention, dim=16).apply({"params": p["attention"]}, h,
                                                              pos, None)
    ffn = FFN.build(block.cfg.ffn, dim=16).apply({"params": p["ffn"]}, h)
    return block.apply({"params": p}, x, pos, None), x + attn + ffn

  y, expected = both(x)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
  assert "ffn_norm" not in p
