"""Hugging Face LlamaForCausalLM <-> the LLaMA family (modules/llama.py): which HF configs it
accepts, the model node and tensor names they imply, the tensor maps both ways (each a reshape
or a transpose, one layer at a time) and the settings map (modules/hf_maps.py:FieldMap).
Qwen3 (modules/qwen3_hf.py) builds on it."""

from __future__ import annotations

from core.registry import ConfigError
from modules import llama
from modules.hf_maps import NOT_MATH, Family, FieldMap, Key, Same, only, register


def _rope(c: dict):
  rope = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
  theta = float(c.get("rope_theta", rope.get("rope_theta", 10_000.0)))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind == "default":
    return theta, None
  if kind != "llama3":
    raise ConfigError(f"config.json: rope type '{kind}' is not supported (default, llama3)")
  return theta, (float(rope["factor"]), float(rope["low_freq_factor"]),
                 float(rope["high_freq_factor"]),
                 int(rope["original_max_position_embeddings"] if "original_max_position_embeddings"
                     in rope else c["max_position_embeddings"]))


def dims(c: dict):
  d, h = c["hidden_size"], c["num_attention_heads"]
  return d, h, c.get("num_key_value_heads") or h, c.get("head_dim") or d // h


def size_of(c: dict) -> llama.Size:
  if c.get("hidden_act", "silu") != "silu":
    raise ConfigError(f"config.json: hidden_act '{c['hidden_act']}' is not supported (silu)")
  if c.get("partial_rotary_factor", 1.0) != 1.0:
    raise ConfigError("config.json: partial_rotary_factor is not supported")
  d, h, g, k = dims(c)
  theta, scaling = _rope(c)
  return llama.Size(d, c["num_hidden_layers"], h, g, c["intermediate_size"], c["vocab_size"],
                    theta, bool(c.get("tie_word_embeddings", False)),
                    float(c.get("rms_norm_eps", 1e-6)), None if k == d // h else k, scaling)


def model_node(c: dict):
  node = llama.node(size_of(c))
  node.block.attention.qkv_bias = node.block.attention.out_bias = bool(
      c.get("attention_bias", False))
  node.block.ffn.use_bias = bool(c.get("mlp_bias", False))
  return node


def attention_shapes(c: dict) -> dict:
  """{name: shape} of one layer's attention tensors (self_attn.*), biases if the config has them."""
  d, h, g, k = dims(c)
  out = {"self_attn.q_proj.weight": (h * k, d), "self_attn.k_proj.weight": (g * k, d),
         "self_attn.v_proj.weight": (g * k, d), "self_attn.o_proj.weight": (d, h * k)}
  if c.get("attention_bias"):
    out.update({"self_attn.q_proj.bias": (h * k,), "self_attn.k_proj.bias": (g * k,),
                "self_attn.v_proj.bias": (g * k,), "self_attn.o_proj.bias": (d,)})
  return out


def mlp_shapes(c: dict) -> dict:
  """{name: shape} of one layer's gated MLP tensors (mlp.*)."""
  d, f = c["hidden_size"], c["intermediate_size"]
  out = {"mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
         "mlp.down_proj.weight": (d, f)}
  if c.get("mlp_bias"):
    out.update({"mlp.gate_proj.bias": (f,), "mlp.up_proj.bias": (f,), "mlp.down_proj.bias": (d,)})
  return out


def _layer_shapes(c: dict) -> dict:
  d = c["hidden_size"]
  return {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
          **attention_shapes(c), **mlp_shapes(c)}


def hf_shapes(c: dict) -> dict:
  d, v = c["hidden_size"], c["vocab_size"]
  out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  if not c.get("tie_word_embeddings", False):
    out["lm_head.weight"] = (v, d)
  for i in range(c["num_hidden_layers"]):
    out.update({f"model.layers.{i}.{k}": s for k, s in _layer_shapes(c).items()})
  return out


def outer_from_hf(get, c: dict) -> dict:
  """The embedding, final norm and (untied) head of our tree from the HF tensors."""
  params = {"embedding": {"embedding": get("model.embed_tokens.weight")},
            "final_norm": {"scale": get("model.norm.weight")}}
  if not c.get("tie_word_embeddings", False):
    params["head"] = get("lm_head.weight").T
  return params


def attention_from_hf(get, p: str, c: dict) -> dict:
  """Our attention tree ({q, k, v, o, biases}) from the HF tensors of the layer prefixed `p`."""
  d, h, g, k = dims(c)
  attn = {"q": get(p + "self_attn.q_proj.weight").T.reshape(d, h, k),
          "k": get(p + "self_attn.k_proj.weight").T.reshape(d, g, k),
          "v": get(p + "self_attn.v_proj.weight").T.reshape(d, g, k),
          "o": get(p + "self_attn.o_proj.weight").T.reshape(h, k, d)}
  if c.get("attention_bias"):
    for name, heads in (("q", h), ("k", g), ("v", g)):
      attn[f"{name}_bias"] = get(p + f"self_attn.{name}_proj.bias").reshape(heads, k)
    attn["o_bias"] = get(p + "self_attn.o_proj.bias")
  return attn


def mlp_from_hf(get, p: str, c: dict) -> dict:
  """Our gated MLP tree ({wi, wu, wo, biases}) from the HF tensors of the layer prefixed `p`."""
  ffn = {"wi": get(p + "mlp.gate_proj.weight").T, "wu": get(p + "mlp.up_proj.weight").T,
         "wo": get(p + "mlp.down_proj.weight").T}
  if c.get("mlp_bias"):
    ffn.update(wi_bias=get(p + "mlp.gate_proj.bias"), wu_bias=get(p + "mlp.up_proj.bias"),
               wo_bias=get(p + "mlp.down_proj.bias"))
  return ffn


def from_hf(get, c: dict) -> dict:
  params = outer_from_hf(get, c)
  layers = []
  for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    layers.append({"block": {"attention": attention_from_hf(get, p, c),
                             "ffn": mlp_from_hf(get, p, c),
                             "attention_norm": {"scale": get(p + "input_layernorm.weight")},
                             "ffn_norm": {"scale": get(p + "post_attention_layernorm.weight")}}})
  params["layers"] = layers
  return params


def outer_to_hf(params: dict, m) -> dict:
  """The embedding, final norm and (untied) head as HF tensors."""
  out = {"model.embed_tokens.weight": params["embedding"]["embedding"],
         "model.norm.weight": params["final_norm"]["scale"]}
  if not m.tie_embeddings:
    out["lm_head.weight"] = params["head"].T
  return out


def attention_to_hf(a: dict, p: str) -> dict:
  """The HF tensors (prefixed `p`) of our attention tree `a`."""
  out = {}
  for name in ("q", "k", "v"):
    w = a[name]
    out[p + f"self_attn.{name}_proj.weight"] = w.reshape(w.shape[0], -1).T
    if f"{name}_bias" in a:
      out[p + f"self_attn.{name}_proj.bias"] = a[f"{name}_bias"].reshape(-1)
  out[p + "self_attn.o_proj.weight"] = a["o"].reshape(-1, a["o"].shape[-1]).T
  if "o_bias" in a:
    out[p + "self_attn.o_proj.bias"] = a["o_bias"]
  return out


def mlp_to_hf(ffn: dict, p: str) -> dict:
  """The HF tensors (prefixed `p`) of our gated MLP tree `ffn`."""
  out = {}
  for ours, theirs in (("wi", "gate_proj"), ("wu", "up_proj"), ("wo", "down_proj")):
    out[p + f"mlp.{theirs}.weight"] = ffn[ours].T
    if f"{ours}_bias" in ffn:
      out[p + f"mlp.{theirs}.bias"] = ffn[f"{ours}_bias"]
  return out


def to_hf(params: dict, m) -> dict:
  out = outer_to_hf(params, m)
  for i, layer in enumerate(params["layers"]):
    b, p = layer["block"], f"model.layers.{i}."
    out.update(attention_to_hf(b["attention"], p))
    out.update(mlp_to_hf(b["ffn"], p))
    out[p + "input_layernorm.weight"] = b["attention_norm"]["scale"]
    out[p + "post_attention_layernorm.weight"] = b["ffn_norm"]["scale"]
  return out


def _heads(m):
  return m.block.attention.heads(m.dim)


SETTINGS = FieldMap(
    kinds={"": {"decoder_lm": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}},
           "embedding": {"token": {}}, "position_embedding": {"none": {}},
           "block": {"pre_norm": {}}, "block.attention": {"attention": {}},
           "block.attention.position": {"rope": {"rope_scaling": None},
                                        "rope_llama3": {"rope_scaling.rope_type": "llama3"}},
           "block.attention.norm": {None: {}}, "block.ffn": {"mlp": {}},
           "block.norm": {"rmsnorm": {}}, "final_norm": {"rmsnorm": {}}},
    fields={**NOT_MATH,
            "vocab_size": Key("vocab_size"), "dim": Key("hidden_size"),
            "num_layers": Key("num_hidden_layers"), "tie_embeddings": Key("tie_word_embeddings"),
            "block.attention.num_heads": Key("num_attention_heads"),
            "block.attention.num_kv_heads": Key("num_key_value_heads",
                                                to=lambda _, m: _heads(m)[1]),
            "block.attention.head_dim": Key("head_dim", to=lambda _, m: _heads(m)[2]),
            "block.attention.qkv_bias": Key("attention_bias"),
            "block.attention.out_bias": Same("block.attention.qkv_bias"),
            "block.attention.position.theta": Key("rope_theta"),
            "block.attention.position.factor": Key("rope_scaling.factor"),
            "block.attention.position.low_freq_factor": Key("rope_scaling.low_freq_factor"),
            "block.attention.position.high_freq_factor": Key("rope_scaling.high_freq_factor"),
            "block.attention.position.original_max_position": Key(
                "rope_scaling.original_max_position_embeddings"),
            "block.ffn.hidden_dim": Key("intermediate_size"),
            "block.ffn.activation": Key("hidden_act", values={"silu": "silu"}),
            "block.ffn.gated": only(True), "block.ffn.use_bias": Key("mlp_bias"),
            "block.norm.eps": Key("rms_norm_eps"), "final_norm.eps": Same("block.norm.eps")})


register(Family(
    name="llama", architecture="LlamaForCausalLM", model_node=model_node, hf_shapes=hf_shapes,
    ignored=(".rotary_emb.inv_freq",), from_hf=from_hf, to_hf=to_hf, settings=SETTINGS,
    # GQA, LLaMA-3 RoPE scaling with its own theta, an untied head
    example={"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 500_000.0,
             "tie_word_embeddings": False,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}))
