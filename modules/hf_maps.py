"""Hugging Face <-> axtrain: what every family's map is made of, the checks that every map
gets, and the families (`FAMILIES`).

A family's map is a file of its own (modules/llama_hf.py: LlamaForCausalLM,
modules/mistral_hf.py: MistralForCausalLM, modules/qwen3_hf.py: Qwen3ForCausalLM,
modules/gpt2_hf.py: GPT2LMHeadModel) that `register`s its `Family`: which HF config it accepts
and the config node it becomes, the HF tensor names and shapes its config implies, and how each
tensor maps to our parameters (one layer at a time; the caller stacks layers for a scanned
model). Every map is a reshape or a transpose, so a round trip reproduces
each tensor bit for bit. `modules/` imports every file in it, so a new family is found here with
no line to add; its `example` (a small HF config) is what the tests convert and compare with
transformers.

Completeness is checked generically, whatever the family (`export`, `import_params`): every
parameter of the model must be read by the map to Hugging Face, and every tensor that the
HF config implies must be read by the map from it; otherwise the conversion refuses and
names what is unmapped. So a layer that adds a parameter cannot be dropped silently by a
conversion written before it existed.

Settings are checked the same way (`FieldMap`, `Family.hf_config`): a family's map names what
its HF class holds: for a field of the model config tree, the HF config key it becomes (`Key`),
the only values HF can hold (`Fixed`), another field's key that it shares (`Same`), or that it
is not part of the model's math (`LAYOUT`, `INIT`); for a component slot, the kinds HF has.
Whatever a map does not name is held at its default in the config classes: export refuses any
other value by its path (`model.block.attention.logit_softcap is 50.0 (LlamaForCausalLM takes
only None)`). A field keeps the earlier math at its default (as golden files and old run
directories assume), so a field that one family's HF class holds needs a rule in that family's
map only, and every other family refuses it, away from its default, with no edit; a field or
slot without a default must be named by every map that reaches it.

Our vocabulary is padded (model.vocab_multiple): `pad_vocab` adds zero rows on import,
`drop_vocab_padding` removes them on export.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from core.registry import (REQUIRED, ConfigError, child_default_kind, child_registry,
                           map_registry, members, optional_child)
from modules import attention, mlp

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
# How the model trains (quantized dots); its float32 master weights are what is written.
TRAINING = NotWritten("training numerics")

Rule = Key | Fixed | Same | NotWritten


@dataclasses.dataclass(frozen=True)
class FieldMap:
  """A family's settings. `kinds`: for component slots ('' the model, 'block.ffn', ...), the
  kinds HF has there (None: the optional slot off), each with the HF keys it implies (a value,
  or a function of the parsed model). `fields`: rules for fields of those kinds, by path
  ('block.attention.num_heads'); a rule NotWritten on a slot covers its whole subtree. A slot or
  field the map does not name is held at its default (`kinds_at`, `rule_at`)."""
  kinds: Mapping[str, Mapping[str | None, Mapping[str, Any]]]
  fields: Mapping[str, Rule]

  def kinds_at(self, slot: str, f: dataclasses.Field | None) -> Mapping | None:
    """The kinds HF has at `slot`, whose field is `f` (None for the model): the map's, else
    the field's default (off for an optional child, else its default kind), which implies no
    HF key; None where the map names none and the field has no default."""
    if slot in self.kinds:
      return self.kinds[slot]
    if f is not None and optional_child(f):
      return {None: {}}
    kind = None if f is None else child_default_kind(f)
    return None if kind is None else {kind: {}}

  def rule_at(self, path: str, f: dataclasses.Field) -> Rule | None:
    """The rule of the field at `path` (`f`): the map's, else only its default; None where
    the map names none and the field has no default."""
    if path in self.fields:
      return self.fields[path]
    if f.default is not REQUIRED:
      return only(f.default)
    if f.default_factory is not dataclasses.MISSING:
      return only(f.default_factory())
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
  name: str  # HF `model_type`
  architecture: str  # HF `architectures[0]`
  model_node: Callable[[dict], Any]  # HF config -> our model ConfigDict
  hf_shapes: Callable[[dict], dict]  # HF config -> {tensor name: shape}
  ignored: tuple[str, ...]  # suffixes of HF buffers that are not parameters
  from_hf: Callable[[Callable[[str], np.ndarray], dict], dict]  # (get tensor, HF config) -> params
  to_hf: Callable[[dict, Any], dict]  # (params, parsed model config) -> {name: tensor}
  settings: FieldMap  # model config fields -> HF config.json keys
  # A small HF config.json of the class (tests convert it both ways and compare with transformers;
  # their token ids go up to 120, so its vocab_size is at least 121)
  example: Mapping[str, Any]
  extends: str | None = None  # the architecture whose map this one builds on (ties: this one)

  @property
  def source(self) -> str:
    """The file of its map."""
    return self.model_node.__module__.replace(".", "/") + ".py"

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


_NOWHERE = object()  # a path that the model config does not have (a slot of another kind)


def _at(m, path: str) -> Any:
  """The value at dotted `path` of parsed model config `m` (None where a slot is off; _NOWHERE
  where a node on the way has no such field or named node)."""
  node = m
  for part in path.split("."):
    if node is None or node is _NOWHERE:
      return node
    node = (members(node).get(part, _NOWHERE) if isinstance(node, tuple)
            else getattr(node, part, _NOWHERE))
  return node


class _Writer:
  """One walk of a parsed model config against a family's FieldMap: `out` (the HF keys)
  and `problems` (what cannot be written, by path)."""

  def __init__(self, family: Family, m):
    self.family, self.m, self.map = family, m, family.settings
    self.out: dict = {}
    self.problems: list[str] = []
    self.unequal: set[str] = set()  # the fields that others must equal (Same) and do not
    self.same_problems = 0  # the problems of those others
    self._computed: list = []  # (HF key, function of the model) to write after the walk

  @property
  def distance(self) -> int:
    """The settings the family's HF class cannot hold: each problem, but fields that must equal
    one other field (HF holds one setting for them) and do not count once for that field."""
    return len(self.problems) - self.same_problems + len(self.unequal)

  def run(self) -> "_Writer":
    self._slot(self.m, "")
    if not self.problems:  # values computed from the model: only of a model of this family's
      for key, value in self._computed:  # shape (another's may lack what they read)
        self._set(key, value(self.m))
    return self

  def _put(self, key: str, value: Any) -> None:
    """Writes `value`, or `value(model)` for a callable once the walk found no problem."""
    if callable(value):
      self._computed.append((key, value))
    else:
      self._set(key, copy.deepcopy(value))

  def _set(self, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    target = self.out
    for part in parents:
      target = target.setdefault(part, {})
    target[last] = value

  def _slot(self, node, slot: str, f: dataclasses.Field | None = None) -> None:
    where, arch = f"model.{slot}" if slot else "model", self.family.architecture
    kinds = self.map.kinds_at(slot, f)
    kind = None if node is None else node.kind
    if kinds is None:
      self.problems.append(f"{where} has no default and no entry in the {arch} map "
                           f"({self.family.source})")
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
          self._slot(getattr(node, f.name), path, f)
      elif map_registry(f) is not None:  # named nodes (a block group's): a slot each
        for name, member in getattr(node, f.name):
          if not known_only or f"{path}.{name}" in self.map.kinds:
            self._slot(member, f"{path}.{name}", f)
      elif not known_only or path in self.map.fields:
        self._field(path, getattr(node, f.name), f)

  def _field(self, path: str, value: Any, f: dataclasses.Field) -> None:
    rule, arch = self.map.rule_at(path, f), self.family.architecture
    if rule is None:
      self.problems.append(f"model.{path} has no default and no entry in the {arch} map "
                           f"({self.family.source})")
    elif isinstance(rule, Key) and rule.values is not None and value not in rule.values:
      self.problems.append(f"model.{path} is {value!r} ({arch} takes only "
                           f"{_alternatives(rule.values)})")
    elif isinstance(rule, Key):
      self._put(rule.key, rule.values[value] if rule.values is not None
                else (lambda m, to=rule.to: to(value, m)) if rule.to is not None else value)
    elif isinstance(rule, Fixed) and not rule.allowed(value, self.m):
      self.problems.append(f"model.{path} is {value!r} ({arch} takes only {rule.what})")
    elif isinstance(rule, Same) and _at(self.m, rule.other) not in (value, _NOWHERE):
      # (_NOWHERE: the other field's slot is of another kind, refused on its own)
      self.unequal.add(rule.other)
      self.same_problems += 1
      key = getattr(self.map.fields.get(rule.other), "key", rule.other)
      self.problems.append(f"model.{path} is {value!r} but model.{rule.other} is "
                           f"{_at(self.m, rule.other)!r} ({arch} has one {key} for both)")


# Fields that are not the model's math, in every family.
NOT_MATH = {
    "vocab_multiple": LAYOUT, "scan_layers": LAYOUT, "pipeline_microbatches": LAYOUT,
    "remat": LAYOUT, "block.attention.implementation": LAYOUT,
    "block.attention.query_chunk_size": LAYOUT, "block.attention.logits_dtype": LAYOUT,
    "block.attention.splash_block_size": LAYOUT, "block.attention.pallas_block_q": LAYOUT,
    "block.attention.pallas_block_kv": LAYOUT, "block.attention.pallas_products": LAYOUT,
    "embedding.init_std": INIT,
    "block.attention.init_std": INIT, "block.ffn.init_std": INIT, "quantization": TRAINING,
    "block.attention.fused_qkv": LAYOUT, "block.ffn.fused_gate_up": LAYOUT,
}


# -- fused projections (attention.fused_qkv, mlp.fused_gate_up) -----------------------------

# (the fused kernel's name, separate -> fused, fused -> separate) of each fused layout. Every
# map speaks separate projections, as Hugging Face stores them (GPT-2's `c_attn` too: its map
# stacks q, k, v itself): `export` splits a fused model's tree before the map reads it, and
# `import_params` fuses the map's tree where the model's own tree is fused.
_FUSED = ((attention.QKV, attention.fuse_qkv, attention.split_qkv),
          (mlp.WI_WU, mlp.fuse_gate_up, mlp.split_gate_up))


def separate(tree: Any) -> Any:
  """A parameter tree with every fused projection split (a view: bit for bit)."""
  if isinstance(tree, Mapping):
    out = {k: separate(v) for k, v in tree.items()}
    for name, _, split in _FUSED:
      out = split(out) if name in out else out
    return out
  if isinstance(tree, (list, tuple)):
    return [separate(v) for v in tree]
  return tree


def fused_like(tree: Any, like: Any) -> Any:
  """A tree of separate projections with those fused where `like` (the model's tree of the same
  structure) holds a fused kernel (a concatenation: bit for bit)."""
  if isinstance(tree, Mapping) and isinstance(like, Mapping):
    out = {k: fused_like(v, like.get(k)) for k, v in tree.items()}
    for name, fuse, _ in _FUSED:
      out = fuse(out) if name in like and name not in out else out
    return out
  if isinstance(tree, (list, tuple)) and isinstance(like, (list, tuple)):
    return [fused_like(v, w) for v, w in zip(tree, like)]
  return tree


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
  ({'layers': [layer, ...], ...}; fused projections split first); ConfigError naming those it
  leaves unread."""
  reads: set = set()
  params = separate(params)
  tensors = family.to_hf(_track(params, (), reads), m)
  unread = [p for p in _leaf_paths(params) if p not in reads]
  if unread:
    raise ConfigError(f"the model cannot be written as {family.architecture}: its parameters "
                      f"{_names(unread)} map to no Hugging Face tensor; nothing was written")
  return tensors


def import_params(family: Family, get: Callable[[str], np.ndarray], hf_cfg: dict,
                  expected: Mapping) -> dict:
  """`family.from_hf(get, hf_cfg)` (its projections fused where the model's are) after
  checking that it reads every tensor the HF config implies and fills every parameter of the
  model (`expected`, the model's own tree of shapes, layers as a list); ConfigError naming
  what is unmapped."""
  read: set = set()

  def tracked(name: str) -> np.ndarray:
    read.add(name)
    return get(name)

  params = fused_like(family.from_hf(tracked, hf_cfg), expected)
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


# The registered families by architecture, in the order their files are imported.
FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
  """Adds `family` to FAMILIES (its file calls this; `modules/` imports every file in it)."""
  if family.architecture in FAMILIES:
    raise ValueError(f"Hugging Face family {family.architecture!r} registered twice")
  FAMILIES[family.architecture] = family
  return family


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


def _depth(family: Family) -> int:
  """How many maps `family` builds on (Qwen3: 1, on LLaMA's)."""
  return 0 if family.extends is None else 1 + _depth(FAMILIES[family.extends])


def family_of_model(m, *, source: str | None = None) -> Family:
  """The family a parsed model config is written as: the one whose map finds the fewest
  settings it cannot hold (none, where any can; `_Writer.distance`: fields that must all equal
  one, a changed setting of a layer pattern's member, count once), so that a refusal names what
  keeps the model from its nearest HF class; of two as near, the architecture it was converted
  from (`source`); else, of two that both hold it, the one the other builds on (a class that
  holds more, built on LLaMA's map, does not take LLaMA's models), and of two that both refuse
  it, the one that builds on the other (a Qwen3 with MLP biases is refused as Qwen3, not LLaMA).
  Two classes may hold the same math (Mistral's and Phi-3's layers): a converted model goes back
  to its own class, one trained here to the more general class, or the first registered."""
  def key(family: Family):
    distance = _Writer(family, m).run().distance
    return (distance, family.architecture != source,
            _depth(family) if distance == 0 else -_depth(family))
  return min(FAMILIES.values(), key=key)
