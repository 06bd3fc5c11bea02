"""Hugging Face MistralForCausalLM <-> LLaMA's layers with a sliding window in every layer
(modules/mistral.py): the LLaMA map (modules/llama_hf.py), RoPE plain or LLaMA-3 scaled
(transformers' Mistral reads `rope_scaling` as LLaMA does: logits equal to 2e-7, checked by
hand), no biases, and `sliding_window` (HF's absent key means 4096, its class default). A
Mistral whose window is null (Mistral-7B v0.2, v0.3) is LLaMA's math and converts back as
LlamaForCausalLM."""

from __future__ import annotations

from core.registry import ConfigError
from modules import llama_hf
from modules.hf_maps import Family, Fixed, FieldMap, only, register

HF_DEFAULT_WINDOW = 4096  # transformers' MistralConfig.sliding_window


def model_node(c: dict):
  for key in ("attention_bias", "mlp_bias"):
    if c.get(key):
      raise ConfigError(f"config.json: {key} is not a MistralForCausalLM setting")
  node = llama_hf.model_node(c)
  node.block.attention.sliding_window = c.get("sliding_window", HF_DEFAULT_WINDOW)
  return node


def _window(m):
  return m.block.attention.sliding_window


SETTINGS = FieldMap(
    kinds={**llama_hf.SETTINGS.kinds,
           "": {"decoder_lm": {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                               "sliding_window": _window}}},
    fields={**llama_hf.SETTINGS.fields,
            # written by the model's kind above; without a window the model is LLaMA's
            "block.attention.sliding_window": Fixed(
                lambda v, _: v is not None, "a window (without one: LlamaForCausalLM)"),
            "block.attention.qkv_bias": only(False), "block.attention.out_bias": only(False),
            "block.ffn.use_bias": only(False)})


register(Family(
    name="mistral", architecture="MistralForCausalLM", extends="LlamaForCausalLM",
    model_node=model_node, hf_shapes=llama_hf.hf_shapes, ignored=(".rotary_emb.inv_freq",),
    from_hf=llama_hf.from_hf, to_hf=llama_hf.to_hf, settings=SETTINGS,
    # GQA, a window of 4 (shorter than the tests' 12 tokens, so it matters)
    example={"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10_000.0,
             "tie_word_embeddings": False, "sliding_window": 4}))
