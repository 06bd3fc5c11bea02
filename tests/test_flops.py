"""trainer.flops against closed-form counts written from the published shapes."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import pytest

import configs.gpt2
import configs.llm_1b
import configs.moe_tiny
import configs.tiny
from modules.decoder import MODELS
from trainer import config as config_lib, flops
from trainer.step import init_params


def _abstract(cfg):
  run = config_lib.parse(cfg)
  model = MODELS.build(run.model)
  params = jax.eval_shape(functools.partial(init_params, model=model, seq_len=8),
                          jax.random.key(0))
  return run, params


def _llama(d, layers, heads, kv_heads, f, vocab, seq):
  hd = d // heads
  per_layer = d * heads * hd + 2 * d * kv_heads * hd + heads * hd * d + 3 * d * f
  return 6 * (layers * per_layer + vocab * d) + 12 * layers * heads * hd * seq


def test_llama_1b_tied_head_counts_once():
  run, params = _abstract(configs.llm_1b.get_config())
  # Llama-3.2-1B: dim 2048, 16 layers, 32 heads, 8 kv heads, mlp 8192, vocab 128256, tied.
  assert flops.model_flops_per_token(run, params) == _llama(2048, 16, 32, 8, 8192, 128_256, 2048)


def test_tiny_untied_head():
  cfg = configs.tiny.get_config()
  run, params = _abstract(cfg)
  assert flops.model_flops_per_token(run, params) == _llama(192, 4, 6, 6, 512, 256, 128)


def test_gpt2_small_excludes_position_table_and_biases():
  run, params = _abstract(configs.gpt2.get_config("size=small"))
  d, layers, f, vocab, seq = 768, 12, 3072, 50_257, 1024
  expected = 6 * (layers * (4 * d * d + 2 * d * f) + vocab * d) + 12 * layers * d * seq
  assert flops.model_flops_per_token(run, params) == expected


def test_moe_experts_scale_by_top_k():
  run, params = _abstract(configs.moe_tiny.get_config())
  d, layers, heads, e, k, f, vocab, seq = 192, 4, 6, 8, 2, 256, 256, 256
  hd = d // heads
  per_layer = 4 * d * heads * hd + d * e + k * 3 * d * f  # attention, router, top-k experts
  expected = 6 * (layers * per_layer + vocab * d) + 12 * layers * d * seq
  assert flops.model_flops_per_token(run, params) == pytest.approx(expected)


def test_unboxed_params_are_refused():
  run, params = _abstract(configs.tiny.get_config())
  with pytest.raises(ValueError, match="logical axis names"):
    flops.model_flops_per_token(run, nn.meta.unbox(params))


@pytest.mark.parametrize("window", [32, 128, 1000])
def test_a_sliding_window_counts_min_window_seq_keys_per_query(window):
  """PaLM's convention over the keys each query may see: min(window, seq_len) of them."""
  cfg = configs.tiny.get_config()
  cfg.model.block.attention.sliding_window = window
  run, params = _abstract(cfg)
  assert flops.model_flops_per_token(run, params) == _llama(192, 4, 6, 6, 512, 256, 128) - (
      12 * 4 * 6 * 32 * (128 - min(window, 128)))


def _attention_call_flops(window):
  from planner import plan  # pylint: disable=import-outside-toplevel
  from trainer import experiment, meshes  # pylint: disable=import-outside-toplevel
  cfg = configs.tiny.get_config()
  cfg.model.block.attention.sliding_window = window
  return plan.attention_call_flops(experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"),
                                                    jax.devices()[:1]))


def test_the_plan_counts_the_pairs_a_window_leaves():
  """An attention kernel call's FLOPs in the plan's estimate (planner/plan.py): QK^T and PV,
  2 x 2 FLOPs per (query, key) pair the mask admits and head_dim, for tiny's 8 rows of 128
  positions and 6 heads of 32; the pairs counted here query by query."""
  for window in (None, 32):
    pairs = sum(min(i + 1, window or 128) for i in range(128))  # causal: 8256; window 32: 3600
    assert _attention_call_flops(window) == 4 * 8 * 6 * 32 * pairs
