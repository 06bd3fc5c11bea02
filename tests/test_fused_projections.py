"""Fused projections (`attention.fused_qkv`, `mlp.fused_gate_up`): one matmul for q/k/v and one
for a gated MLP's gate and up. The same math as separate projections (checked on the same
weights, fused by concatenation), laid out so that the `model` axis splits kv heads and hidden
units (never q from k from v, nor gate from up), read as separate by everything that reads a
model's shape (FLOPs, the planner's memory model, weight decay), refused where it cannot apply;
and a run written before the options existed (separate projections) resumes as it was.

The Hugging Face maps in both layouts: tests/test_hf_parity.py; tensor-parallel training on
fake devices: tests/test_sharding.py; int8: tests/test_quantization.py.
"""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launcher import main as main_lib
from modules import MODELS, attention, llama, mlp
from modules.hf_maps import fused_like, separate
from planner import memory_model
from tests import ckpt_util
from trainer import checkpoint_layout, flops, meshes, param_axes
from core.registry import ConfigError

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

TOKENS = jax.random.randint(jax.random.key(1), (2, 16), 0, 128)
# attention fields of the `test` LLaMA (dim 64, 4 heads of 16; here 1 layer): MHA, GQA, MQA, biases
CASES = {"mha": {"num_kv_heads": None}, "gqa": {"num_kv_heads": 2}, "mqa": {"num_kv_heads": 1},
         "biases": {"num_kv_heads": 2, "qkv_bias": True, "out_bias": True}}


def _model(fused: bool, *, scan: bool = True, **attention_fields):
  node = llama.model_node("test").to_dict()
  node["scan_layers"], node["num_layers"] = scan, 1
  node["block"]["attention"].update(fused_qkv=fused, **attention_fields)
  node["block"]["ffn"].update(fused_gate_up=fused,
                              use_bias=bool(attention_fields.get("qkv_bias")))
  return MODELS.build(MODELS.parse(node, "model"))


def _boxed(model):
  return jax.eval_shape(lambda: model.init(jax.random.key(0), TOKENS))["params"]


def _loss(model):
  return lambda p: jnp.mean(model.apply({"params": p}, TOKENS) ** 2)


@pytest.mark.parametrize("case", list(CASES))
def test_fused_computes_what_separate_computes(case):
  """The separate model's weights (random biases too), fused: the same logits, and gradients
  that split back into the separate model's (the fused matmuls compute the same dot products)."""
  separate_model, fused_model = _model(False, **CASES[case]), _model(True, **CASES[case])
  params = nn.meta.unbox(separate_model.init(jax.random.key(0), TOKENS))["params"]
  params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(2), x.shape), params)
  fused = fused_like(jax.device_get(params), nn.meta.unbox(_boxed(fused_model)))
  assert jax.tree.structure(fused) == jax.tree.structure(nn.meta.unbox(_boxed(fused_model)))
  assert attention.QKV in fused["layers"]["block"]["attention"]
  assert mlp.WI_WU in fused["layers"]["block"]["ffn"]
  np.testing.assert_allclose(fused_model.apply({"params": fused}, TOKENS),
                             separate_model.apply({"params": params}, TOKENS), rtol=1e-5, atol=1e-5)
  want = jax.grad(_loss(separate_model))(params)
  got = separate(jax.device_get(jax.grad(_loss(fused_model))(fused)))
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_fusing_and_splitting_are_exact_and_group_queries_by_kv_head():
  """numpy (what the Hugging Face maps hand over), a layer axis in front: split(fuse(p)) is p
  bit for bit; query head i sits in kv head i // (heads / kv_heads)'s group."""
  rng = np.random.default_rng(0)
  p = {"q": rng.normal(size=(3, 8, 6, 4)), "k": rng.normal(size=(3, 8, 2, 4)),
       "v": rng.normal(size=(3, 8, 2, 4)), "q_bias": rng.normal(size=(3, 6, 4)),
       "k_bias": rng.normal(size=(3, 2, 4)), "v_bias": rng.normal(size=(3, 2, 4)),
       "o": rng.normal(size=(3, 6, 4, 8))}
  fused = attention.fuse_qkv(p)
  assert sorted(fused) == ["o", "qkv", "qkv_bias"] and fused["qkv"].shape == (3, 8, 2, 5, 4)
  np.testing.assert_array_equal(fused["qkv"][:, :, 1, 2], p["q"][:, :, 5])  # head 5: group 1
  np.testing.assert_array_equal(fused["qkv"][:, :, 1, 3], p["k"][:, :, 1])
  back = attention.split_qkv(fused)
  assert sorted(back) == sorted(p)
  for name, value in p.items():
    np.testing.assert_array_equal(back[name], value, err_msg=name)
  f = {"wi": rng.normal(size=(8, 5)), "wu": rng.normal(size=(8, 5)), "wo": rng.normal(size=(5, 8)),
       "wi_bias": rng.normal(size=(5,)), "wu_bias": rng.normal(size=(5,))}
  fused = mlp.fuse_gate_up(f)
  assert sorted(fused) == ["wi_wu", "wi_wu_bias", "wo"] and fused["wi_wu"].shape == (8, 2, 5)
  back = mlp.split_gate_up(fused)
  for name, value in f.items():
    np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_model_axis_splits_kv_heads_and_hidden_units_never_the_qkv_boundary():
  """The fused kernels' logical axes under the default rules: `kv_heads` and `mlp` over
  `model`, the q/k/v and gate/up axes whole; weight decay on the kernels, not their biases."""
  boxed = _boxed(_model(True, **CASES["biases"]))["layers"]["block"]
  rules = meshes.DEFAULT_RULES
  spec = lambda leaf: tuple(nn.logical_to_mesh_axes(leaf.names, rules))
  embed = ("fsdp", "expert", "context")
  a, f = boxed["attention"], boxed["ffn"]
  assert a["qkv"].names == ("layers", "embed", "kv_heads", "qkv", "head_dim")
  assert spec(a["qkv"]) == ("stage", embed, "model", None, None)
  assert spec(a["qkv_bias"]) == ("stage", "model", None, None)
  assert f["wi_wu"].names == ("layers", "embed", "gate_up", "mlp")
  assert spec(f["wi_wu"]) == ("stage", embed, None, "model")
  assert spec(f["wi_wu_bias"]) == ("stage", None, "model")
  axes = param_axes.logical_axes(boxed)
  mask = param_axes.decay_mask(axes, decay_embeddings=False)
  assert mask["attention"]["qkv"] and mask["ffn"]["wi_wu"]
  assert not mask["attention"]["qkv_bias"] and not mask["ffn"]["wi_wu_bias"]
  assert axes["attention"]["qkv"].muon_axes() == ((1,), (2, 3, 4))  # embed -> q, k and v


@pytest.mark.parametrize("case", ["gqa", "mqa"])
def test_flops_and_the_memory_model_read_a_fused_model_as_the_separate_one(case):
  separate_params, fused_params = (_boxed(_model(f, **CASES[case])) for f in (False, True))
  assert flops.count(fused_params, seq_len=16) == flops.count(separate_params, seq_len=16)
  assert (memory_model.model_shape(fused_params, top_k=None)
          == memory_model.model_shape(separate_params, top_k=None))


def test_fused_gate_up_without_a_gate_is_refused_in_one_line(tmp_path, capsys):
  code = main_lib.main(["axtrain", "--config=configs/tiny.py",
                        "--config.model.block.ffn.gated=false",
                        "--config.model.block.ffn.fused_gate_up=true",
                        f"--output_dir={tmp_path / 'run'}"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert err.startswith("axtrain: error: ") and "mlp.fused_gate_up fuses the gate and up" in err
  assert not (tmp_path / "run").exists()


def test_a_checkpoint_in_the_other_layout_is_refused_naming_the_option():
  """init.from_run (and --rewrite_config) compare the checkpoint's parameter names with the
  model's first: the message names the setting that reads it."""
  separate_names = {"params.layers.block.attention.q": (), "params.layers.block.ffn.wi": ()}
  fused_names = {"params.layers.block.attention.qkv": (), "params.layers.block.ffn.wi_wu": ()}
  with pytest.raises(ConfigError, match=r"init.from_run=x: there holds separate projections "
                     r"\(attention.q\), and this model's are the other way; set "
                     r"--config.model.block.attention.fused_qkv=false to read it"):
    checkpoint_layout.check(separate_names, fused_names, field="init.from_run=x", where="there")
  with pytest.raises(ConfigError, match=r"fused projections \(ffn.wi_wu\).*"
                                        r"--config.model.block.ffn.fused_gate_up=true"):
    checkpoint_layout.check({"params.layers.block.attention.q": (),
                             "params.layers.block.ffn.wi_wu": ()}, separate_names,
                            field="f", where="w")
  checkpoint_layout.check(fused_names, fused_names, field="f", where="w")  # same layout


def test_a_run_written_before_the_options_resumes_with_separate_projections(tmp_path, capfd):
  """A run whose config.json has no fused_qkv / fused_gate_up (as axtrain wrote it before they
  existed) extends from its checkpoint: the options' defaults are its layout. The same run
  asked to fuse is another model: refused in one line, its files untouched."""
  run = tmp_path / "run"
  base = [f"--config={ckpt_util.CONFIG}", f"--output_dir={run}", "--noprogress",
          "--config.optimizer.schedule.warmup_steps=0"]
  assert main_lib.main(["axtrain", *base, "--config.trainer.max_steps=2"]) == 0
  cfg = json.loads((run / "config.json").read_text())
  del cfg["model"]["block"]["attention"]["fused_qkv"], cfg["model"]["block"]["ffn"]["fused_gate_up"]
  (run / "config.json").write_text(json.dumps(cfg))
  saved = ckpt_util.params(run, 2)
  assert "['layers']['block']['attention']['q']" in saved
  capfd.readouterr()
  code = main_lib.main(["axtrain", *base, "--config.trainer.max_steps=3",
                        "--config.model.block.attention.fused_qkv=true"])
  err = capfd.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert "model.block.attention.fused_qkv unset -> true" in err, err
  assert main_lib.main(["axtrain", *base, "--config.trainer.max_steps=3"]) == 0
  assert json.loads((run / "run.json").read_text())["resumed_from_step"] == 2
  records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
