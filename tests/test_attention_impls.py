"""The attention implementations' registry (modules/attn_registry.py): each registered
implementation does what it declares, against `xla` through the attention layer, and the layer
refuses in one line what an implementation does not declare."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library and the implementations)
from core.registry import ConfigError, registry
from modules import attn_registry, masks
from modules.attention import ATTENTION, Attention, AttentionConfig
from modules.attn_registry import IMPLEMENTATIONS, Context, Supports
from modules.masks import Mask
from tests import tpu_tolerances
from tests.conftest import ROOT, xla_flags
from tests.test_modules import random_params

# Every test here compares attention outputs: on a TPU, float32 matmuls at float32 precision
# (they would take one bfloat16 pass); on CPU nothing changes.
pytestmark = pytest.mark.usefixtures("highest_precision")

NAMES = IMPLEMENTATIONS.names()
LENGTH = 128  # one block of `splash` (its blocks are multiples of 128)
PREFILL = 96  # a decode test's prompt: 3 query chunks of `chunked`, then one token a step
# A value that turns each per-layer option (an `option()` field of AttentionConfig) on, for the
# test that every implementation declaring it agrees with `xla` and every other refuses it.
OPTION_VALUES: dict = {"logit_softcap": 0.5,  # below the test's logits: the cap bites
                       "sliding_window": 16}  # shorter than the test's documents


def _cfg(implementation: str, **fields) -> AttentionConfig:
  node = registry("attention").node(
      "attention", num_heads=4, num_kv_heads=2, head_dim=64, implementation=implementation,
      query_chunk_size=32, splash_block_size=128, position=registry("position").node("rope"),
      **fields)
  return ATTENTION.parse(node, "attention")


def _inputs():
  x = jax.random.normal(jax.random.key(0), (2, LENGTH, 32))
  pos = jnp.broadcast_to(jnp.arange(LENGTH), (2, LENGTH))
  lengths = jnp.array([[40, 50, 38], [100, 20, 8]])  # 3 documents a row, unequal
  seg = jax.vmap(lambda n: jnp.repeat(jnp.arange(3), n, total_repeat_length=LENGTH))(lengths)
  return x, pos, seg


def _value_and_grad(layer, params, x, pos, seg):
  loss = lambda p, x: jnp.sum(jnp.sin(layer.apply(p, x, pos, seg)))
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)


def _assert_agree(got, want, *, name):
  """`name`'s (loss, gradients) against xla's: float32 rounding apart; on a TPU within the
  chip's tolerances at `highest` (tests/tpu_tolerances.py: each Pallas kernel has its own).
  A gradient's entry near zero is a sum of terms on the scale of the array's largest entries,
  whose rounding it carries: its absolute tolerance is 1e-5, or 1e-6 of the array's largest
  entry where that is more (8 float32 epsilons; summed in another order, pallas_hd64's
  transposed products moved one entry of 0.039 in a projection's gradient of entries up to 34
  by 1.5e-5)."""
  if tpu_tolerances.on_tpu():
    tpu_tolerances.assert_within(got, want, case=name)
    return
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=max(1e-5, 1e-6 * float(np.abs(b).max())))


def _decoded(layer, params, x, pos):
  """The layer's outputs for a prompt of PREFILL tokens, then two tokens one at a time, through
  its KV cache (the cache holds LENGTH slots)."""
  cache = jax.eval_shape(lambda: layer.init(jax.random.key(0), x, pos, None, decode=True))
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), nn.meta.unbox(cache["cache"]))
  step = jax.jit(lambda c, x, p: layer.apply({**params, "cache": c}, x, p, None, decode=True,
                                             mutable=["cache"]))
  outs = []
  for start, end in ((0, PREFILL), (PREFILL, PREFILL + 1), (PREFILL + 1, PREFILL + 2)):
    out, variables = step(cache, x[:, start:end], pos[:, start:end])
    cache = variables["cache"]
    outs.append(out)
  return jnp.concatenate(outs, axis=1)


def _one_line_refusal(call, *needles):
  with pytest.raises(ConfigError) as e:
    call()
  message = str(e.value)
  assert "\n" not in message and all(n in message for n in needles), message
  return message


def test_one_file_and_one_signature_each():
  for name in NAMES:
    attend = IMPLEMENTATIONS.get(name).attend
    assert attend.__module__ == f"modules.attn_{name}"
    params = list(inspect.signature(attend).parameters.values())
    assert len(params) == 5 and [p.name for p in params[3:]] == ["mask", "cfg"], name
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params)


def test_the_reference_supports_everything():
  """`xla` decodes in place of an implementation that cannot, so it must support all of it."""
  options = set(attn_registry.option_names(AttentionConfig))
  xla = IMPLEMENTATIONS.get(attn_registry.REFERENCE).supports
  assert xla.segments and xla.decode and xla.context is Context.GATHERED
  assert set(xla.options) | set(xla.masks) == options


def test_every_option_has_a_value_to_test():
  options = set(attn_registry.option_names(AttentionConfig))
  assert set(OPTION_VALUES) == options
  for impl in NAMES:
    supports = IMPLEMENTATIONS.get(impl).supports
    assert set(supports.options) | set(supports.masks) <= options, impl


def test_every_mask_option_is_an_option_field():
  """modules/masks.py:Spec's fields are AttentionConfig's option() fields of the same name and
  default (the layer makes the spec from its config), DENSE names them all."""
  defaults = {f.name: f.default for f in dataclasses.fields(AttentionConfig)}
  for f in dataclasses.fields(masks.Spec):
    assert f.name in attn_registry.option_names(AttentionConfig) and defaults[f.name] == f.default
  assert set(masks.DENSE) == {f.name for f in dataclasses.fields(masks.Spec)} >= set(masks.SPLASH)


def _supported(name: str) -> dict:
  """The OPTION_VALUES that implementation `name` declares."""
  supports = IMPLEMENTATIONS.get(name).supports
  return {o: v for o, v in OPTION_VALUES.items() if supports.has(o)}


def test_each_option_changes_the_result():
  """Each OPTION_VALUES entry bites on the shared test's inputs, alone, in training (packed
  rows) and in decoding (the first PREFILL + 2 positions): so a path that ignores it fails."""
  x, pos, seg = _inputs()
  params = {"params": random_params(Attention(_cfg("xla"), dim=32), x, pos, None)}
  off = Attention(_cfg("xla"), dim=32)
  for option, value in OPTION_VALUES.items():
    on = Attention(_cfg("xla", **{option: value}), dim=32)
    for segments, end in ((seg, LENGTH), (None, PREFILL + 2)):
      diff = jnp.abs(on.apply(params, x, pos, segments) - off.apply(params, x, pos, segments))
      assert float(jnp.max(diff[:, :end])) > 1e-2, (option, segments is None)


@pytest.mark.parametrize("name", NAMES)
def test_declared_support_matches_what_it_does(name):
  """Through the layer, against `xla`: in training, plain and packed rows, then packed rows with
  every option it declares on (value and gradients); decoding from a KV cache (by `xla` in its
  place if it does not declare decoding) with those options on, against the full forward pass;
  an option it does not declare is refused in one line. Context shards: below."""
  supports = IMPLEMENTATIONS.get(name).supports
  x, pos, seg = _inputs()
  ref, layer = Attention(_cfg("xla"), dim=32), Attention(_cfg(name), dim=32)
  params = {"params": random_params(ref, x, pos, None)}
  for segments in (None, seg):
    if segments is not None and not supports.segments:
      _one_line_refusal(lambda: layer.apply(params, x, pos, segments), "packed documents")
      continue
    _assert_agree(_value_and_grad(layer, params, x, pos, segments),
                  _value_and_grad(ref, params, x, pos, segments), name=name)
  on, ref_on = (Attention(_cfg(n, **_supported(name)), dim=32) for n in (name, "xla"))
  if supports.segments and _supported(name):
    _assert_agree(_value_and_grad(on, params, x, pos, seg),
                  _value_and_grad(ref_on, params, x, pos, seg), name=name)
  decoding = attn_registry.choose(on.cfg, decode=True).name
  assert decoding == (name if supports.decode else attn_registry.REFERENCE)
  np.testing.assert_allclose(_decoded(on, params, x, pos),
                             ref_on.apply(params, x, pos, None)[:, :PREFILL + 2], atol=1e-5)
  for option, value in OPTION_VALUES.items():
    if option not in _supported(name):
      refused = Attention(_cfg(name, **{option: value}), dim=32)
      _one_line_refusal(lambda: refused.cfg.check(dim=32), f"attention.{option}=", name)


def _by_hand(q, k, v, segments, *, cap, window):
  """Causal GQA attention in float64 NumPy, logits scaled by K**-0.5, then Gemma-2's soft cap
  cap * tanh(logit / cap) (None: none), then the mask of causal positions in one segment, less
  than `window` positions back (None: any)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, length, h, dim = q.shape
  k, v = (np.repeat(a, h // a.shape[2], axis=2) for a in (k, v))
  logits = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(dim)
  if cap is not None:
    logits = cap * np.tanh(logits / cap)
  seen = np.tril(np.ones((length, length), bool))
  if window is not None:
    seen &= ~np.tril(np.ones((length, length), bool), -window)
  seen = seen[None] & (segments[:, :, None] == segments[:, None, :])
  logits = np.where(seen[:, None], logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  return np.einsum("bhqs,bshk->bqhk", weights / weights.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("cap,window", [(None, None), (3.0, None), (None, 3), (3.0, 5)])
def test_options_by_hand(cap, window):
  """`xla` (the reference the others are held to) against attention written out in NumPy, on
  packed rows: the soft cap applies to the scaled logits, before the mask; the window keeps the
  query and the window - 1 positions before it."""
  keys = jax.random.split(jax.random.key(3), 3)
  q = jax.random.normal(keys[0], (2, 16, 4, 8)) * 3  # logits of a few units: the cap bites
  k, v = (jax.random.normal(key, (2, 16, 2, 8)) for key in keys[1:])
  segments = np.repeat(np.array([[0, 1], [0, 0]]), 8, axis=1)
  cfg = _cfg("xla", logit_softcap=cap, sliding_window=window)
  got = IMPLEMENTATIONS.get("xla").attend(
      q, k, v, Mask(spec=masks.Spec.of(cfg), segment_ids_BxL=jnp.asarray(segments)), cfg)
  want = _by_hand(q, k, v, segments, cap=cap, window=window)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
  if (cap, window) != (None, None):  # not the plain attention
    assert np.abs(want - _by_hand(q, k, v, segments, cap=None, window=None)).max() > 1e-2


def test_logit_softcap_refused_where_not_supported(tmp_path):
  """dot_product refuses it in one line when the model is built, before anything is written;
  so does a bad value; LLaMA (and Qwen3, GPT-2) export refuses it by its field's path."""
  from launcher import main as main_lib  # pylint: disable=import-outside-toplevel
  from modules import hf_maps  # pylint: disable=import-outside-toplevel
  for impl, cap, words in (("dot_product", 50.0, "attention.implementation=dot_product does not "
                            "support attention.logit_softcap=50.0; implementations that do: "
                            "chunked, splash, xla"),
                           ("xla", -1.0, "attention.logit_softcap must be a positive number")):
    out = tmp_path / impl
    assert main_lib.main(["axtrain", "--config=configs/llama.py:size=test",
                          f"--config.model.block.attention.implementation={impl}",
                          f"--config.model.block.attention.logit_softcap={cap}",
                          f"--output_dir={out}"]) == 2
    assert not out.exists()
    _one_line_refusal(lambda: _cfg(impl, logit_softcap=cap).check(dim=32), words)
  node = hf_maps.FAMILIES["LlamaForCausalLM"].model_node(
      {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
       "num_attention_heads": 4, "max_position_embeddings": 64})
  node.block.attention.logit_softcap = 50.0
  m = registry("model").parse(node, "model")
  _one_line_refusal(lambda: hf_maps.family_of_model(m).hf_config(m),
                    "model.block.attention.logit_softcap is 50.0 (LlamaForCausalLM takes only "
                    "None)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _WithOption(AttentionConfig):
  """AttentionConfig with one more per-layer option, which no implementation declares."""
  logit_cap: float | None = attn_registry.option(None)


@pytest.mark.parametrize("name", NAMES)
def test_an_option_it_does_not_declare_is_refused_in_one_line(name):
  """Set away from its default: refused by the config's check (which Registry.build runs)
  and by the layer itself; at its default, nothing to refuse."""
  base = dict(num_heads=4, num_kv_heads=2, head_dim=64, implementation=name,
              position=_cfg("xla").position)
  _WithOption(**base).check(dim=32)
  on = _WithOption(**base, logit_cap=30.0)
  message = _one_line_refusal(lambda: on.check(dim=32), "attention.logit_cap=30.0",
                              f"implementation={name}")
  assert message.endswith("; none does"), message
  x, pos, _ = _inputs()
  _one_line_refusal(lambda: Attention(on, dim=32).init(jax.random.key(0), x, pos, None),
                    "attention.logit_cap=30.0")


def _causal_only(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, mask, cfg):
  """An implementation that attends causally over one sequence and nothing else."""
  del cfg
  assert mask.causal_only
  return jax.nn.dot_product_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxK, is_causal=True)


def test_what_an_implementation_does_not_declare_is_refused_or_stood_in_for(monkeypatch):
  """A registry with `xla` and `causal_only`, which declares no packed documents, no context
  parallelism, no decoding: the layer refuses the first two in one line and decodes with
  `xla`; the plain causal case runs it."""
  fresh = attn_registry.Implementations()
  xla = IMPLEMENTATIONS.get("xla")
  fresh.register("xla", xla.supports)(xla.attend)
  fresh.register("causal_only", Supports(segments=False, context=None, decode=False))(
      _causal_only)
  monkeypatch.setattr(attn_registry, "IMPLEMENTATIONS", fresh)
  x, pos, seg = _inputs()
  ref, layer = Attention(_cfg("xla"), dim=32), Attention(_cfg("causal_only"), dim=32)
  params = {"params": random_params(ref, x, pos, None)}
  _assert_agree(_value_and_grad(layer, params, x, pos, None),
                _value_and_grad(ref, params, x, pos, None), name="causal_only")
  _one_line_refusal(lambda: layer.apply(params, x, pos, seg),
                    "implementation=causal_only does not support packed documents",
                    "implementations that do: xla")
  _one_line_refusal(lambda: attn_registry.check_context(layer.cfg, length=LENGTH, count=2),
                    "implementation=causal_only does not support context parallelism")
  assert attn_registry.choose(layer.cfg, decode=True).name == "xla"
  np.testing.assert_allclose(_decoded(layer, params, x, pos),
                             ref.apply(params, x, pos, None)[:, :PREFILL + 2], atol=1e-5)
  _one_line_refusal(lambda: fresh.get("causal"), "did you mean 'causal_only'")
  with pytest.raises(ValueError, match="registered twice"):
    fresh.register("xla", xla.supports)(xla.attend)


def context_agreement() -> dict:
  """In a process with 4 CPU devices: each implementation that declares context parallelism,
  through the layer on a data=2 x context=2 mesh (inputs in the load-balanced layout), packed
  rows with every option it declares on, against `xla` with the same options on one device;
  {name: (relative difference of the value, largest of the gradients' (each against its
  largest entry))}, and under "bites" {option: the relative change of xla's value on one device
  when it is on alone}."""
  from modules import context  # pylint: disable=import-outside-toplevel
  from trainer import meshes, sharding  # pylint: disable=import-outside-toplevel
  length = 512  # splash: each of the 2 x 2 chunks is one block of 128
  x = jax.random.normal(jax.random.key(0), (2, length, 32))
  pos = jnp.broadcast_to(jnp.arange(length), (2, length))
  seg = jnp.repeat(jnp.array([[0, 1, 2, 2], [0, 0, 0, 1]]), length // 4, axis=1)
  z = lambda a: context.zigzag(a, 2)
  params = {"params": random_params(Attention(_cfg("xla"), dim=32), x, pos, None)}
  value = lambda options: Attention(_cfg("xla", **options), dim=32).apply(params, x, pos, seg)
  off = value({})
  out = {"bites": {o: float(jnp.max(jnp.abs(value({o: v}) - off)) / jnp.max(jnp.abs(off)))
                   for o, v in OPTION_VALUES.items()}}
  mesh = sharding.make_mesh({"data": 2, "stage": 1, "fsdp": 1, "context": 2, "model": 1},
                            jax.devices())
  for name in NAMES:
    if IMPLEMENTATIONS.get(name).supports.context is None:
      continue
    want = _value_and_grad(Attention(_cfg("xla", **_supported(name)), dim=32), params, x, pos,
                           seg)
    layer = Attention(_cfg(name, **_supported(name)), dim=32)
    loss = lambda p, x: jnp.sum(jnp.sin(context.unzigzag(layer.apply(p, z(x), z(pos), z(seg)),
                                                         2)))
    with jax.set_mesh(mesh), nn.logical_axis_rules(meshes.DEFAULT_RULES):
      got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    out[name] = (float(abs(got[0] - want[0]) / abs(want[0])), max(
        float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
        for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]))))
  return out


def test_declared_context_parallelism_agrees_with_one_device():
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(4))
  code = ("import json; from tests.test_attention_impls import context_agreement; "
          "print(json.dumps(context_agreement()))")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  got = json.loads(done.stdout.strip().splitlines()[-1])
  bites = got.pop("bites")
  assert set(bites) == set(OPTION_VALUES) and min(bites.values()) > 1e-2, bites
  assert set(got) == {n for n in NAMES if IMPLEMENTATIONS.get(n).supports.context is not None}
  for name, (value, grad) in got.items():
    assert value <= 1e-5 and grad <= 1e-5, (name, value, grad)
