"""The Gemma family (modules/gemma.py, configs/gemma.py): each published row's parameter count
against a closed form over the published dimensions (Gemma 2's against the stated totals), the
group of local and global layers that HF's layer_types make, and the config's members set on the
command line. Logits parity with transformers, the round trip and the export of every field are
tests/test_hf_parity.py's and tests/test_hf_export_fields.py's, which find the family's maps."""

from __future__ import annotations

import pytest

from core.registry import ConfigError
from launcher import config_loading
from modules import block_group, gemma, gemma_hf
from tests.conftest import ROOT
from tests.test_families import row_count
from trainer import config as config_lib

# From each model's Hugging Face config.json (hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, head_dim, intermediate_size, vocab_size), typed in again here rather than
# read from modules/gemma.py so that a wrong table row fails; tied embeddings in all.
PUBLISHED = {
    "2-2b": (2304, 26, 8, 4, 256, 9216, 256_000, False),  # google/gemma-2-2b
    "2-9b": (3584, 42, 16, 8, 256, 14_336, 256_000, False),  # google/gemma-2-9b
    "2-27b": (4608, 46, 32, 16, 128, 36_864, 256_000, False),  # google/gemma-2-27b
    "3-1b": (1152, 26, 4, 1, 256, 6912, 262_144, True),  # google/gemma-3-1b-pt
    "3-4b": (2560, 34, 8, 4, 256, 10_240, 262_208, True),  # google/gemma-3-4b-pt text_config
    "3-12b": (3840, 48, 16, 8, 256, 15_360, 262_208, True),  # google/gemma-3-12b-pt text_config
    "3-27b": (5376, 62, 32, 16, 128, 21_504, 262_208, True),  # google/gemma-3-27b-pt text_config
}
# The totals that Hugging Face shows for the Gemma 2 checkpoints and Gemma 3 1b, in billions.
STATED_B = {"2-2b": 2.61, "2-9b": 9.24, "2-27b": 27.23, "3-1b": 1.0}


def gemma_count(d, layers, heads, kv_heads, head_dim, ffn, vocab, qk_norm):
  attention = d * head_dim * (2 * heads + 2 * kv_heads) + (2 * head_dim if qk_norm else 0)
  per_layer = attention + 3 * d * ffn + 4 * d  # GeGLU; pre- and post-norms of both branches
  return vocab * d + layers * per_layer + d


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_rows_have_the_published_parameters(name):
  got = row_count("gemma", name)
  assert got == gemma_count(*PUBLISHED[name])
  if name in STATED_B:
    assert round(got / 1e9, 2) == STATED_B[name]


@pytest.mark.parametrize("types,want", [
    (["sliding_attention", "full_attention"] * 13, ("sliding", "full")),  # Gemma 2
    ((["sliding_attention"] * 5 + ["full_attention"]) * 8, ("sliding",) * 5 + ("full",)),
    (["full_attention"] * 4, ("full",)),
    (["sliding_attention", "full_attention", "sliding_attention"], ("sliding", "full")),
    # Gemma 3 1b (HF: layer i full where (i + 1) % 6 == 0): 4 whole groups, then 2 layers
    (["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)],
     ("sliding",) * 5 + ("full",)),
    (["sliding_attention"] * 2 + ["full_attention"], ("sliding", "sliding", "full")),
])
def test_layer_types_become_the_shortest_period(types, want):
  """Layer i of the model is the period's layer i % len(period): whole repeats, then the
  period's first layers (the group's remainder)."""
  assert gemma_hf.pattern(types) == want


def test_an_unknown_layer_type_is_refused():
  with pytest.raises(ConfigError, match="layer_types 'linear_attention' is not supported"):
    gemma_hf.pattern(["sliding_attention", "linear_attention"])


def test_the_rows_are_gemma_2_and_3_shaped():
  m2 = config_lib.parse(config_loading.load(
      str(ROOT / "configs" / "gemma.py") + ":size=2-test")).model
  assert m2.block.pattern == ("sliding", "full") and m2.final_logit_softcap == 30.0
  sliding, full = dict(m2.block.blocks)["sliding"], dict(m2.block.blocks)["full"]
  assert (sliding.attention.sliding_window, full.attention.sliding_window) == (16, None)
  assert sliding.attention.logit_softcap == full.attention.logit_softcap == 50.0
  s3 = gemma.SIZES["3-12b"]
  assert s3.pattern == ("sliding",) * 5 + ("full",) and s3.qk_norm
  assert (s3.sliding_theta, s3.full_theta, s3.full_linear_factor) == (1e4, 1e6, 8.0)


@pytest.mark.parametrize("name,layers,repeats", [("3-1b", 26, 4), ("3-4b", 34, 5),
                                                 ("3-12b", 48, 8), ("3-27b", 62, 10)])
def test_gemma_3_s_layers_are_whole_groups_and_the_group_s_first_layers(name, layers, repeats):
  """HF: layer i is full where (i + 1) % 6 == 0; ours: the group of six scanned over its whole
  repeats, then its first layers (all sliding), each layer with its kind's attention window."""
  from modules.decoder import MODELS
  from trainer import flops

  want = ["full" if (i + 1) % 6 == 0 else "sliding" for i in range(layers)]
  m = MODELS.parse(gemma.model_node(name), "model")
  assert m.num_layers == layers and m.block.pattern == gemma.GEMMA3 and m.repeats == repeats
  assert m.block.remainder == ("none" if layers == 48 else "first")
  assert (m.remainder and m.remainder.pattern) == (tuple(want[6 * repeats:]) or None)
  assert block_group.layer_names(m.block, m.num_layers) == want
  window = gemma.SIZES[name].sliding_window
  assert [a.sliding_window for a in flops.layer_attentions(m)] == [
      None if t == "full" else window for t in want]
  assert gemma_hf.pattern([f"{t}_attention" for t in want]) == gemma.GEMMA3


def _gemma3_lines(num_layers: int, pattern=gemma.GEMMA3) -> int:
  """Lines of the lowered forward pass of the 3-test shape at a depth."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from modules.decoder import MODELS

  node = gemma.model_node("3-test")
  node.num_layers, node.block.pattern = num_layers, pattern
  node.block.remainder = gemma.remainder(num_layers, pattern)
  model = MODELS.build(MODELS.parse(node, "model"))
  tokens = jnp.zeros((1, 8), jnp.int32)
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens)["params"])
  forward = jax.jit(lambda p: model.apply({"params": p}, tokens))
  return len(forward.lower(params).as_text().splitlines())


def test_gemma_3_compiles_one_group_and_its_remainder_at_any_depth():
  """2 or 8 repeats of the group of six, then two sliding layers: one program size, smaller than
  one group of all 14 layers (how 1b, 4b and 27b were laid out before remainders)."""
  two, eight = _gemma3_lines(6 * 2 + 2), _gemma3_lines(6 * 8 + 2)
  assert two == eight
  whole = tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(14))
  assert two < _gemma3_lines(14, whole)


def test_one_member_is_set_on_the_command_line():
  cfg = config_loading.load(str(ROOT / "configs" / "gemma.py") + ":size=3-test",
                            "--config.model.block.blocks.sliding.attention.sliding_window=8",
                            "--config.model.block.blocks.full.attention.position.theta=5e5")
  blocks = dict(config_lib.parse(cfg).model.block.blocks)
  assert blocks["sliding"].attention.sliding_window == 8
  assert blocks["full"].attention.sliding_window is None
  assert blocks["full"].attention.position.theta == 5e5
  assert blocks["sliding"].attention.position.theta == 1e4


def test_the_flops_count_each_kind_of_layer_s_keys():
  """2-test at 128 positions: 2 sliding layers (window 16) and 2 full ones, each 4 heads x 32;
  the window takes 12 x 2 layers x 128 x (128 - 16) FLOPs per token off the all-full count."""
  import jax
  import jax.numpy as jnp

  from modules.decoder import MODELS
  from trainer import flops

  cfg = config_loading.load(str(ROOT / "configs" / "gemma.py") + ":size=2-test")
  windowless = config_loading.load(
      str(ROOT / "configs" / "gemma.py") + ":size=2-test",
      "--config.model.block.blocks.sliding.attention.sliding_window=None")
  runs = [config_lib.parse(c) for c in (cfg, windowless)]
  model = MODELS.build(runs[0].model)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  got = [flops.model_flops_per_token(run, params) for run in runs]
  assert runs[0].data.seq_len == 128
  assert got[1] - got[0] == 12 * 2 * 4 * 32 * (128 - 16)
