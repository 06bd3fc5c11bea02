"""Hugging Face <-> axtrain tensor maps for LLaMA (LlamaForCausalLM), Qwen3 (Qwen3ForCausalLM:
LLaMA with QK-norm) and GPT-2 (GPT2LMHeadModel).

Pure numpy, no torch: each family says which HF config it accepts (`size_from_hf`),
the config node it becomes, the HF tensor names and shapes its config implies,
and how each tensor maps to our parameters (one layer at a time; the caller
stacks layers for a scanned model). Every map is a reshape or a transpose, so
a round trip reproduces each tensor bit for bit.

Completeness is checked generically, whatever the family (`export`, `import_params`): every
parameter of the model must be read by the map to Hugging Face, and every tensor that the
HF config implies must be read by the map from it; otherwise the conversion refuses and
names what is unmapped. So a layer that adds a parameter cannot be dropped silently by a
conversion written before it existed.

Settings are checked the same way (`FieldMap`, `write_config`): each family's map says, for
every field of the model config tree, which HF config key it becomes (`Key`), that HF cannot
hold it except at some values (`Fixed`), that it shares another field's key (`Same`), or that
it is not part of the model's math (`LAYOUT`, `INIT`); and, for every component slot, which
kinds HF has. Export walks the model's config: a field or kind the map does not mention, or
one HF cannot hold, refuses the export by its path (`model.block.attention.norm.eps`), so a
setting added later (a soft-cap with no parameters) cannot export silently as plain LLaMA.
tests/test_hf_export_fields.py enumerates every field from the registries against each map.

Our vocabulary is padded (model.vocab_multiple): `pad_vocab` adds zero rows on import,
`drop_vocab_padding` removes them on export.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from modules import gpt2, llama
from core.registry import ConfigError, child_registry, registry

Tensors = Mapping[str, np.ndarray]


# -- settings: what each model config field becomes in a Hugging Face config.json ----------

@dataclasses.dataclass(frozen=True)
class Key:
  """Written as HF config key `key` ('a.b': key b of the dict at a): the field's value, or
  `to(value, model)` (the parsed model config), or `values[value]` where HF names our values
  its own way; a value that `values` does not hold cannot be written."""
  key: str
  to: Callable[[Any, Any], Any] | None = None
  values: Mapping[Any, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Fixed:
  """Not a setting of the HF class: only values that `allowed(value, model)` accepts (what
  the class computes anyway), described by `what`, can be written."""
  allowed: Callable[[Any, Any], bool]
  what: str


def only(value: Any) -> Fixed:
  """Fixed at `value`."""
  return Fixed(lambda v, _: v == value, repr(value))


@dataclasses.dataclass(frozen=True)
class Same:
  """Written through the key of field `other` (HF has one setting for both): must equal it."""
  other: str


@dataclasses.dataclass(frozen=True)
class NotWritten:
  """Not part of the model's math, so nothing to write: `why`."""
  why: str


# How the model is computed or stored (scan, remat, kernels, compute dtypes, vocabulary padding).
LAYOUT = NotWritten("layout")
# How fresh parameters are drawn; converted parameters are the checkpoint's.
INIT = NotWritten("initialisation")

Rule = Key | Fixed | Same | NotWritten


@dataclasses.dataclass(frozen=True)
class FieldMap:
  """A family's settings. `kinds`: for each component slot ('' the model, 'block.ffn', ...),
  the kinds HF has there (None: the optional slot off), each with the HF keys it implies
  (a value, or a function of the parsed model). `fields`: a rule for every field of those
  kinds, by path ('block.attention.num_heads'); a rule NotWritten on a slot covers its whole
  subtree."""
  kinds: Mapping[str, Mapping[str | None, Mapping[str, Any]]]
  fields: Mapping[str, Rule]


@dataclasses.dataclass(frozen=True)
class Family:
  name: str
  architecture: str  # HF `architectures[0]`
  model_node: Callable[[dict], Any]  # HF config -> our model ConfigDict
  hf_shapes: Callable[[dict], dict]  # HF config -> {tensor name: shape}
  ignored: tuple[str, ...]  # suffixes of HF buffers that are not parameters
  from_hf: Callable[[Callable[[str], np.ndarray], dict], dict]  # (get tensor, HF config) -> params
  to_hf: Callable[[dict, Any], dict]  # (params, parsed model config) -> {name: tensor}
  settings: FieldMap  # model config fields -> HF config.json keys

  def problems(self, m) -> list[str]:
    """What in parsed model config `m` this family's HF class cannot hold, one phrase each."""
    return _Writer(self, m).run().problems

  def hf_config(self, m) -> dict:
    """The HF config.json fields of parsed model config `m`; ConfigError naming every field
    (by its path) that this family's HF class cannot hold."""
    writer = _Writer(self, m).run()
    if writer.problems:
      raise ConfigError(f"the model cannot be written as {self.architecture}: "
                        f"{'; '.join(writer.problems)}")
    return writer.out


def _shown(value: Any) -> str:
  return "off (None)" if value is None else repr(value)


def _alternatives(values) -> str:
  shown = [_shown(v) for v in values]
  return " or ".join(shown) if len(shown) < 3 else ", ".join(shown[:-1]) + " or " + shown[-1]


def _at(m, path: str) -> Any:
  """The value at dotted `path` of parsed model config `m` (None where a slot is off)."""
  node = m
  for part in path.split("."):
    node = getattr(node, part, None)
  return node


class _Writer:
  """One walk of a parsed model config against a family's FieldMap: `out` (the HF keys)
  and `problems` (what cannot be written, by path)."""

  def __init__(self, family: Family, m):
    self.family, self.m, self.map = family, m, family.settings
    self.out: dict = {}
    self.problems: list[str] = []

  def run(self) -> "_Writer":
    self._slot(self.m, "")
    return self

  def _put(self, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    target = self.out
    for part in parents:
      target = target.setdefault(part, {})
    target[last] = value(self.m) if callable(value) else copy.deepcopy(value)

  def _slot(self, node, slot: str) -> None:
    where, arch = f"model.{slot}" if slot else "model", self.family.architecture
    kinds = self.map.kinds.get(slot)
    kind = None if node is None else node.kind
    if kinds is None:
      self.problems.append(f"{where} has no entry in the {arch} map (modules/hf_maps.py)")
      return
    if kind not in kinds:
      what = where if node is None else f"{where}.kind"
      self.problems.append(f"{what} is {_shown(kind)} ({arch} takes only "
                           f"{_alternatives(kinds)})")
      self._children(node, slot, known_only=True)  # each refused field, not only the first
      return
    for key, value in kinds[kind].items():
      self._put(key, value)
    self._children(node, slot, known_only=False)

  def _children(self, node, slot: str, *, known_only: bool) -> None:
    """The fields and child slots of `node`; `known_only` (a node of a kind the map lacks):
    only those whose path the map holds, whose own problems are still worth naming."""
    for f in dataclasses.fields(node) if node is not None else ():
      path = f"{slot}.{f.name}" if slot else f.name
      if f.name == "kind" or isinstance(self.map.fields.get(path), NotWritten):
        continue
      if child_registry(f) is not None:
        if not known_only or path in self.map.kinds:
          self._slot(getattr(node, f.name), path)
      elif not known_only or path in self.map.fields:
        self._field(path, getattr(node, f.name))

  def _field(self, path: str, value: Any) -> None:
    rule, arch = self.map.fields.get(path), self.family.architecture
    if rule is None:
      self.problems.append(f"model.{path} has no entry in the {arch} map (modules/hf_maps.py)")
    elif isinstance(rule, Key) and rule.values is not None and value not in rule.values:
      self.problems.append(f"model.{path} is {value!r} ({arch} takes only "
                           f"{_alternatives(rule.values)})")
    elif isinstance(rule, Key):
      self._put(rule.key, rule.values[value] if rule.values is not None
                else rule.to(value, self.m) if rule.to is not None else value)
    elif isinstance(rule, Fixed) and not rule.allowed(value, self.m):
      self.problems.append(f"model.{path} is {value!r} ({arch} takes only {rule.what})")
    elif isinstance(rule, Same) and value != _at(self.m, rule.other):
      key = getattr(self.map.fields.get(rule.other), "key", rule.other)
      self.problems.append(f"model.{path} is {value!r} but model.{rule.other} is "
                           f"{_at(self.m, rule.other)!r} ({arch} has one {key} for both)")


# Fields that are not the model's math, in every family.
_NOT_MATH = {
    "vocab_multiple": LAYOUT, "scan_layers": LAYOUT, "pipeline_microbatches": LAYOUT,
    "remat": LAYOUT, "block.attention.implementation": LAYOUT,
    "block.attention.query_chunk_size": LAYOUT, "block.attention.logits_dtype": LAYOUT,
    "block.attention.splash_block_size": LAYOUT, "embedding.init_std": INIT,
    "block.attention.init_std": INIT, "block.ffn.init_std": INIT,
}


# -- LLaMA --------------------------------------------------------------------------------

def _llama_rope(c: dict):
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


def _llama_dims(c: dict):
  d, h = c["hidden_size"], c["num_attention_heads"]
  return d, h, c.get("num_key_value_heads") or h, c.get("head_dim") or d // h


def llama_size(c: dict) -> llama.Size:
  if c.get("hidden_act", "silu") != "silu":
    raise ConfigError(f"config.json: hidden_act '{c['hidden_act']}' is not supported (silu)")
  if c.get("partial_rotary_factor", 1.0) != 1.0:
    raise ConfigError("config.json: partial_rotary_factor is not supported")
  d, h, g, k = _llama_dims(c)
  theta, scaling = _llama_rope(c)
  return llama.Size(d, c["num_hidden_layers"], h, g, c["intermediate_size"], c["vocab_size"],
                    theta, bool(c.get("tie_word_embeddings", False)),
                    float(c.get("rms_norm_eps", 1e-6)), None if k == d // h else k, scaling)


def _llama_node(c: dict):
  node = llama.node(llama_size(c))
  node.block.attention.qkv_bias = node.block.attention.out_bias = bool(
      c.get("attention_bias", False))
  node.block.ffn.use_bias = bool(c.get("mlp_bias", False))
  return node


def _llama_layer_shapes(c: dict) -> dict:
  d, h, g, k = _llama_dims(c)
  f = c["intermediate_size"]
  out = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
         "self_attn.q_proj.weight": (h * k, d), "self_attn.k_proj.weight": (g * k, d),
         "self_attn.v_proj.weight": (g * k, d), "self_attn.o_proj.weight": (d, h * k),
         "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
         "mlp.down_proj.weight": (d, f)}
  if c.get("attention_bias"):
    out.update({"self_attn.q_proj.bias": (h * k,), "self_attn.k_proj.bias": (g * k,),
                "self_attn.v_proj.bias": (g * k,), "self_attn.o_proj.bias": (d,)})
  if c.get("mlp_bias"):
    out.update({"mlp.gate_proj.bias": (f,), "mlp.up_proj.bias": (f,), "mlp.down_proj.bias": (d,)})
  return out


def _llama_hf_shapes(c: dict) -> dict:
  d, v = c["hidden_size"], c["vocab_size"]
  out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  if not c.get("tie_word_embeddings", False):
    out["lm_head.weight"] = (v, d)
  for i in range(c["num_hidden_layers"]):
    out.update({f"model.layers.{i}.{k}": s for k, s in _llama_layer_shapes(c).items()})
  return out


def _llama_from_hf(get, c: dict) -> dict:
  d, h, g, k = _llama_dims(c)
  params = {"embedding": {"embedding": get("model.embed_tokens.weight")},
            "final_norm": {"scale": get("model.norm.weight")}}
  if not c.get("tie_word_embeddings", False):
    params["head"] = get("lm_head.weight").T
  layers = []
  for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    attn = {"q": get(p + "self_attn.q_proj.weight").T.reshape(d, h, k),
            "k": get(p + "self_attn.k_proj.weight").T.reshape(d, g, k),
            "v": get(p + "self_attn.v_proj.weight").T.reshape(d, g, k),
            "o": get(p + "self_attn.o_proj.weight").T.reshape(h, k, d)}
    if c.get("attention_bias"):
      for name, heads in (("q", h), ("k", g), ("v", g)):
        attn[f"{name}_bias"] = get(p + f"self_attn.{name}_proj.bias").reshape(heads, k)
      attn["o_bias"] = get(p + "self_attn.o_proj.bias")
    ffn = {"wi": get(p + "mlp.gate_proj.weight").T, "wu": get(p + "mlp.up_proj.weight").T,
           "wo": get(p + "mlp.down_proj.weight").T}
    if c.get("mlp_bias"):
      ffn.update(wi_bias=get(p + "mlp.gate_proj.bias"), wu_bias=get(p + "mlp.up_proj.bias"),
                 wo_bias=get(p + "mlp.down_proj.bias"))
    layers.append({"block": {"attention": attn, "ffn": ffn,
                             "attention_norm": {"scale": get(p + "input_layernorm.weight")},
                             "ffn_norm": {"scale": get(p + "post_attention_layernorm.weight")}}})
  params["layers"] = layers
  return params


def _llama_to_hf(params: dict, m) -> dict:
  out = {"model.embed_tokens.weight": params["embedding"]["embedding"],
         "model.norm.weight": params["final_norm"]["scale"]}
  if not m.tie_embeddings:
    out["lm_head.weight"] = params["head"].T
  for i, layer in enumerate(params["layers"]):
    b, p = layer["block"], f"model.layers.{i}."
    a = b["attention"]
    for name in ("q", "k", "v"):
      w = a[name]
      out[p + f"self_attn.{name}_proj.weight"] = w.reshape(w.shape[0], -1).T
      if f"{name}_bias" in a:
        out[p + f"self_attn.{name}_proj.bias"] = a[f"{name}_bias"].reshape(-1)
    out[p + "self_attn.o_proj.weight"] = a["o"].reshape(-1, a["o"].shape[-1]).T
    if "o_bias" in a:
      out[p + "self_attn.o_proj.bias"] = a["o_bias"]
    for ours, theirs in (("wi", "gate_proj"), ("wu", "up_proj"), ("wo", "down_proj")):
      out[p + f"mlp.{theirs}.weight"] = b["ffn"][ours].T
      if f"{ours}_bias" in b["ffn"]:
        out[p + f"mlp.{theirs}.bias"] = b["ffn"][f"{ours}_bias"]
    out[p + "input_layernorm.weight"] = b["attention_norm"]["scale"]
    out[p + "post_attention_layernorm.weight"] = b["ffn_norm"]["scale"]
  return out


def _heads(m):
  return m.block.attention.heads(m.dim)


_LLAMA = FieldMap(
    kinds={"": {"decoder_lm": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}},
           "embedding": {"token": {}}, "position_embedding": {"none": {}},
           "block": {"pre_norm": {}}, "block.attention": {"attention": {}},
           "block.attention.position": {"rope": {"rope_scaling": None},
                                        "rope_llama3": {"rope_scaling.rope_type": "llama3"}},
           "block.attention.norm": {None: {}}, "block.ffn": {"mlp": {}},
           "block.norm": {"rmsnorm": {}}, "final_norm": {"rmsnorm": {}}},
    fields={**_NOT_MATH,
            "vocab_size": Key("vocab_size"), "dim": Key("hidden_size"),
            "num_layers": Key("num_hidden_layers"), "tie_embeddings": Key("tie_word_embeddings"),
            "block.attention.num_heads": Key("num_attention_heads"),
            "block.attention.num_kv_heads": Key("num_key_value_heads",
                                                to=lambda _, m: _heads(m)[1]),
            "block.attention.head_dim": Key("head_dim", to=lambda _, m: _heads(m)[2]),
            "block.attention.qkv_bias": Key("attention_bias"),
            "block.attention.out_bias": Same("block.attention.qkv_bias"),
            "block.attention.logit_softcap": only(None),  # Gemma-2's; LLaMA has none
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


# -- Qwen3: LLaMA with QK-norm (attention.norm, RMSNorm over each head before RoPE) ----------

_QK = ("q_norm", "k_norm")


def _qwen3_node(c: dict):
  if c.get("use_sliding_window") or set(c.get("layer_types") or ()) - {"full_attention"}:
    raise ConfigError("config.json: sliding-window attention is not supported (full_attention "
                      "layers only)")
  node = _llama_node(c)
  node.block.attention.norm = registry("norm").node("rmsnorm",
                                                    eps=float(c.get("rms_norm_eps", 1e-6)))
  return node


def _qwen3_hf_shapes(c: dict) -> dict:
  out = _llama_hf_shapes(c)
  k = _llama_dims(c)[3]
  for i in range(c["num_hidden_layers"]):
    out.update({f"model.layers.{i}.self_attn.{n}.weight": (k,) for n in _QK})
  return out


def _qwen3_from_hf(get, c: dict) -> dict:
  params = _llama_from_hf(get, c)
  for i, layer in enumerate(params["layers"]):
    layer["block"]["attention"].update(
        {n: {"scale": get(f"model.layers.{i}.self_attn.{n}.weight")} for n in _QK})
  return params


def _qwen3_to_hf(params: dict, m) -> dict:
  out = _llama_to_hf(params, m)
  for i, layer in enumerate(params["layers"]):
    a = layer["block"]["attention"]
    out.update({f"model.layers.{i}.self_attn.{n}.weight": a[n]["scale"] for n in _QK})
  return out


_QWEN3 = FieldMap(
    kinds={**_LLAMA.kinds,
           "": {"decoder_lm": {
               "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
               "use_sliding_window": False, "sliding_window": None,
               "layer_types": lambda m: ["full_attention"] * m.num_layers,
               "max_window_layers": lambda m: m.num_layers}},
           "block.attention.norm": {"rmsnorm": {}}},
    fields={**_LLAMA.fields, "block.attention.norm.eps": Same("block.norm.eps"),
            "block.ffn.use_bias": only(False)})


# -- GPT-2 --------------------------------------------------------------------------------

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                     "relu": "relu"}


def _gpt2_inner(c: dict) -> int:
  return c.get("n_inner") or 4 * c["n_embd"]


def gpt2_size(c: dict) -> gpt2.Size:
  for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
    if c.get(key):
      raise ConfigError(f"config.json: {key}=true is not supported")
  if not c.get("scale_attn_weights", True):
    raise ConfigError("config.json: scale_attn_weights=false is not supported")
  if c.get("activation_function", "gelu_new") not in _GPT2_ACTIVATIONS:
    raise ConfigError(f"config.json: activation_function '{c['activation_function']}' is not "
                      f"supported ({', '.join(_GPT2_ACTIVATIONS)})")
  if c["n_embd"] % c["n_head"]:
    raise ConfigError(f"config.json: n_embd {c['n_embd']} is not divisible by n_head "
                      f"{c['n_head']}")
  return gpt2.Size(c["n_embd"], c["n_layer"], c["n_head"], c["vocab_size"], c["n_positions"],
                   _gpt2_inner(c), float(c.get("layer_norm_epsilon", 1e-5)))


def _gpt2_node(c: dict):
  node = gpt2.node(gpt2_size(c))
  node.block.ffn.activation = _GPT2_ACTIVATIONS[c.get("activation_function", "gelu_new")]
  node.tie_embeddings = bool(c.get("tie_word_embeddings", True))
  return node


def _gpt2_hf_shapes(c: dict) -> dict:
  d, f = c["n_embd"], _gpt2_inner(c)
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


def _gpt2_from_hf(get, c: dict) -> dict:
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


def _gpt2_to_hf(params: dict, m) -> dict:
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


_GPT2 = FieldMap(
    kinds={"": {"decoder_lm": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}},
           "embedding": {"token": {}}, "position_embedding": {"learned": {}},
           "block": {"pre_norm": {}}, "block.attention": {"attention": {}},
           "block.attention.position": {"none": {}}, "block.attention.norm": {None: {}},
           "block.ffn": {"mlp": {}}, "block.norm": {"layernorm": {}},
           "final_norm": {"layernorm": {}}},
    fields={**_NOT_MATH,
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
            "block.attention.logit_softcap": only(None),
            "block.ffn.hidden_dim": Key("n_inner"),
            "block.ffn.activation": Key("activation_function", values={
                ours: theirs for theirs, ours in reversed(_GPT2_ACTIVATIONS.items())}),
            "block.ffn.gated": only(False), "block.ffn.use_bias": only(True),
            "block.norm.eps": Key("layer_norm_epsilon"), "block.norm.use_bias": only(True),
            "final_norm.eps": Same("block.norm.eps"), "final_norm.use_bias": only(True)})


# -- completeness ----------------------------------------------------------------------------

class _Reads(dict):
  """A parameter tree (dicts and lists of arrays) that records which leaves are read."""

  def __init__(self, tree: Mapping, path: tuple, reads: set):
    super().__init__({k: _track(v, (*path, k), reads) for k, v in tree.items()})
    self._path, self._reads = path, reads

  def _leaf(self, key, value):
    if not isinstance(value, (dict, list)):
      self._reads.add((*self._path, key))
    return value

  def __getitem__(self, key):
    return self._leaf(key, super().__getitem__(key))

  def get(self, key, default=None):
    return self[key] if key in self else default

  def items(self):
    return [(k, self[k]) for k in self]

  def values(self):
    return [self[k] for k in self]


def _track(tree: Any, path: tuple, reads: set) -> Any:
  if isinstance(tree, Mapping):
    return _Reads(tree, path, reads)
  if isinstance(tree, (list, tuple)):
    return [_track(v, (*path, i), reads) for i, v in enumerate(tree)]
  return tree


def _leaf_paths(tree: Any, path: tuple = ()) -> list[tuple]:
  if isinstance(tree, Mapping):
    return [p for k, v in tree.items() for p in _leaf_paths(v, (*path, k))]
  if isinstance(tree, (list, tuple)):
    return [p for i, v in enumerate(tree) for p in _leaf_paths(v, (*path, i))]
  return [path]


def _names(paths) -> str:
  """Parameter paths, one name per parameter of every layer: layers.*.block.attention.x."""
  names = sorted({".".join("*" if isinstance(part, int) else str(part) for part in p)
                  for p in paths})
  return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def export(family: Family, params: dict, m) -> dict:
  """`family.to_hf(params, m)` after checking that it reads every parameter of `params`
  ({'layers': [layer, ...], ...}); ConfigError naming those it leaves unread."""
  reads: set = set()
  tensors = family.to_hf(_track(params, (), reads), m)
  unread = [p for p in _leaf_paths(params) if p not in reads]
  if unread:
    raise ConfigError(f"the model cannot be written as {family.architecture}: its parameters "
                      f"{_names(unread)} map to no Hugging Face tensor; nothing was written")
  return tensors


def import_params(family: Family, get: Callable[[str], np.ndarray], hf_cfg: dict,
                  expected: Mapping) -> dict:
  """`family.from_hf(get, hf_cfg)` after checking that it reads every tensor the HF config
  implies and fills every parameter of the model (`expected`, the model's own tree of
  shapes, layers as a list); ConfigError naming what is unmapped."""
  read: set = set()

  def tracked(name: str) -> np.ndarray:
    read.add(name)
    return get(name)

  params = family.from_hf(tracked, hf_cfg)
  unread = sorted(set(family.hf_shapes(hf_cfg)) - read)
  if unread:
    raise ConfigError(f"the {family.architecture} map reads no parameter from the tensors "
                      f"{', '.join(unread[:8])}{' ...' if len(unread) > 8 else ''}; nothing was "
                      f"written")
  missing = sorted(set(_leaf_paths(expected)) - set(_leaf_paths(params)), key=str)
  if missing:
    raise ConfigError(f"the model's parameters {_names(missing)} get no tensor from the "
                      f"{family.architecture} checkpoint; nothing was written")
  return params


# In the order that breaks a tie in family_of_model: Qwen3 before LLaMA, the family it extends.
FAMILIES = {
    "Qwen3ForCausalLM": Family("qwen3", "Qwen3ForCausalLM", _qwen3_node, _qwen3_hf_shapes,
                               (".rotary_emb.inv_freq",), _qwen3_from_hf, _qwen3_to_hf, _QWEN3),
    "LlamaForCausalLM": Family("llama", "LlamaForCausalLM", _llama_node, _llama_hf_shapes,
                               (".rotary_emb.inv_freq",), _llama_from_hf, _llama_to_hf, _LLAMA),
    "GPT2LMHeadModel": Family("gpt2", "GPT2LMHeadModel", _gpt2_node, _gpt2_hf_shapes,
                              (".attn.bias", ".attn.masked_bias"), _gpt2_from_hf, _gpt2_to_hf,
                              _GPT2),
}


def pad_vocab(params: dict, rows: int) -> dict:
  """Our tree from `from_hf` with the token embedding's rows (and an untied head's columns)
  padded with zeros up to `rows`, the model's padded_vocab_size (modules/decoder.py)."""
  def pad(x, axis):
    width = [(0, 0)] * x.ndim
    width[axis] = (0, rows - x.shape[axis])
    return np.pad(x, width)
  out = dict(params, embedding=dict(params["embedding"],
                                    embedding=pad(params["embedding"]["embedding"], 0)))
  if "head" in params:
    out["head"] = pad(params["head"], 1)
  return out


def drop_vocab_padding(params: dict, vocab_size: int) -> dict:
  """The inverse of pad_vocab: the first `vocab_size` rows (head columns), for `to_hf`."""
  out = dict(params, embedding=dict(params["embedding"],
                                    embedding=params["embedding"]["embedding"][:vocab_size]))
  if "head" in params:
    out["head"] = params["head"][:, :vocab_size]
  return out


def family_of_model(m) -> Family:
  """The family a parsed model config is written as: the one whose map finds the fewest
  settings it cannot hold (none, where any can), so that a refusal names what keeps the model
  from its nearest HF class (a Qwen3 with MLP biases is refused as Qwen3, not LLaMA)."""
  return min(FAMILIES.values(), key=lambda family: len(family.problems(m)))
