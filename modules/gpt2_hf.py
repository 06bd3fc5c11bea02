"""Hugging Face GPT2LMHeadModel <-> the GPT-2 family (modules/gpt2.py): Conv1D weights ([in,
out]) and the fused q/k/v projection `c_attn`, learned positions, LayerNorms with
biases."""

from __future__ import annotations

import numpy as np

from core.registry import ConfigError
from modules import gpt2
from modules.hf_maps import INIT, NOT_MATH, Family, FieldMap, Fixed, Key, Same, only, register

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                     "relu": "relu"}


def _inner(c: dict) -> int:
  return c.get("n_inner") or 4 * c["n_embd"]


def size_of(c: dict) -> gpt2.Size:
  for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
    if c.get(key):
      raise ConfigError(f"config.json: {key}=true is not supported")
  if not c.get("scale_attn_weights", True):
    raise ConfigError("config.json: scale_attn_weights=false is not supported")
  if c.get("activation_function", "gelu_new") not in _ACTIVATIONS:
    raise ConfigError(f"config.json: activation_function '{c['activation_function']}' is not "
                      f"supported ({', '.join(_ACTIVATIONS)})")
  if c["n_embd"] % c["n_head"]:
    raise ConfigError(f"config.json: n_embd {c['n_embd']} is not divisible by n_head "
                      f"{c['n_head']}")
  return gpt2.Size(c["n_embd"], c["n_layer"], c["n_head"], c["vocab_size"], c["n_positions"],
                   _inner(c), float(c.get("layer_norm_epsilon", 1e-5)))


def model_node(c: dict):
  node = gpt2.node(size_of(c))
  node.block.ffn.activation = _ACTIVATIONS[c.get("activation_function", "gelu_new")]
  node.tie_embeddings = bool(c.get("tie_word_embeddings", True))
  return node


def hf_shapes(c: dict) -> dict:
  d, f = c["n_embd"], _inner(c)
  out = {"transformer.wte.weight": (c["vocab_size"], d),
         "transformer.wpe.weight": (c["n_positions"], d),
         "transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}
  if not c.get("tie_word_embeddings", True):
    out["lm_head.weight"] = (c["vocab_size"], d)
  for i in range(c["n_layer"]):
    p = f"transformer.h.{i}."
    out.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "ln_2.weight": (d,),
                p + "ln_2.bias": (d,), p + "attn.c_attn.weight": (d, 3 * d),
                p + "attn.c_attn.bias": (3 * d,), p + "attn.c_proj.weight": (d, d),
                p + "attn.c_proj.bias": (d,), p + "mlp.c_fc.weight": (d, f),
                p + "mlp.c_fc.bias": (f,), p + "mlp.c_proj.weight": (f, d),
                p + "mlp.c_proj.bias": (d,)})
  return out


def from_hf(get, c: dict) -> dict:
  d, h = c["n_embd"], c["n_head"]
  k = d // h
  params = {"embedding": {"embedding": get("transformer.wte.weight")},
            "position_embedding": {"embedding": get("transformer.wpe.weight")},
            "final_norm": {"scale": get("transformer.ln_f.weight"),
                           "bias": get("transformer.ln_f.bias")}}
  if not c.get("tie_word_embeddings", True):
    params["head"] = get("lm_head.weight").T
  layers = []
  for i in range(c["n_layer"]):
    p = f"transformer.h.{i}."
    # Conv1D weights are [in, out]; c_attn's output is [q | k | v], each heads-major.
    qkv_w = get(p + "attn.c_attn.weight").reshape(d, 3, h, k)
    qkv_b = get(p + "attn.c_attn.bias").reshape(3, h, k)
    attn = {"q": qkv_w[:, 0], "k": qkv_w[:, 1], "v": qkv_w[:, 2],
            "q_bias": qkv_b[0], "k_bias": qkv_b[1], "v_bias": qkv_b[2],
            "o": get(p + "attn.c_proj.weight").reshape(h, k, d),
            "o_bias": get(p + "attn.c_proj.bias")}
    ffn = {"wi": get(p + "mlp.c_fc.weight"), "wi_bias": get(p + "mlp.c_fc.bias"),
           "wo": get(p + "mlp.c_proj.weight"), "wo_bias": get(p + "mlp.c_proj.bias")}
    norms = {name: {"scale": get(p + f"{theirs}.weight"), "bias": get(p + f"{theirs}.bias")}
             for name, theirs in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2"))}
    layers.append({"block": {"attention": attn, "ffn": ffn, **norms}})
  params["layers"] = layers
  return params


def to_hf(params: dict, m) -> dict:
  out = {"transformer.wte.weight": params["embedding"]["embedding"],
         "transformer.wpe.weight": params["position_embedding"]["embedding"],
         "transformer.ln_f.weight": params["final_norm"]["scale"],
         "transformer.ln_f.bias": params["final_norm"]["bias"]}
  if not m.tie_embeddings:
    out["lm_head.weight"] = params["head"].T
  for i, layer in enumerate(params["layers"]):
    b, p = layer["block"], f"transformer.h.{i}."
    a = b["attention"]
    d = a["q"].shape[0]
    out[p + "attn.c_attn.weight"] = np.stack([a["q"], a["k"], a["v"]], axis=1).reshape(d, -1)
    out[p + "attn.c_attn.bias"] = np.stack([a["q_bias"], a["k_bias"], a["v_bias"]]).reshape(-1)
    out[p + "attn.c_proj.weight"] = a["o"].reshape(-1, d)
    out[p + "attn.c_proj.bias"] = a["o_bias"]
    out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = b["ffn"]["wi"], b["ffn"]["wi_bias"]
    out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = b["ffn"]["wo"], b["ffn"]["wo_bias"]
    for name, theirs in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
      out[p + f"{theirs}.weight"] = b[name]["scale"]
      out[p + f"{theirs}.bias"] = b[name]["bias"]
  return out


SETTINGS = FieldMap(
    kinds={"": {"decoder_lm": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}},
           "embedding": {"token": {}}, "position_embedding": {"learned": {}},
           "block": {"pre_norm": {}}, "block.attention": {"attention": {}},
           "block.attention.position": {"none": {}}, "block.attention.norm": {None: {}},
           "block.ffn": {"mlp": {}}, "block.norm": {"layernorm": {}},
           "final_norm": {"layernorm": {}}},
    fields={**NOT_MATH,
            "vocab_size": Key("vocab_size"), "dim": Key("n_embd"), "num_layers": Key("n_layer"),
            "tie_embeddings": Key("tie_word_embeddings"),
            "position_embedding.max_length": Key("n_positions"),
            "position_embedding.init_std": INIT,
            "block.attention.num_heads": Key("n_head"),
            "block.attention.num_kv_heads": Fixed(
                lambda v, m: v in (None, m.block.attention.num_heads),
                "None or num_heads (no grouped-query heads)"),
            "block.attention.head_dim": Fixed(
                lambda v, m: (v or m.dim // m.block.attention.num_heads)
                * m.block.attention.num_heads == m.dim, "None or dim / num_heads"),
            "block.attention.qkv_bias": only(True), "block.attention.out_bias": only(True),
            "block.ffn.hidden_dim": Key("n_inner"),
            "block.ffn.activation": Key("activation_function", values={
                ours: theirs for theirs, ours in reversed(_ACTIVATIONS.items())}),
            "block.ffn.gated": only(False), "block.ffn.use_bias": only(True),
            "block.norm.eps": Key("layer_norm_epsilon"), "block.norm.use_bias": only(True),
            "final_norm.eps": Same("block.norm.eps"), "final_norm.use_bias": only(True)})


register(Family(
    name="gpt2", architecture="GPT2LMHeadModel", model_node=model_node, hf_shapes=hf_shapes,
    ignored=(".attn.bias", ".attn.masked_bias"), from_hf=from_hf, to_hf=to_hf,
    settings=SETTINGS,
    # 121 ids: our embedding and head hold 128 rows (model.vocab_multiple), the pad rows added
    # on import and dropped on export
    example={"vocab_size": 121, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32,
             "bos_token_id": 0, "eos_token_id": 0}))
