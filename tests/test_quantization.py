"""Quantized training (model.quantization, modules/quantization.py): which dots it quantizes,
forward and backward; float32 master weights; the tiny recipe's int8 loss curve against bf16's;
the plan's int8 matmuls; fp8 refused where the chip has no fp8 units; HF export."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from core.registry import ConfigError
from launcher import config_loading, main as main_lib
from modules import MODELS, llama
from modules.quantization import check_hardware
from planner import hlo_ops, plan, plan_report
from tests import ckpt_util
from tests.conftest import ROOT
from tests.test_train_tiny import build
from trainer import config as config_lib, loop, meshes

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

# Per decoder layer: attention q, k, v, o and the gated MLP's wi, wu, wo.
PROJECTIONS = 7


def _model(kind: str, *, fused: bool = False, **fields):
  node = llama.model_node("test").to_dict()
  node["quantization"] = {"kind": kind, **fields}
  node["block"]["attention"]["fused_qkv"] = node["block"]["ffn"]["fused_gate_up"] = fused
  return node, MODELS.build(MODELS.parse(node, "model"))


def _grad_step_ops(kind: str, *, fused: bool = False, **fields):
  """(the model node, its parameters, the compiled CPU HLO ops of loss and gradients)."""
  node, model = _model(kind, fused=fused, **fields)
  tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, node["vocab_size"])
  params = model.init(jax.random.key(0), tokens)
  step = jax.jit(jax.value_and_grad(lambda p: model.apply(p, tokens).astype(jnp.float32).mean()))
  text = step.lower(params).compile().as_text()
  ops = hlo_ops.ops_report(text, num_devices=1, peak_flops=1.0, hbm_bandwidth=1.0,
                           link_bandwidth=1.0).ops
  return node, params, ops, step(params)


@pytest.fixture(scope="module")
def compiled():
  return {k: _grad_step_ops(k) for k in ("none", "int8")}


def _int8_dots(ops) -> int:
  return sum(o.count for o in ops if o.category == "matmul" and o.narrow == "int8")


def test_int8_runs_every_projection_in_int8_forward_and_backward(compiled):
  """Each projection: its forward dot and both gradient dots (input and weight) in int8; the
  attention scores and values, the embedding and the LM head stay in the compute dtype."""
  node, _, ops, _ = compiled["int8"]
  assert _int8_dots(ops) == node["num_layers"] * PROJECTIONS * 3
  assert _int8_dots(compiled["none"][2]) == 0
  quantized = {o.module for o in ops if o.narrow}
  assert quantized and all("/block/" in m for m in quantized), quantized


def test_int8_quantizes_the_fused_projections():
  """attention.fused_qkv and mlp.fused_gate_up: q/k/v one dot and gate/up one, so 4 projections
  a layer (qkv, o, wi_wu, wo), each forward and both gradient dots in int8."""
  node, _, ops, _ = _grad_step_ops("int8", fused=True)
  assert _int8_dots(ops) == node["num_layers"] * (PROJECTIONS - 3) * 3


def test_backward_false_quantizes_the_forward_dots_only():
  node, _, ops, _ = _grad_step_ops("int8", backward=False)
  assert _int8_dots(ops) == node["num_layers"] * PROJECTIONS


def test_master_weights_stay_float32_and_the_numbers_change(compiled):
  """The same parameters as the unquantized model: float32, the same draws (equal up to float32
  rounding: Qwix's interception traces the initialisers differently); loss and gradients near
  the unquantized model's but not equal (a silently disabled quantization fails here)."""
  _, params_none, _, (loss_none, grads_none) = compiled["none"]
  _, params_int8, _, (loss_int8, grads_int8) = compiled["int8"]
  assert jax.tree.structure(params_none) == jax.tree.structure(params_int8)
  for a, b in zip(jax.tree.leaves(params_none), jax.tree.leaves(params_int8)):
    assert a.dtype == b.dtype == jnp.float32
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert loss_none != loss_int8
  a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
          for g in (grads_none, grads_int8))
  relative = np.linalg.norm(a - b) / np.linalg.norm(a)
  assert 0 < relative < 0.1, relative  # int8 with per-channel scales: a few percent


def test_fp8_is_refused_where_the_chip_has_no_fp8_units(capsys):
  fp8 = MODELS.parse(_model("fp8")[0], "model").quantization
  for name in ("tpu-v5e-1", "gpu-a100-8"):
    with pytest.raises(ConfigError, match=f"the chips of mesh {name} have no fp8 matmul units"):
      check_hardware(fp8, meshes.lookup(name).hardware, mesh=name)
  for name in ("gpu-h100-8", "cpu"):
    check_hardware(fp8, meshes.lookup(name).hardware, mesh=name)
  code = main_lib.main(["axtrain", "plan", "--config=configs/tiny.py", "--mesh=tpu-v5e-1",
                        "--config.model.quantization.kind=fp8"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1 and err.startswith("axtrain: error: "), err


def test_fp8_on_cpu_trains_with_a_note_that_it_is_emulated(capfd, tmp_path):
  code = main_lib.main(["axtrain", f"--config={ckpt_util.CONFIG}", "--config.trainer.max_steps=1",
                        "--config.model.quantization.kind=fp8", f"--output_dir={tmp_path / 'r'}",
                        "--noprogress"])
  err = capfd.readouterr().err
  assert code == 0, err[-3000:]
  notes = [l for l in err.splitlines() if "quantization" in l]
  assert notes == ["axtrain: note: model.quantization.kind=fp8 on cpu: the CPU has no fp8 matmul "
                   "units, so XLA emulates the fp8 dots (fp8's rounding, at float speed or "
                   "slower: for tests); they run in fp8 on H100 and later"], err[-3000:]


def test_one_override_chooses_it_and_print_config_shows_it(capsys):
  code = main_lib.main(["axtrain", "--config=configs/tiny.py", "--print_config",
                        "--config.model.quantization.kind=int8"])
  out = capsys.readouterr().out
  assert code == 0
  assert "model.quantization.kind: int8" in out and "model.quantization.backward: True" in out


def _losses(kind: str) -> list[float]:
  exp = build("--config.trainer.max_steps=40", "--config.data.seq_len=32",
              "--config.eval.every_steps=0", "--config.eval.num_batches=1",
              "--config.trainer.log_every=1", "--config.trainer.compute_dtype=bfloat16",
              f"--config.model.quantization.kind={kind}")
  return [r["loss"] for r in loop.train(exp).records if "loss" in r]


@pytest.mark.slow  # 19 s of the quick suite; int8's quality is tests/test_int8_quality.py's (slow)
def test_tiny_int8_loss_curve_follows_bf16():
  """configs/tiny.py (seq_len 32), 40 steps in bf16 and in int8 (bf16 compute both): each
  10-step window's mean training loss within 0.05 nats of bf16's. Measured (this test's runs,
  2 CPU cores): window differences 0.0001, 0.0003, 0.0008, 0.019 nats (losses 4.75 -> 2.98);
  single steps differ by up to 0.16 once the runs' batches meet their noise. Over 100 steps at
  seq_len 64 the windows stayed within 0.041 and int8's final eval loss was 2.628 against
  bf16's 2.658. About 40 s on 2 shared cores (two compiles and runs of the unrolled 4-layer step)."""
  bf16, int8 = _losses("none"), _losses("int8")
  assert len(bf16) == len(int8) == 40
  assert bf16 != int8  # quantization changed the numbers
  for start in range(0, 40, 10):
    a, b = np.mean(bf16[start:start + 10]), np.mean(int8[start:start + 10])
    assert abs(a - b) < 0.05, (start, a, b)
  assert np.mean(int8[-10:]) < np.mean(int8[:10]) - 1.0  # and it trained


@pytest.mark.slow  # 13 s on 2 cores (libtpu); the CPU count is test_int8_runs_every_projection...
def test_the_tpu_plan_counts_int8_dots_at_the_int8_rate():
  """tiny on tpu-v5e-1 compiled by the TPU compiler (libtpu, compile-only): the int8 dots are
  those of the CPU test above, timed at the v5e's int8 peak (twice bf16's)."""
  run = config_lib.parse(config_loading.load("configs/tiny.py",
                                             "--config.model.quantization.kind=int8"))
  entry = meshes.lookup("tpu-v5e-1")
  quantized = plan.plan(run, entry, config_name="configs/tiny.py", with_eval=False)
  counted = plan_report.quantized_flops(quantized)
  assert set(counted) == {"int8"} and counted["int8"][0] == 4 * PROJECTIONS * 3
  hw = entry.hardware
  assert hw.peak_flops("int8") == 2 * hw.peak_bf16_flops
  ops = [o for o in quantized.train.ops.ops if o.narrow == "int8" and o.flops]
  assert all(o.seconds >= o.flops / hw.peak_flops("int8") for o in ops)
  assert "int8 matmuls [compiled HLO]: 84 ops" in plan_report.text(quantized)
  # The v5e row's int8 share is its own, measured (planner/calibration.py), not bf16's assumed.
  cal = quantized.estimate.calibration
  assert cal.matmul_quantized_measured and cal.matmul_quantized != cal.matmul
  assert (f"at {cal.matmul_quantized:.0%} of the int8 peak 394.00T/s (measured on one TPU v5e"
          in plan_report.text(quantized))


def test_hf_export_of_an_int8_trained_model_round_trips(tmp_path, capfd, monkeypatch):
  """Two int8 steps of tiny, exported to Hugging Face: the checkpoint's float32 tensors
  unchanged; imported and exported again: the same files."""
  monkeypatch.chdir(ROOT)
  run = tmp_path / "run"
  code = main_lib.main(["axtrain", "--config=configs/tiny.py", "--config.trainer.max_steps=2",
                        "--config.data.seq_len=32", "--config.eval.num_batches=1",
                        "--config.model.quantization.kind=int8", f"--output_dir={run}"])
  assert code == 0, capfd.readouterr().err
  assert json.loads((run / "config.json").read_text())["model"]["quantization"]["kind"] == "int8"
  for args in ([f"--to_hf={run}", f"--output_dir={tmp_path / 'hf'}"],
               [f"--from_hf={tmp_path / 'hf'}", f"--output_dir={tmp_path / 'back'}"],
               [f"--to_hf={tmp_path / 'back'}", f"--output_dir={tmp_path / 'hf2'}"]):
    assert main_lib.main(["axtrain", "convert", *args]) == 0, capfd.readouterr().err
  first = load_file(str(tmp_path / "hf" / "model.safetensors"))
  saved = ckpt_util.params(run, 2)
  vocab = first["model.embed_tokens.weight"].shape[0]
  np.testing.assert_array_equal(first["model.embed_tokens.weight"],
                                saved["['embedding']['embedding']"][:vocab])
  assert first["model.embed_tokens.weight"].dtype == np.float32
  second = load_file(str(tmp_path / "hf2" / "model.safetensors"))
  assert sorted(first) == sorted(second)
  for name, value in first.items():
    np.testing.assert_array_equal(second[name], value, err_msg=name)
