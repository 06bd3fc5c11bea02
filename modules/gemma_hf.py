"""Hugging Face Gemma2ForCausalLM and Gemma3ForCausalLM <-> the Gemma family (modules/gemma.py):
which HF configs they accept, the model node and tensor names those imply, the tensor maps both
ways (LLaMA's projections, modules/llama_hf.py, with Gemma's four norms a layer and Gemma 3's
QK-norm) and the settings maps (modules/hf_maps.py:FieldMap).

HF's `layer_types` (sliding_attention / full_attention per layer) become the block group's
pattern (modules/block_group.py): its shortest period, of `sliding` and `full` blocks, repeated
whole and then, where the depth is no multiple of it, its first layers (the group's remainder:
Gemma 3 1b's 26 layers are 4 groups of six and two sliding layers); export writes the pattern
over the layers the same way.
"""

from __future__ import annotations

from core.registry import ConfigError, members
from modules import block_group, gemma, llama_hf
from modules.hf_maps import NOT_MATH, Family, FieldMap, Fixed, Key, Same, only, register

_NAMES = {"sliding_attention": "sliding", "full_attention": "full"}
_TYPES = {v: k for k, v in _NAMES.items()}
_NORMS = (("input_layernorm", "attention_norm"), ("post_attention_layernorm",
                                                  "attention_post_norm"),
          ("pre_feedforward_layernorm", "ffn_norm"), ("post_feedforward_layernorm",
                                                      "ffn_post_norm"))
_QK = ("q_norm", "k_norm")


def _layer_types(c: dict, every: int) -> list[str]:
  """HF's layer_types, or its default: every `every`-th layer full, the others sliding."""
  return list(c.get("layer_types") or ["full_attention" if (i + 1) % every == 0
                                       else "sliding_attention"
                                       for i in range(c["num_hidden_layers"])])


def pattern(types: list[str]) -> tuple[str, ...]:
  """Our names of the shortest period of `types`: layer i is its layer i % len(period) (its
  whole repeats, then its first layers, where len(types) is no multiple of it)."""
  unknown = sorted(set(types) - set(_NAMES))
  if unknown:
    raise ConfigError(f"config.json: layer_types {unknown[0]!r} is not supported "
                      f"({', '.join(_NAMES)})")
  names = [_NAMES[t] for t in types]
  n = len(names)
  period = next(p for p in range(1, n + 1)
                if all(names[i] == names[i % p] for i in range(n)))
  return tuple(names[:period])


def _rope(c: dict, layer_type: str, legacy_theta: str, default: float, *, scaled: bool):
  """(theta, linear factor) of a layer type from HF's `rope_parameters` (per type, or one for all)
  or the legacy keys (rope_theta / rope_local_base_freq, and rope_scaling where `scaled`)."""
  params = c.get("rope_parameters") or {}
  if layer_type in params:
    params = params[layer_type] or {}
  elif not params:
    scaling = c.get("rope_scaling") if scaled else None
    params = {**(scaling or {}), "rope_theta": c.get(legacy_theta, default)}
  kind = params.get("rope_type", params.get("type", "default"))
  if kind not in ("default", "linear"):
    raise ConfigError(f"config.json: rope type '{kind}' is not supported (default, linear)")
  return float(params.get("rope_theta", c.get(legacy_theta, default))), float(
      params.get("factor", 1.0) if kind == "linear" else 1.0)


def size_of(c: dict, *, gemma3: bool) -> gemma.Size:
  if c.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
    raise ConfigError(f"config.json: hidden_activation '{c['hidden_activation']}' is not "
                      f"supported (gelu_pytorch_tanh)")
  if c.get("use_bidirectional_attention"):
    raise ConfigError("config.json: use_bidirectional_attention is not supported (causal only)")
  d, h, g, k = llama_hf.dims(c)
  types = _layer_types(c, 6 if gemma3 else 2)
  # Gemma 3's rope_scaling is its global layers' (HF: rope_parameters["full_attention"]);
  # Gemma 2's one RoPE is every layer's
  sliding_theta, sliding_factor = _rope(c, "sliding_attention", "rope_local_base_freq"
                                        if gemma3 else "rope_theta", 10_000.0, scaled=not gemma3)
  full_theta, full_factor = _rope(c, "full_attention", "rope_theta",
                                  1_000_000.0 if gemma3 else 10_000.0, scaled=True)
  if sliding_factor != 1.0:
    raise ConfigError("config.json: a scaled RoPE on the sliding-window layers is not supported")
  if "sliding_attention" in types and not c.get("sliding_window"):
    raise ConfigError("config.json: sliding_attention layers but no sliding_window")
  softcap = lambda key: None if c.get(key) is None else float(c[key])
  return gemma.Size(
      d, c["num_hidden_layers"], h, g, k, c["intermediate_size"], c["vocab_size"],
      c.get("sliding_window") or 0, pattern=pattern(types),
      query_pre_attn_scalar=float(c.get("query_pre_attn_scalar", k)),
      attn_softcap=softcap("attn_logit_softcapping"),
      final_softcap=softcap("final_logit_softcapping"), qk_norm=gemma3,
      sliding_theta=sliding_theta, full_theta=full_theta, full_linear_factor=full_factor,
      norm_eps=float(c.get("rms_norm_eps", 1e-6)))


def model_node(c: dict, *, gemma3: bool):
  node = gemma.node(size_of(c, gemma3=gemma3))
  node.tie_embeddings = bool(c.get("tie_word_embeddings", True))
  for block in node.block.blocks.values():
    block.attention.qkv_bias = block.attention.out_bias = bool(c.get("attention_bias", False))
  return node


def hf_shapes(c: dict, *, gemma3: bool) -> dict:
  d, k = c["hidden_size"], llama_hf.dims(c)[3]
  out = {"model.embed_tokens.weight": (c["vocab_size"], d), "model.norm.weight": (d,)}
  if not c.get("tie_word_embeddings", True):
    out["lm_head.weight"] = (c["vocab_size"], d)
  layer = {**{f"{theirs}.weight": (d,) for theirs, _ in _NORMS},
           **llama_hf.attention_shapes(c), **llama_hf.mlp_shapes({**c, "mlp_bias": False}),
           **({f"self_attn.{n}.weight": (k,) for n in _QK} if gemma3 else {})}
  for i in range(c["num_hidden_layers"]):
    out.update({f"model.layers.{i}.{name}": shape for name, shape in layer.items()})
  return out


def from_hf(get, c: dict, *, gemma3: bool) -> dict:
  params = llama_hf.outer_from_hf(get, {"tie_word_embeddings": True, **c})
  layers = []
  for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    attention = llama_hf.attention_from_hf(get, p, c)
    if gemma3:
      attention.update({n: {"scale": get(p + f"self_attn.{n}.weight")} for n in _QK})
    block = {"attention": attention, "ffn": llama_hf.mlp_from_hf(get, p, {}),
             **{ours: {"scale": get(p + f"{theirs}.weight")} for theirs, ours in _NORMS}}
    layers.append({"block": block})
  params["layers"] = layers
  return params


def to_hf(params: dict, m) -> dict:
  out = llama_hf.outer_to_hf(params, m)
  for i, layer in enumerate(params["layers"]):
    b, p = layer["block"], f"model.layers.{i}."
    out.update(llama_hf.attention_to_hf(b["attention"], p))
    out.update({p + f"self_attn.{n}.weight": b["attention"][n]["scale"]
                for n in _QK if n in b["attention"]})
    out.update(llama_hf.mlp_to_hf(b["ffn"], p))
    out.update({p + f"{theirs}.weight": b[ours]["scale"] for theirs, ours in _NORMS})
  return out


def _heads(m):
  """(heads, kv heads, head_dim) of the sliding block (whose rules write them; the full
  block's must equal them)."""
  return members(m.block.blocks)["sliding"].attention.heads(m.dim)


def _layer_types_of(m) -> list[str]:
  """HF's layer_types of the model: its pattern, repeated, then any remainder."""
  return [_TYPES[name] for name in block_group.layer_names(m.block, m.num_layers)]


def _whole(value, _):
  """An integral float as an int (HF's config class types query_pre_attn_scalar int)."""
  return int(value) if float(value).is_integer() else value


def _rope_scaling(factor, _):
  return None if factor == 1.0 else {"rope_type": "linear", "factor": factor}


_SLIDING, _FULL = "block.blocks.sliding", "block.blocks.full"


def _member_rules(gemma3: bool) -> dict:
  """The rules of both members' fields: HF keys for the sliding block's, the full block's the
  same keys (Same) where HF has one setting for both; each its own window and RoPE."""
  shared = {
      "attention.num_heads": Key("num_attention_heads"),
      "attention.num_kv_heads": Key("num_key_value_heads", to=lambda _, m: _heads(m)[1]),
      "attention.head_dim": Key("head_dim", to=lambda _, m: _heads(m)[2]),
      "attention.qkv_bias": Key("attention_bias"),
      "attention.query_pre_attn_scalar": Key("query_pre_attn_scalar", to=_whole),
      "attention.logit_softcap": Key("attn_logit_softcapping"),
      "ffn.hidden_dim": Key("intermediate_size"),
      "ffn.activation": Key("hidden_activation", values={"gelu_tanh": "gelu_pytorch_tanh"}),
      "ffn.gated": only(True), "ffn.use_bias": only(False), "post_norms": only(True),
      "norm.eps": Key("rms_norm_eps"), "norm.scale_offset": only(1.0),
      **({"attention.norm.scale_offset": only(1.0)} if gemma3 else {})}
  out = {}
  for field, rule in shared.items():
    out[f"{_SLIDING}.{field}"] = rule
    out[f"{_FULL}.{field}"] = rule if isinstance(rule, Fixed) else Same(f"{_SLIDING}.{field}")
  for member in (_SLIDING, _FULL):
    out[f"{member}.attention.out_bias"] = Same(f"{_SLIDING}.attention.qkv_bias")
    if gemma3:
      out[f"{member}.attention.norm.eps"] = Same(f"{_SLIDING}.norm.eps")
    for field, rule in NOT_MATH.items():
      if field.startswith("block."):
        out[f"{member}.{field[len('block.'):]}"] = rule
  out[f"{_SLIDING}.attention.sliding_window"] = Key("sliding_window")
  out[f"{_FULL}.attention.sliding_window"] = only(None)
  out[f"{_SLIDING}.attention.position.linear_factor"] = only(1.0)  # HF scales the full only
  out[f"{_FULL}.attention.position.linear_factor"] = (
      Key("rope_scaling", to=_rope_scaling) if gemma3 else only(1.0))  # Gemma 3's, not 2's
  return out


def _settings(name: str, architecture: str, *, gemma3: bool) -> FieldMap:
  member_kinds = {"": {"pre_norm": {}}, ".attention": {"attention": {}},
                  ".attention.position": {"rope": {}},
                  ".attention.norm": {"rmsnorm": {}} if gemma3 else {None: {}},
                  ".ffn": {"mlp": {}}, ".norm": {"rmsnorm": {}}}
  theta = ({f"{_SLIDING}.attention.position.theta": Key("rope_local_base_freq"),
            f"{_FULL}.attention.position.theta": Key("rope_theta")} if gemma3 else
           {f"{_SLIDING}.attention.position.theta": Key("rope_theta"),
            f"{_FULL}.attention.position.theta": Same(f"{_SLIDING}.attention.position.theta")})
  return FieldMap(
      kinds={"": {"decoder_lm": {"architectures": [architecture], "model_type": name,
                                 "layer_types": _layer_types_of}},
             "embedding": {"token": {}}, "position_embedding": {"none": {}},
             "block": {"group": {}}, "final_norm": {"rmsnorm": {}},
             **{f"{member}{slot}": kinds for member in (_SLIDING, _FULL)
                for slot, kinds in member_kinds.items()}},
      fields={**{k: v for k, v in NOT_MATH.items() if not k.startswith("block.")},
              "vocab_size": Key("vocab_size"), "dim": Key("hidden_size"),
              "num_layers": Key("num_hidden_layers"), "tie_embeddings": Key("tie_word_embeddings"),
              "final_logit_softcap": Key("final_logit_softcapping"),
              "embedding.scale_by_sqrt_dim": only(True),
              "block.pattern": Fixed(lambda v, _: set(v) <= set(_TYPES),  # layer_types above
                                     "a pattern of 'sliding' and 'full'"),
              "block.remainder": Fixed(lambda v, m: v == gemma.remainder(
                                           m.num_layers, m.block.pattern), "'first' where "
                                       "num_layers is no multiple of the pattern, else 'none'"),
              "final_norm.eps": Same(f"{_SLIDING}.norm.eps"), "final_norm.scale_offset": only(1.0),
              **_member_rules(gemma3), **theta})


def _family(name: str, architecture: str, *, gemma3: bool, example: dict) -> Family:
  def node(c):
    return model_node(c, gemma3=gemma3)

  return register(Family(
      name=name, architecture=architecture, extends=None, model_node=node,
      hf_shapes=lambda c: hf_shapes(c, gemma3=gemma3), ignored=(".rotary_emb.inv_freq",),
      from_hf=lambda get, c: from_hf(get, c, gemma3=gemma3), to_hf=to_hf,
      settings=_settings(name, architecture, gemma3=gemma3), example=example))


# Small random models that transformers builds (tests/test_hf_parity.py): GQA, a head_dim other
# than dim / heads, a scalar other than head_dim, a window shorter than the tests' 12 tokens,
# caps low enough to bite; Gemma 3 with a group of 3 (two sliding, one full) repeated twice and
# its first two layers after them (the group's remainder, as in Gemma 3 1b's 26 layers), each
# kind with its own RoPE theta, the full layers' positions linearly scaled.
_COMMON = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
           "query_pre_attn_scalar": 20, "sliding_window": 4, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 64, "tie_word_embeddings": True}
GEMMA2 = _family("gemma2", "Gemma2ForCausalLM", gemma3=False, example={
    **_COMMON, "num_hidden_layers": 4, "rope_theta": 500.0, "attn_logit_softcapping": 0.5,
    "final_logit_softcapping": 5.0})
GEMMA3 = _family("gemma3_text", "Gemma3ForCausalLM", gemma3=True, example={
    **_COMMON, "num_hidden_layers": 8,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2
    + ["sliding_attention"] * 2,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 500.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
