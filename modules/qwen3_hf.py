"""Hugging Face Qwen3ForCausalLM <-> LLaMA with QK-norm (`attention.norm`: RMSNorm over each
head's queries and keys before RoPE): the LLaMA map (modules/llama_hf.py) plus the two norm
scales of each layer; full attention, or a sliding window in every layer (`use_sliding_window`
with every `layer_types` entry `sliding_attention`: `attention.sliding_window`)."""

from __future__ import annotations

from core.registry import ConfigError, registry
from modules import llama_hf
from modules.hf_maps import Family, FieldMap, Key, Same, only, register

_QK = ("q_norm", "k_norm")


def window(c: dict) -> int | None:
  """The sliding window of every layer of HF config `c` (None: full attention), as
  Qwen3Config reads it (a window only with use_sliding_window, its layers those of
  `layer_types`, by default from max_window_layers on); ConfigError for a mix of both."""
  size = c.get("sliding_window", 4096) if c.get("use_sliding_window") else None
  layers = c["num_hidden_layers"]
  types = c.get("layer_types") or [
      "sliding_attention" if size is not None and i >= c.get("max_window_layers", 28)
      else "full_attention" for i in range(layers)]
  sliding = sum(t == "sliding_attention" for t in types) if size is not None else 0
  if 0 < sliding < layers:
    raise ConfigError(f"config.json: {sliding} of {layers} layers attend in a sliding window, "
                      f"the others fully: one kind of attention in every layer is supported")
  return size if sliding else None


def model_node(c: dict):
  node = llama_hf.model_node(c)
  node.block.attention.sliding_window = window(c)
  node.block.attention.norm = registry("norm").node("rmsnorm",
                                                    eps=float(c.get("rms_norm_eps", 1e-6)))
  return node


def hf_shapes(c: dict) -> dict:
  out = llama_hf.hf_shapes(c)
  k = llama_hf.dims(c)[3]
  for i in range(c["num_hidden_layers"]):
    out.update({f"model.layers.{i}.self_attn.{n}.weight": (k,) for n in _QK})
  return out


def from_hf(get, c: dict) -> dict:
  params = llama_hf.from_hf(get, c)
  for i, layer in enumerate(params["layers"]):
    layer["block"]["attention"].update(
        {n: {"scale": get(f"model.layers.{i}.self_attn.{n}.weight")} for n in _QK})
  return params


def _window(m):
  return m.block.attention.sliding_window


def to_hf(params: dict, m) -> dict:
  out = llama_hf.to_hf(params, m)
  for i, layer in enumerate(params["layers"]):
    a = layer["block"]["attention"]
    out.update({f"model.layers.{i}.self_attn.{n}.weight": a[n]["scale"] for n in _QK})
  return out


SETTINGS = FieldMap(
    kinds={**llama_hf.SETTINGS.kinds,
           "": {"decoder_lm": {
               "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
               "use_sliding_window": lambda m: _window(m) is not None,
               "layer_types": lambda m: [
                   "full_attention" if _window(m) is None else "sliding_attention"
               ] * m.num_layers,
               "max_window_layers": lambda m: m.num_layers if _window(m) is None else 0}},
           "block.attention.norm": {"rmsnorm": {}}},
    fields={**llama_hf.SETTINGS.fields, "block.attention.norm.eps": Same("block.norm.eps"),
            "block.attention.sliding_window": Key("sliding_window"),
            "block.ffn.use_bias": only(False)})


register(Family(
    name="qwen3", architecture="Qwen3ForCausalLM", extends="LlamaForCausalLM",
    model_node=model_node, hf_shapes=hf_shapes, ignored=(".rotary_emb.inv_freq",),
    from_hf=from_hf, to_hf=to_hf, settings=SETTINGS,
    # GQA, a head_dim other than dim / heads (24 with dim 64 and 4 heads); with a window:
    # tests/test_hf_parity.py
    example={"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 24, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
             "tie_word_embeddings": False}))
