"""benchmarks/plain_jax.py computes what axtrain computes: the yardstick of `make bench` and of
`python -m benchmarks.chip compare`."""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import numpy as np
import pytest

from benchmarks import compare, plain_jax
from configs.base import lm_config
from core.registry import registry as r
from trainer import config as config_lib, experiment, meshes


def _model(scan: bool, *, kv_heads: int = 4, vocab: int = 128, tied: bool = False,
           position=None, implementation: str = "xla", norm: str = "rmsnorm",
           fused: bool = False):
  attention = r("attention").node(
      "attention", num_heads=4, num_kv_heads=kv_heads, implementation=implementation,
      splash_block_size=128, position=position or r("position").node("rope"), fused_qkv=fused)
  block = r("block").node(
      "pre_norm", norm=r("norm").node(norm), attention=attention,
      ffn=r("ffn").node("mlp", hidden_dim=96, activation="silu", gated=True,
                        fused_gate_up=fused))
  return r("model").node(
      "decoder_lm", vocab_size=vocab, dim=32, num_layers=2, scan_layers=scan, tie_embeddings=tied,
      embedding=r("embedding").node("token"),
      position_embedding=r("position_embedding").node("none"), block=block,
      final_norm=r("norm").node(norm))


def _experiment(model, *, steps: int = 3, seq_len: int = 16, mean_doc_len: int = 0,
                **trainer):
  cfg = lm_config(model, max_steps=steps, learning_rate=3e-3, batch_size=4, seq_len=seq_len,
                  warmup_steps=1, data_kind="synthetic")
  cfg.data.mean_doc_len = mean_doc_len
  cfg.optimizer.weight_decay = 1.0  # large, so that decaying the wrong parameters shows
  for key, value in trainer.items():
    setattr(cfg.trainer, key, value)
  return experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))


def _layers(params) -> list[dict]:
  """plain_jax's layers as a list, unstacked if scanned."""
  layers = params["layers"]
  if isinstance(layers, list):
    return layers
  return [jax.tree.map(lambda x, i=i: x[i], layers)
          for i in range(jax.tree.leaves(layers)[0].shape[0])]


def _train_both(exp, options: plain_jax.Options, steps: int):
  """`steps` steps of axtrain's step and plain JAX's from the same start on the same batches:
  ([(axtrain's metrics, plain's metrics)], axtrain's state, plain's params, plain's start)."""
  state = exp.init()
  start = plain_jax.from_axtrain(jax.device_get(state.params), options)
  params = jax.device_put(start)
  opt = plain_jax.init_opt(params)
  step = plain_jax.jitted_step(compare.plain_shape(exp), compare.plain_hyper(exp), options)
  data = exp.source.train_iterator(process_index=0, process_count=1)
  out = []
  with exp.context():
    for _ in range(steps):
      batch = next(data)
      state, ours = exp.step_fn(state, exp.global_batch(batch))
      params, opt, plain = step(params, opt, batch)
      out.append((ours, plain))
  return out, state, params, start


@pytest.mark.slow  # the benchmark's own check, three compiles (make test-slow)
def test_same_losses_over_three_steps():
  exp = _experiment(_model(scan=True))
  metrics, state, params, start = _train_both(exp, compare.plain_options(exp), 3)
  for i, (ours, plain) in enumerate(metrics):
    # Step 1 from the same parameters agrees to float32 rounding. After it, Adam turns
    # rounding-level differences of near-zero gradients into updates of +-lr, so the two
    # runs drift apart slowly: losses (which see every update) still agree closely.
    np.testing.assert_allclose(ours["loss"], plain["loss"], rtol=2e-5 if i == 0 else 1e-4)
    np.testing.assert_allclose(ours["grad_norm"], plain["grad_norm"],
                               rtol=2e-5 if i == 0 else 2e-3)
    np.testing.assert_allclose(ours["learning_rate"], plain["learning_rate"], rtol=1e-6)
  # Weight decay on the norm scales ([layers, dim] when scanned) would move them by lr * wd
  # per step (measured 4.6e-3 here under the old `ndim >= 2` rule; 1e-7 when both sides agree).
  final = plain_jax.from_axtrain(jax.device_get(state.params))
  for mine, theirs in zip(final["layers"], params["layers"]):
    for name in ("attn_norm", "mlp_norm"):
      np.testing.assert_allclose(mine[name], theirs[name], atol=1e-4, err_msg=name)
  np.testing.assert_allclose(final["final_norm"], params["final_norm"], atol=1e-4)
  # The steps did move the parameters, so losses after step 1 test the optimizer too.
  assert np.abs(np.asarray(params["head"]) - np.asarray(start["head"])).max() > 1e-3


LLAMA3_ROPE = dict(theta=10_000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position=16)  # head_dim 8: one frequency in each band


@pytest.mark.slow  # the benchmark's own checks (make test-slow)
@pytest.mark.parametrize("case", ["gqa_tied_packed_accumulated", "splash_packed"])
def test_options_keep_the_math(case):
  """Every option of plain_jax against the axtrain run it stands for, at float32: GQA, a tied
  head, a padded vocabulary (120 -> 128), LLaMA-3 RoPE, packed documents, 2 microbatches, loss
  chunks, full remat, and the speed choices (scan, fused matrices, RoPE by permutation) on
  unrolled axtrain; the splash kernel (Pallas interpret mode) on both sides."""
  if case == "splash_packed":
    exp = _experiment(_model(scan=True, implementation="splash"), steps=2, seq_len=128,
                      mean_doc_len=40)
    options = compare.plain_options(exp)
    assert options.attention == "splash"
  else:
    model = _model(scan=False, kv_heads=2, vocab=120, tied=True,
                   position=r("position").node("rope_llama3", **LLAMA3_ROPE))
    model.remat = "full"
    exp = _experiment(model, mean_doc_len=5, grad_accum_steps=2, loss_chunk_size=8)
    options = compare.variant(exp, "scan+fused+permute")
    assert (options.grad_accum, options.loss_chunk, options.remat) == (2, 8, "full")
  batch = next(exp.source.train_iterator(process_index=0, process_count=1))
  assert len(np.unique(batch["segment_ids"][0])) > 1  # documents packed in a row
  metrics, state, params, _ = _train_both(exp, options, exp.run.trainer.max_steps)
  for i, (ours, plain) in enumerate(metrics):
    np.testing.assert_allclose(ours["loss"], plain["loss"], rtol=2e-5 if i == 0 else 1e-4)
    np.testing.assert_allclose(ours["grad_norm"], plain["grad_norm"],
                               rtol=2e-5 if i == 0 else 2e-3)
  final = plain_jax.from_axtrain(jax.device_get(state.params), options)
  np.testing.assert_allclose(final["embed"], params["embed"], atol=1e-5)
  for mine, theirs in zip(_layers(final), _layers(params)):
    for name in mine:
      np.testing.assert_allclose(mine[name], theirs[name], atol=1e-5, err_msg=name)


@pytest.mark.slow  # three compiles of the benchmark step (make test-slow)
def test_bfloat16_compute_on_float32_weights():
  """compute_dtype bfloat16 on both sides: every matmul of the plain forward pass takes bfloat16
  operands, its parameters and optimizer state stay float32, and the losses agree with
  axtrain's (measured 4e-6 and 2e-5 apart at steps 1 and 2)."""
  exp = _experiment(_model(scan=False), steps=2, compute_dtype="bfloat16")
  options = compare.plain_options(exp)
  assert options.compute_dtype == "bfloat16"
  metrics, _, params, _ = _train_both(exp, options, 2)
  for ours, plain in metrics:
    np.testing.assert_allclose(ours["loss"], plain["loss"], rtol=1e-4)
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype(np.float32)}
  batch = next(exp.source.train_iterator(process_index=0, process_count=1))
  loss = functools.partial(plain_jax.loss_sums, s=compare.plain_shape(exp), o=options)
  text = jax.jit(loss).lower(params, batch).as_text()
  operands = re.findall(r"dot_general.*: \((tensor<[^>]*>), (tensor<[^>]*>)\)", text)
  assert len(operands) == 2 * 9 + 1  # per layer q, k, v, logits, values, o, gate, up, down; head
  assert all("bf16" in a and "bf16" in b for a, b in operands), operands


def test_splash_blocks_are_axtrains():
  """The plain step's splash kernel tiles as modules/attn_splash.py's (what its constants
  measured fastest on the chip)."""
  from modules import attn_splash  # pylint: disable=import-outside-toplevel
  for length, block in ((2048, 1024), (128, 1024), (512, 128), (4096, 512)):
    assert plain_jax.splash_blocks(length, block) == attn_splash.block_sizes(length, block)


def test_plain_reads_axtrains_fused_projections():
  """An axtrain model with fused_qkv and fused_gate_up (what `benchmarks.chip compare` times
  with the options on) starts plain JAX from the same matrices as the separate model."""
  from modules.hf_maps import fused_like  # pylint: disable=import-outside-toplevel
  params = jax.device_get(_experiment(_model(scan=True, kv_heads=2)).init().params)
  like = jax.eval_shape(_experiment(_model(scan=True, kv_heads=2, fused=True)).init).params
  fused = fused_like(params, like)
  assert "qkv" in fused["layers"]["block"]["attention"]
  for options in (plain_jax.Options(), plain_jax.Options(fused=True, scan=True)):
    want, got = plain_jax.from_axtrain(params, options), plain_jax.from_axtrain(fused, options)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)


def test_plain_refuses_what_it_does_not_write():
  exp = _experiment(_model(scan=True, norm="layernorm"))
  with pytest.raises(ValueError, match="LLaMA models only; this one has norm=layernorm, "
                                       "final_norm=layernorm"):
    compare.plain_shape(exp)
  exp = _experiment(_model(scan=True))
  with pytest.raises(ValueError, match="plain variant 'fast' is not one of"):
    compare.variant(exp, "scan+fast")
  assert dataclasses.asdict(compare.variant(exp, "unrolled+halves")) == dataclasses.asdict(
      compare.plain_options(exp))


@pytest.mark.slow  # rounds of timed steps on every side
def test_measure_times_every_side_each_round_and_rates_the_fastest_plain_variant():
  """benchmarks.compare.measure's rounds (what `benchmarks.chip compare` runs on the chip):
  every side timed once a round from the same start, the same losses at step K, and the ratio
  taken against the fastest plain variant."""
  exp = compare.chip_experiment("configs/llama.py:size=test", ("--config.data.batch_size=4",
                                                                "--config.data.seq_len=32"),
                                steps=2)
  assert (exp.run.trainer.max_steps, exp.run.trainer.log_every) == (2, 2)
  assert (exp.run.eval.num_batches, exp.source.batch_size) == (1, 4)
  variants = {v: compare.variant(exp, v) for v in ("unrolled", "scan+fused")}
  sides = compare.measure(exp, variants, rounds=2)
  assert list(sides) == [compare.AXTRAIN, "unrolled", "scan+fused"]
  for side in sides.values():
    assert len(side.step_s) == 2 and side.first_s > 0
    np.testing.assert_allclose(side.loss, sides[compare.AXTRAIN].loss, rtol=1e-4)
  row = compare.row(sides, exp, variants)
  fastest = min(variants, key=lambda n: sides[n].median_s)
  assert row["fastest_plain"] == fastest
  assert row["ratio"] == sides[fastest].median_s / sides[compare.AXTRAIN].median_s
  assert row["sides"]["scan+fused"]["options"]["fused"] is True


def test_chip_compare_heads_its_records_with_the_commit_given(tmp_path):
  """`python -m benchmarks.chip compare` starts each record with the same head as `run` (it
  named an undefined `args` there: a NameError before any setting ran); an unknown setting is
  then refused by name."""
  from benchmarks import chip  # pylint: disable=import-outside-toplevel
  assert chip._head("abc1234")["commit"] == "abc1234"  # pylint: disable=protected-access
  with pytest.raises(SystemExit, match="unknown setting 'nosuch'"):
    chip.main(["compare", f"--out={tmp_path}", "--commit=abc1234", "nosuch"])


def test_plain_jax_runs_the_fastest_kernel_jax_ships_beside_a_kernel_of_ours():
  """On a TPU, plain JAX beside axtrain's own kernel (pallas_hd64) or tokamax's runs splash:
  with the einsums the ratio counted the kernel's gain over a strawman (1.59x on the chip,
  2026-12-07); `xla` keeps its einsums, and off a TPU no Pallas TPU kernel runs."""
  assert compare.plain_attention("pallas_hd64", "tpu") == "splash"
  assert compare.plain_attention("splash", "tpu") == "splash"
  assert compare.plain_attention("xla", "tpu") == "einsum"
  assert compare.plain_attention("pallas_hd64", "cpu") == "einsum"
