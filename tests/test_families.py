"""Every size row of every family builds abstract shapes with the parameter count of its Hugging
Face export; LLaMA's and GPT-2's rows (and Mixtral's config) with the published counts.

The families are found in modules/ (a module with a size table `SIZES` and `model_node`), so
a new family's rows are checked here with no line to add; its published counts are its own
test's. Counts are taken without vocabulary padding (model.vocab_multiple=1); the padded rows
are checked on their own (test_vocab_padding_adds_only_the_pad_rows)."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import modules  # registers the layer library
from modules import gpt2, hf_maps, llama
from modules.decoder import MODELS

# Dimensions as published in each model's Hugging Face config.json (hidden_size,
# num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size,
# vocab_size, tie_word_embeddings), typed in again here rather than read from
# modules/llama.py so that a wrong table row fails.
LLAMA_PUBLISHED = {
    "1b": (2048, 16, 32, 8, 8192, 128_256, True),  # meta-llama/Llama-3.2-1B
    "3b": (3072, 28, 24, 8, 8192, 128_256, True),  # meta-llama/Llama-3.2-3B
    "7b": (4096, 32, 32, 32, 11_008, 32_000, False),  # meta-llama/Llama-2-7b-hf
    "8b": (4096, 32, 32, 8, 14_336, 128_256, False),  # meta-llama/Meta-Llama-3-8B
    "70b": (8192, 80, 64, 8, 28_672, 128_256, False),  # meta-llama/Meta-Llama-3-70B
    "test": (64, 2, 4, 2, 128, 256, False),
    "tiny": (192, 4, 6, 6, 512, 256, False),
    "125m": (768, 12, 12, 12, 2048, 32_000, False),
}
# Rounded counts stated by the publishers (model cards / papers), in billions.
LLAMA_STATED_B = {"1b": 1.24, "3b": 3.21, "7b": 6.74, "8b": 8.03, "70b": 70.55}
# openai-community/gpt2*: (n_embd, n_layer), n_head irrelevant to the count; and the
# exact counts that `transformers` reports for GPT2LMHeadModel (tied head).
GPT2_PUBLISHED = {"small": (768, 12), "medium": (1024, 24), "large": (1280, 36), "xl": (1600, 48)}
GPT2_EXACT = {"small": 124_439_808, "medium": 354_823_168, "large": 774_030_080,
              "xl": 1_557_611_200}


def llama_count(d, layers, heads, kv_heads, ffn, vocab, tied):
  head_dim = d // heads
  attention = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2  # q, o + k, v
  per_layer = attention + 3 * d * ffn + 2 * d  # SwiGLU + two RMSNorm scales
  return vocab * d * (1 if tied else 2) + layers * per_layer + d


def gpt2_count(d, layers, vocab=50_257, positions=1024):
  per_layer = (3 * d * d + 3 * d) + (d * d + d) + (8 * d * d + 5 * d) + 4 * d
  return vocab * d + positions * d + layers * per_layer + 2 * d


def count(node, *, vocab_multiple: int | None = 1) -> int:
  """Parameters of a model node; vocab_multiple=None keeps the node's padding."""
  if vocab_multiple is not None:
    node = node.copy_and_resolve_references()
    node.vocab_multiple = vocab_multiple
  model = MODELS.build(MODELS.parse(node, "model"))
  shapes = jax.eval_shape(lambda k: model.init(k, jnp.zeros((1, 8), jnp.int32)), jax.random.key(0))
  return sum(x.size for x in jax.tree.leaves(nn.meta.unbox(shapes["params"])))


FAMILIES = modules.families()  # {name: module} of the model families of modules/
ROWS = [(family, size) for family, module in FAMILIES.items() for size in module.SIZES]


@functools.cache
def row_count(family: str, size: str) -> int:
  """Parameters of a size row, without vocabulary padding (each row is built once here)."""
  return count(FAMILIES[family].model_node(size))


def test_the_families_are_found():
  assert {"llama", "gpt2"} <= set(FAMILIES)


@pytest.mark.parametrize("family,size", ROWS, ids=[f"{f}:{s}" for f, s in ROWS])
def test_every_row_has_the_parameters_of_its_hugging_face_tensors(family, size):
  """The flax modules' parameters and the tensors that the row's Hugging Face config implies
  (the map's shapes, written from the HF model's code) are counted apart and agree, for every
  row that a family's map can write."""
  m = MODELS.parse(FAMILIES[family].model_node(size), "model")
  hf = hf_maps.family_of_model(m)
  if not hf.problems(m):
    shapes = hf.hf_shapes(hf.hf_config(m))
    assert row_count(family, size) == sum(math.prod(s) for s in shapes.values())
  else:
    assert row_count(family, size) > 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_unknown_size_suggests_the_nearest(family):
  first = next(iter(FAMILIES[family].SIZES))
  with pytest.raises(modules.ConfigError, match=f"did you mean '{first}'"):
    FAMILIES[family].model_node(first + "z")


@pytest.mark.parametrize("name", list(llama.SIZES))
def test_llama_rows(name):
  assert set(llama.SIZES) == set(LLAMA_PUBLISHED)
  got = row_count("llama", name)
  assert got == llama_count(*LLAMA_PUBLISHED[name])
  if name in LLAMA_STATED_B:
    assert round(got / 1e9, 2) == LLAMA_STATED_B[name]
  if name == "1b":
    assert got == 1_235_814_400  # transformers' num_parameters() for Llama-3.2-1B


@pytest.mark.parametrize("name", list(gpt2.SIZES))
def test_gpt2_rows(name):
  got = row_count("gpt2", name)
  assert got == gpt2_count(*GPT2_PUBLISHED[name]) == GPT2_EXACT[name]


def test_mixtral_8x7b_has_the_published_counts():
  from configs import mixtral_8x7b
  # mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size, num_hidden_layers, num_attention_heads,
  # num_key_value_heads, intermediate_size, vocab_size (untied), num_local_experts,
  # num_experts_per_tok.
  d, layers, heads, kv_heads, ffn, vocab, experts, top_k = 4096, 32, 32, 8, 14_336, 32_000, 8, 2
  expert = 3 * d * ffn  # SwiGLU
  dense_layer = llama_count(d, 1, heads, kv_heads, 0, 0, True) - d  # attention, two norms
  total = 2 * vocab * d + layers * (dense_layer + d * experts + experts * expert) + d
  # The Hub's model.safetensors.index.json: total_size 93,405,585,408 bytes of bfloat16.
  assert count(mixtral_8x7b.get_config().model) == total == 93_405_585_408 // 2
  # Mistral AI, "Mixtral of experts": 46.7B parameters, 12.9B used per token.
  assert round(total / 1e9, 1) == 46.7
  assert round((total - layers * (experts - top_k) * expert) / 1e9, 1) == 12.9


def test_vocab_padding_adds_only_the_pad_rows():
  # GPT-2: 50,257 ids -> 50,304 rows (393 x 128), one tied table of width 768.
  assert count(gpt2.model_node("small"), vocab_multiple=None) == GPT2_EXACT["small"] + 47 * 768
  # LLaMA-2-7B: 32,000 is already a multiple of 128; of 1,024 it becomes 32,768, embedding
  # and untied head each.
  assert count(llama.model_node("7b"), vocab_multiple=None) == llama_count(
      *LLAMA_PUBLISHED["7b"])
  assert count(llama.model_node("7b"), vocab_multiple=1024) == llama_count(
      *LLAMA_PUBLISHED["7b"]) + 2 * 768 * 4096


def test_config_files_build_and_count():
  from configs import gpt2 as gpt2_config
  from configs import llm_7b, llm_70b
  assert count(llm_7b.get_config().model) == llama_count(*LLAMA_PUBLISHED["7b"])
  assert count(llm_70b.get_config().model) == llama_count(*LLAMA_PUBLISHED["70b"])
  assert count(gpt2_config.get_config("size=xl").model) == GPT2_EXACT["xl"]
  assert count(gpt2_config.get_config(None).model) == GPT2_EXACT["small"]
  with pytest.raises(modules.ConfigError, match="size=larg: unknown .did you mean 'large'"):
    gpt2_config.get_config("size=larg")
  with pytest.raises(modules.ConfigError, match="unknown key 'sise'"):
    gpt2_config.get_config("sise=small")


def test_mistral_7b_has_the_published_count():
  # mistralai/Mistral-7B-v0.1 config.json: hidden_size, num_hidden_layers, num_attention_heads,
  # num_key_value_heads, intermediate_size, vocab_size (untied); its model card: 7.24B, and
  # transformers' num_parameters(): 7,241,732,096.
  from modules import mistral
  got = row_count("mistral", "7b")
  assert got == llama_count(4096, 32, 32, 8, 14_336, 32_000, False) == 7_241_732_096
  assert mistral.SIZES["7b"].sliding_window == 4096
