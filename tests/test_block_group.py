"""Layer patterns (`block` kind `group`, modules/block_group.py): a repeating group of named blocks,
first dense then MoE (Llama 4's interleaving), scanned over its repeats, and followed by the
pattern's first layers where the depth is no multiple of it (`remainder`).

The group's layers are checked against the plain stack (a group of one block kind is the plain
model with its layers regrouped), a remainder against one group of every layer, scanned against
unrolled, its compiled size against its depth, its parameters' axes, and its config on the
command line: one member overridden or switched by name, and the one-line refusals."""

from __future__ import annotations

import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the layer library)
from core.registry import ConfigError, registry
from launcher import config_loading, convert, flat, run_dir
from modules import block_group, llama
from modules.decoder import MODELS
from tests.conftest import cli
from trainer import config as config_lib

TOKENS = jnp.array([[5, 17, 99, 3, 64, 120, 7, 42], [1, 2, 3, 4, 5, 6, 7, 8]])


def group_node(*, num_layers: int = 4, scan: bool = True, pattern=("dense", "moe"),
               remainder: str = "none"):
  """The `test` LLaMA whose layers alternate a dense MLP and a dropless 4-expert MoE."""
  node = llama.model_node("test")
  dense = node.block
  moe = dense.copy_and_resolve_references()
  moe.ffn = registry("ffn").node("moe", num_experts=4, top_k=2, hidden_dim=32,
                                 capacity_factor=0.0)
  node.block = registry("block").node("group", pattern=pattern, remainder=remainder,
                                      blocks={"dense": dense, "moe": moe})
  node.num_layers, node.scan_layers = num_layers, scan
  return node


def build(node):
  return MODELS.build(MODELS.parse(node, "model"))


def random_params(node, seed: int = 0):
  """Parameters of the model of `node` drawn at random (norm scales too), without compiling."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: (0.2 * rng.normal(size=a.shape)).astype(np.float32),
                      nn.meta.unbox(abstract_init(node)))


def logits(model, params):
  apply = lambda p: model.apply({"params": p}, TOKENS, mutable=["losses", "metrics"])
  out, state = jax.jit(apply)(params)
  return np.asarray(out), state


def abstract_init(node):
  return jax.eval_shape(build(node).init, jax.random.key(0), TOKENS)["params"]


def test_each_position_of_the_group_is_a_layer_stacked_over_the_repeats():
  boxed = abstract_init(group_node(num_layers=6))
  group = boxed["layers"]["block"]
  assert set(group) == {"dense_0", "moe_1"}
  leaves = jax.tree.leaves(group, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  assert all(leaf.names[0] == "layers" and leaf.value.shape[0] == 3 for leaf in leaves)
  assert group["moe_1"]["ffn"]["wi"].names == ("layers", "experts", "embed", "mlp")
  assert group["dense_0"]["ffn"]["wi"].value.shape == (3, 64, 128)
  assert "router" not in group["dense_0"]["ffn"]


def test_a_group_of_one_block_kind_is_the_plain_stack_regrouped():
  """Plain layer 2r + j is position j of repeat r: the same parameters give the same logits."""
  plain = llama.model_node("test")
  plain.num_layers = 4
  grouped = llama.model_node("test")
  grouped.block = registry("block").node("group", pattern=("a", "b"),
                                         blocks={"a": plain.block, "b": plain.block})
  grouped.num_layers = 4
  plain_model, group_model = build(plain), build(grouped)
  params = random_params(plain)
  stack = params["layers"]["block"]
  regrouped = {**params, "layers": {"block": {"a_0": jax.tree.map(lambda x: x[0::2], stack),
                                               "b_1": jax.tree.map(lambda x: x[1::2], stack)}}}
  assert jax.tree.map(jnp.shape, regrouped) == jax.tree.map(
      jnp.shape, nn.meta.unbox(abstract_init(grouped)))
  np.testing.assert_array_equal(logits(group_model, regrouped)[0], logits(plain_model, params)[0])


def test_scanned_and_unrolled_groups_compute_the_same():
  scanned, unrolled = build(group_node()), build(group_node(scan=False))
  params = random_params(group_node())
  per_repeat = {**{k: v for k, v in params.items() if k != "layers"},
                **{f"layers_{r}": jax.tree.map(lambda x, r=r: x[r], params["layers"])
                   for r in range(2)}}
  assert jax.tree.map(jnp.shape, per_repeat) == jax.tree.map(
      jnp.shape, nn.meta.unbox(abstract_init(group_node(scan=False))))
  (a, sa), (b, sb) = logits(scanned, params), logits(unrolled, per_repeat)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  loss = lambda state: sum(float(jnp.sum(x)) for x in jax.tree.leaves(state["losses"]))
  assert loss(sa) == pytest.approx(loss(sb), rel=1e-5) and loss(sa) > 0  # the MoE layers' aux


def test_a_remainder_is_the_pattern_s_first_layers_after_the_whole_repeats():
  """5 layers of ('dense', 'moe'): 2 repeats stacked, then layer 4 (dense) on its own."""
  boxed = abstract_init(group_node(num_layers=5, remainder="first"))
  assert set(boxed["layers"]["block"]) == {"dense_0", "moe_1"}
  assert boxed["layers"]["block"]["dense_0"]["ffn"]["wi"].value.shape == (2, 64, 128)
  assert set(boxed["layers_remainder"]["block"]) == {"dense_0"}
  wi = boxed["layers_remainder"]["block"]["dense_0"]["ffn"]["wi"]
  assert wi.names == ("embed", "mlp") and wi.value.shape == (64, 128)


def _as_one_group(params, *, repeats: int):
  """The parameters of ('dense', 'moe') x repeats + a remainder ('dense',) as those of one group
  of every layer, ('dense', 'moe', ..., 'dense'), repeated once: layer 2r + j is position j
  of repeat r, the last layer the remainder's."""
  stack, out = params["layers"]["block"], {}
  for r in range(repeats):
    out[f"dense_{2 * r}"] = jax.tree.map(lambda x, r=r: x[r:r + 1], stack["dense_0"])
    out[f"moe_{2 * r + 1}"] = jax.tree.map(lambda x, r=r: x[r:r + 1], stack["moe_1"])
  out[f"dense_{2 * repeats}"] = jax.tree.map(lambda x: x[None],
                                             params["layers_remainder"]["block"]["dense_0"])
  rest = {k: v for k, v in params.items() if k not in ("layers", "layers_remainder")}
  return {**rest, "layers": {"block": out}}


@pytest.mark.parametrize("scan", [True, False])
def test_a_remainder_computes_what_one_group_of_every_layer_does(scan):
  """The same weights give the same logits and MoE losses as the stack laid out as one group of
  all 5 layers (how Gemma 3's 26, 34 and 62 layers were configured before remainders)."""
  node = group_node(num_layers=5, remainder="first", scan=scan)
  whole = group_node(num_layers=5, pattern=("dense", "moe") * 2 + ("dense",))
  params = random_params(group_node(num_layers=5, remainder="first"))
  regrouped = _as_one_group(params, repeats=2)
  assert jax.tree.map(jnp.shape, regrouped) == jax.tree.map(
      jnp.shape, nn.meta.unbox(abstract_init(whole)))
  if not scan:
    params = convert.stack_layers(convert.split_layers(params, MODELS.parse(node, "model")),
                                  MODELS.parse(node, "model"), scan=False)
    assert set(params) >= {"layers_0", "layers_1", "layers_remainder"}
  (a, sa), (b, sb) = logits(build(node), params), logits(build(whole), regrouped)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  loss = lambda state: sum(float(jnp.sum(x)) for x in jax.tree.leaves(state["losses"]))
  assert loss(sa) == pytest.approx(loss(sb), rel=1e-5) and loss(sa) > 0


def _program_lines(node) -> int:
  """Lines of the lowered gradient of the model's summed logits."""
  model = build(node)
  params = nn.meta.unbox(abstract_init(node))
  grad = jax.jit(jax.grad(lambda p: jnp.sum(model.apply({"params": p}, TOKENS)[0])))
  return len(grad.lower(params).as_text().splitlines())


def test_the_compiled_program_does_not_grow_with_the_repeats():
  assert _program_lines(group_node(num_layers=4)) == _program_lines(group_node(num_layers=16))
  # with a remainder, 2 or 8 repeats: the program grows by the remainder's layer only
  with_remainder = [_program_lines(group_node(num_layers=n, remainder="first")) for n in (5, 17)]
  assert with_remainder[0] == with_remainder[1] > _program_lines(group_node(num_layers=4))
  # unrolled, it does: the count sees the layers
  assert _program_lines(group_node(num_layers=2, scan=False)) < _program_lines(
      group_node(num_layers=4, scan=False))


@pytest.mark.parametrize("change,message", [
    (dict(num_layers=5), "model.num_layers (5) must be a multiple of the 2 layers of "
                         "model.block.pattern ('dense', 'moe'), or set --config.model.block."
                         "remainder=first (2 whole repeats, then ('dense',))"),
    (dict(num_layers=1, remainder="first"), "model.num_layers (1) is fewer than the 2 layers of "
                                            "model.block.pattern ('dense', 'moe'), whose "
                                            "remainder follows whole repeats"),
    (dict(pattern=("dense", "mo")), "block.pattern names 'mo', which is not one of "
                                    "block.blocks (did you mean 'moe'?): dense, moe"),
    (dict(pattern=("dense", "dense")), "block.blocks.moe is in no layer of block.pattern "
                                       "('dense', 'dense'); name it there or remove it"),
    (dict(pattern=()), "block.pattern is empty"),
])
def test_bad_groups_are_refused_in_one_line(change, message):
  num_layers = change.pop("num_layers", 4)
  with pytest.raises(ConfigError) as e:
    abstract_init(group_node(num_layers=num_layers, **change))
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_member_named_what_no_override_can_reach_is_refused():
  node = group_node()
  node.block.blocks = {"global": node.block.blocks.dense, "moe": node.block.blocks.moe}
  with pytest.raises(ConfigError, match="'global' is no name for a block node .* no Python "
                                        "keyword"):
    MODELS.parse(node, "model")


def test_a_group_in_a_group_is_refused():
  node = group_node()
  node.block.blocks.moe = group_node().block
  with pytest.raises(ConfigError, match="block.blocks.moe is a group itself"):
    abstract_init(node)


CONFIG = '''from configs import llama
from tests.test_block_group import group_node


def get_config(arg=None):
  cfg = llama.get_config("size=test")
  cfg.model = group_node()
  return cfg
'''


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("group") / "group.py"
  path.write_text(CONFIG)
  return str(path)


def test_one_member_is_overridden_or_switched_by_its_name(config_file):
  cfg = config_loading.load(config_file, "--config.model.block.blocks.moe.ffn.num_experts=8",
                            "--config.model.block.blocks.dense.kind=parallel",
                            "--config.model.block.blocks.dense.separate_norms=true")
  m = config_lib.parse(cfg).model
  blocks = dict(m.block.blocks)
  assert blocks["moe"].ffn.num_experts == 8 and blocks["dense"].kind == "parallel"
  assert blocks["dense"].separate_norms and blocks["dense"].attention.num_heads == 4  # carried
  shown = flat.flatten(cfg)
  assert shown["model.block.blocks.moe.ffn.top_k"] == 2  # --print_config shows every option
  assert shown["model.block.pattern"] == ("dense", "moe")


def test_a_member_s_placement_fields_are_placement_as_the_block_s_are():
  assert run_dir.relaid("model.block.blocks.moe.attention.implementation")
  assert not run_dir.relaid("model.block.blocks.moe.attention.num_heads")


def test_what_a_group_config_chooses_gives_it_back_whole(config_file):
  cfg = config_loading.load(config_file, "--config.model.block.blocks.moe.ffn.top_k=1")
  chosen = config_lib.chosen(cfg)
  assert chosen["model"]["block"]["blocks"]["moe"]["ffn"] == {"kind": "moe", "num_experts": 4,
                                                              "hidden_dim": 32, "top_k": 1,
                                                              "capacity_factor": 0.0}
  resolved = json.loads(cfg.to_json_best_effort())
  assert json.loads(json.dumps(config_lib.with_defaults(chosen))) == resolved


@pytest.mark.parametrize("override,message", [
    ("--config.model.block.blocks.mo.kind=mlp", "unknown field 'mo' of model.block.blocks (did "
                                                "you mean 'moe'?); its fields: dense, moe"),
    ("--config.model.block.blocks.moe.ffn.num_expert=8", "unknown field 'num_expert' of "
                                                        "model.block.blocks.moe.ffn (kind 'moe')"),
])
def test_a_wrong_member_or_field_is_refused_with_a_did_you_mean(config_file, override, message):
  with pytest.raises(config_loading.Refused, match=re.escape(message)):
    config_loading.load(config_file, override)


def test_the_command_line_refuses_a_depth_that_is_no_multiple_in_one_line(config_file):
  done = cli(f"--config={config_file}", "--config.model.num_layers=5", "--print_config")
  assert done.returncode == 2, done.stderr
  assert done.stderr.strip().splitlines() == [
      "axtrain: error: model.num_layers (5) must be a multiple of the 2 layers of "
      "model.block.pattern ('dense', 'moe'), or set --config.model.block.remainder=first (2 "
      "whole repeats, then ('dense',))"]


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("num_layers", [6, 7])
def test_conversion_sees_one_block_per_layer_in_model_order(scan, num_layers):
  """launcher/convert.py hands Hugging Face maps a list of layers, one block's tree each: layer
  2r + j is position j of repeat r, a remainder's layers last, and stacking the list again
  gives the model's tree."""
  node = group_node(num_layers=num_layers, scan=scan, remainder="first")
  model_cfg = MODELS.parse(node, "model")
  params = random_params(node)
  layers = convert.split_layers(params, model_cfg)["layers"]
  assert len(layers) == num_layers
  assert ["router" in layer["block"]["ffn"] for layer in layers] == [
      i % 2 == 1 for i in range(num_layers)]
  key = "layers" if scan else "layers_1"
  want = params[key]["block"]["moe_1"]["ffn"]["wi"][1 if scan else slice(None)]
  np.testing.assert_array_equal(layers[3]["block"]["ffn"]["wi"], want)
  if num_layers == 7:
    np.testing.assert_array_equal(layers[6]["block"]["ffn"]["wi"],
                                  params["layers_remainder"]["block"]["dense_0"]["ffn"]["wi"])
  back = convert.stack_layers(convert.split_layers(params, model_cfg), model_cfg, scan=scan)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  zeros = convert.layer_tree(jax.eval_shape(lambda: params), model_cfg)
  assert jax.tree.structure(zeros) == jax.tree.structure(
      jax.tree.map(lambda _: 0, convert.split_layers(params, model_cfg)))
  assert block_group.per_repeat(layers, model_cfg.block)[1]["block"]["moe_1"] is layers[3]["block"]
