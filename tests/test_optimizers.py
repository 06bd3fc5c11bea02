"""Optimizers: the weight-decay mask by logical axes, each kind against a hand-written optax
chain, 50 steps of tiny per kind, and bad hyperparameters refused."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import tiny
from core.registry import ConfigError, registry
from modules import gpt2, llama
from modules.decoder import MODELS
from launcher import main as main_lib
from tests.conftest import ROOT
from trainer import config as config_lib, experiment, meshes
from trainer.optimizer import OPTIMIZERS
from trainer.param_axes import decay_mask, logical_axes


def boxed_params(node, *, scan: bool, real: bool = False):
  node = node.copy_and_resolve_references()
  node.scan_layers = scan
  model = MODELS.build(MODELS.parse(node, "model"))
  init = lambda key: model.init(key, jnp.zeros((1, 8), jnp.int32))["params"]
  return jax.jit(init)(jax.random.key(0)) if real else jax.eval_shape(init, jax.random.key(0))


def moe_node():
  node = llama.model_node("test")
  node.block.ffn = registry("ffn").node("moe", num_experts=4, top_k=2, hidden_dim=32)
  return node


LAYOUTS = {
    "tiny": lambda: llama.model_node("tiny"),
    "llama_1b": lambda: llama.model_node("1b"),  # abstract only: eval_shape allocates nothing
    "gpt2": lambda: gpt2.node(gpt2.Size(64, 2, 4, vocab_size=256, max_length=64)),
    "moe": moe_node,
}


def decisions(params, *, decay_embeddings=True) -> dict[str, bool]:
  """{path without the layer index: decayed?}; one entry per parameter of a layer."""
  mask = decay_mask(logical_axes(params), decay_embeddings=decay_embeddings)
  out = {}
  for path, decayed in jax.tree_util.tree_leaves_with_path(mask):
    keys = [k.key for k in path]
    keys[0] = "layers" if keys[0].startswith("layers_") else keys[0]
    out["/".join(keys)] = decayed
  return out


# Written from the parameter names, independently of the axis rule.
WEIGHTS = {"q", "k", "v", "o", "wi", "wu", "wo", "head", "router"}
EMBEDDINGS = {"embedding"}  # the token table and learned positions are both called so


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("decay_embeddings", [True, False])
def test_decay_mask_by_role_same_for_scanned_and_unrolled(layout, decay_embeddings):
  scanned = decisions(boxed_params(LAYOUTS[layout](), scan=True),
                      decay_embeddings=decay_embeddings)
  unrolled = decisions(boxed_params(LAYOUTS[layout](), scan=False),
                       decay_embeddings=decay_embeddings)
  assert scanned == unrolled
  expected = {path: path.split("/")[-1] in WEIGHTS
              or (decay_embeddings and path.split("/")[-1] in EMBEDDINGS) for path in scanned}
  assert scanned == expected
  never = [p for p in scanned if p.endswith(("scale", "bias"))]
  assert layout == "moe" or never  # every dense layout has norm scales (and gpt2 biases)
  assert not any(scanned[p] for p in never)


def test_gpt2_layout_has_the_shapes_a_rank_rule_gets_wrong():
  axes = logical_axes(boxed_params(LAYOUTS["gpt2"](), scan=True))
  block = axes["layers"]["block"]
  assert block["attention"]["q_bias"].names == ("layers", "heads", "head_dim")
  assert block["attention_norm"]["scale"].names == ("layers", "norm")


# -- one step of each optimizer against a hand-written optax chain -------------------------

LR, WD, CLIP, WARMUP = 1e-2, 0.3, 0.5, 2


def schedule_by_hand(step):
  return jnp.where(step < WARMUP, LR * step / WARMUP, LR)


def path_mask(params, names):
  return jax.tree_util.tree_map_with_path(lambda p, _: p[-1].key in names, params)


def muon_dims_by_hand(params):
  """Unrolled LLaMA: q/k/v embed -> heads x head_dim, o the reverse, the MLP's in -> out."""
  dims = {"q": ((0,), (1, 2)), "k": ((0,), (1, 2)), "v": ((0,), (1, 2)), "o": ((0, 1), (2,)),
          "wi": ((0,), (1,)), "wu": ((0,), (1,)), "wo": ((0,), (1,))}
  def one(path, _):
    d = dims.get(path[-1].key)
    return None if d is None else optax.contrib.MuonDimensionNumbers(*d)
  return jax.tree_util.tree_map_with_path(one, params)


def by_hand(kind, params):
  clip = optax.clip_by_global_norm(CLIP)
  mask = path_mask(params, WEIGHTS | EMBEDDINGS)
  decay_and_scale = [optax.add_decayed_weights(WD, mask),
                     optax.scale_by_learning_rate(schedule_by_hand)]
  if kind == "adamw":
    return optax.chain(clip, optax.adamw(schedule_by_hand, b1=0.8, b2=0.9, eps=1e-6,
                                         weight_decay=WD, mask=mask))
  if kind == "lion":
    return optax.chain(clip, optax.lion(schedule_by_hand, b1=0.8, b2=0.9, weight_decay=WD,
                                        mask=mask))
  if kind == "sgd":
    return optax.chain(clip, optax.trace(decay=0.7, nesterov=True), *decay_and_scale)
  if kind == "adafactor":
    return optax.chain(clip, optax.adafactor(None, min_dim_size_to_factor=16, decay_rate=0.7,
                                             multiply_by_parameter_scale=False,
                                             clipping_threshold=1.0, momentum=0.5),
                       optax.scale(-1.0), *decay_and_scale)
  assert kind == "muon"  # weight_decay 0: optax's muon decays its Adam part without a mask
  return optax.chain(clip, optax.contrib.muon(
      schedule_by_hand, beta=0.9, adam_b1=0.8, adam_b2=0.9, consistent_rms=0.2,
      weight_decay=0.0, adam_weight_decay=0.0, muon_weight_dimension_numbers=muon_dims_by_hand(
          params)))


FIELDS = {
    "adamw": dict(b1=0.8, b2=0.9, eps=1e-6),
    "lion": dict(b1=0.8, b2=0.9),
    "sgd": dict(momentum=0.7, nesterov=True),
    "adafactor": dict(min_dim_size_to_factor=16, decay_rate=0.7, momentum=0.5),
    "muon": dict(beta=0.9, adam_b1=0.8, adam_b2=0.9, weight_decay=0.0),
}


def ours(kind, boxed, **fields):
  node = registry("optimizer").node(
      kind, schedule=registry("schedule").node("constant", warmup_steps=WARMUP),
      **{"learning_rate": LR, "clip_norm": CLIP, "weight_decay": WD, **FIELDS[kind], **fields})
  return OPTIMIZERS.build(OPTIMIZERS.parse(node, "optimizer"), total_steps=10,
                          axes=logical_axes(boxed))


@pytest.fixture(scope="module")
def llama_test():
  # Unrolled: optax's chains by hand then take a statistic over a parameter (Adafactor's RMS
  # clip) per layer, as ours do; tests/test_optimizer_stacks.py carries each kind to a
  # scanned stack.
  boxed = boxed_params(llama.model_node("test"), scan=False, real=True)
  params = nn.meta.unbox(boxed)
  keys = iter(jax.random.split(jax.random.key(1), 3 * len(jax.tree.leaves(params))))
  # Large enough that the clip is active; one gradient per step.
  grads = [jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape), params)
           for _ in range(3)]
  return boxed, params, grads


def run_steps(tx, state, params, grads):
  out, update = [], jax.jit(tx.update)
  for g in grads:
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    out.append(params)
  return out


@pytest.mark.parametrize("kind", FIELDS)
def test_three_steps_equal_a_hand_written_chain(kind, llama_test):
  boxed, params, grads = llama_test
  opt = ours(kind, boxed)
  mine = run_steps(opt.tx, nn.meta.unbox(opt.tx.init(boxed)), params, grads)
  ref = by_hand(kind, params)
  theirs = run_steps(ref, ref.init(params), params, grads)
  for a, b in zip(mine, theirs):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), a, b)
  moved = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(
      jax.tree.leaves(mine[-1]), jax.tree.leaves(params)))
  assert moved > 1e-5


@pytest.mark.parametrize("kind", OPTIMIZERS.kinds())
def test_the_state_shardings_pair_with_the_state_leaf_for_leaf(kind):
  """The step-memory check compiles the step for the state with its shardings
  (`abstract_state_inputs`), and checkpoints and memory figures walk the two side by side:
  one sharding per array of the state, for every optimizer. muon's Adam part holds optax's
  MaskedNode in place of the matrices that its Newton-Schulz part owns."""
  cfg = tiny.get_config()
  cfg.model = llama.model_node("test")
  cfg.optimizer = registry("optimizer").node(kind, learning_rate=1e-3,
                                             schedule=cfg.optimizer.schedule)
  exp = experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))
  state = nn.meta.unbox(exp.abstract_state)
  assert jax.tree.structure(exp.state_shardings) == jax.tree.structure(state)
  inputs = exp.abstract_state_inputs()
  assert jax.tree.leaves(inputs) and all(
      x.shape == a.shape and x.sharding == s for x, a, s in zip(
          jax.tree.leaves(inputs), jax.tree.leaves(state), jax.tree.leaves(exp.state_shardings)))


def test_every_optimizer_is_tested():
  assert set(FIELDS) == set(LEARNING_RATES) == set(OPTIMIZERS.kinds())


def test_muon_weight_decay_is_the_shared_one(llama_test):
  boxed, params, grads = llama_test
  steps = {}
  for wd in (0.0, WD):
    opt = ours("muon", boxed, weight_decay=wd)
    update = jax.jit(opt.tx.update)
    state = update(grads[0], nn.meta.unbox(opt.tx.init(boxed)), params)[1]  # learning rate 0
    steps[wd] = update(grads[1], state, params)[0]
  mask = path_mask(params, WEIGHTS | EMBEDDINGS)
  want = jax.tree.map(lambda p, m: -LR / WARMUP * WD * p * m, params, mask)
  got = jax.tree.map(jnp.subtract, steps[WD], steps[0.0])
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-9), got, want)


# -- 50 steps of a small model on the demo corpus ------------------------------------------

LEARNING_RATES = {"adamw": 3e-3, "adafactor": 3e-3, "lion": 1e-3, "sgd": 0.3, "muon": 3e-3}


# The default (adamw) in the quick suite; every kind trains through the CLI there too
# (tests/test_kinds_cli.py), and `make test-slow` trains each of the others fifty steps.
@pytest.mark.parametrize("kind", [k if k == "adamw" else pytest.param(k, marks=pytest.mark.slow)
                                  for k in LEARNING_RATES])
def test_fifty_steps_of_tiny_lower_the_loss(kind):
  cfg = tiny.get_config()  # the demo recipe with LLaMA size `test` (2 layers, dim 64)
  cfg.model = llama.model_node("test")
  cfg.model.scan_layers = False
  cfg.trainer.max_steps = 50
  cfg.data.batch_size, cfg.data.seq_len = 4, 32
  cfg.optimizer = registry("optimizer").node(kind, learning_rate=LEARNING_RATES[kind],
                                             schedule=cfg.optimizer.schedule)
  exp = experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))
  state, losses = exp.init(), []
  data = exp.source.train_iterator(process_index=0, process_count=1)
  with exp.context():
    for _ in range(50):
      state, metrics = exp.step_fn(state, exp.global_batch(next(data)))
      losses.append(float(metrics["loss"]))
  assert losses[0] > math.log(256) - 0.2  # starts at chance
  assert np.mean(losses[-5:]) < losses[0] - 1.0, losses


# -- bad values ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind,fields,words", [
    ("adamw", dict(b1=1.0), "optimizer.b1: 1.0 is outside the allowed range [0, 1)"),
    ("adamw", dict(b2=-0.1), "optimizer.b2: -0.1 is outside the allowed range [0, 1)"),
    ("adamw", dict(weight_decay=-0.1), "optimizer.weight_decay: -0.1 is outside the allowed "
     "range [0, inf)"),
    ("adamw", dict(learning_rate=float("nan")), "optimizer.learning_rate: nan is outside the "
     "allowed range (0, inf)"),
    ("lion", dict(learning_rate=float("inf")), "optimizer.learning_rate: inf is outside"),
    ("sgd", dict(learning_rate=0.0), "optimizer.learning_rate: 0.0 is outside"),
    ("adamw", dict(learning_rate=-1e-3), "optimizer.learning_rate: -0.001 is outside"),
    ("adamw", dict(eps=0.0), "optimizer.eps: 0.0 is outside the allowed range (0, inf)"),
    ("sgd", dict(momentum=1.0), "optimizer.momentum: 1.0 is outside the allowed range [0, 1)"),
    ("adafactor", dict(decay_rate=0.0), "optimizer.decay_rate: 0.0 is outside the allowed range"
     " (0, 1]"),
    ("adafactor", dict(momentum=-0.5), "optimizer.momentum: -0.5 is outside"),
    ("muon", dict(beta=1.5), "optimizer.beta: 1.5 is outside the allowed range [0, 1)"),
    ("adamw", dict(clip_norm=0.0), "optimizer.clip_norm: 0.0 is outside the allowed range"),
    # Finite in Python, out of range as float32, the precision the steps compute in.
    ("adamw", dict(learning_rate=1e308), "optimizer.learning_rate: 1e+308 is inf in float32, "
     "the precision the steps compute in, outside the allowed range (0, inf)"),
    ("adamw", dict(learning_rate=1e-50), "optimizer.learning_rate: 1e-50 is 0 in float32"),
    ("adamw", dict(b2=0.99999999999), "optimizer.b2: 0.99999999999 is 1 in float32"),
])
def test_bad_hyperparameters_are_refused(kind, fields, words):
  node = registry("optimizer").node(
      kind, **{"learning_rate": 1e-3, **fields},
      schedule=registry("schedule").node("constant"))
  with pytest.raises(ConfigError) as e:
    OPTIMIZERS.build(OPTIMIZERS.parse(node, "optimizer"), total_steps=10, axes={})
  assert str(e.value).startswith(words)


def test_cli_refuses_b2_of_one_before_writing(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(ROOT)
  out = tmp_path / "run"
  code = main_lib.main(["axtrain", "--config=configs/tiny.py", "--config.optimizer.b2=1.0",
                        f"--output_dir={out}"])
  assert code == 2
  assert capsys.readouterr().err == ("axtrain: error: optimizer.b2: 1.0 is outside the allowed "
                                     "range [0, 1)\n")
  assert not out.exists()


def test_cli_clip_norm_none_turns_clipping_off(capsys, monkeypatch):
  monkeypatch.chdir(ROOT)
  code = main_lib.main(["axtrain", "--config=configs/tiny.py",
                        "--config.optimizer.clip_norm=None", "--print_config"])
  out = capsys.readouterr()
  assert code == 0, out.err
  assert "optimizer.clip_norm: None\n" in out.out
