"""HF export covers every model config field, not only parameters (modules/hf_maps.py:FieldMap).

The model config tree is enumerated from the registries, not from a list: every slot, every kind
of its registry, every field of each kind; the families from the registered maps, each with its
`example` config. A map names what its HF class holds; a field or slot it does not name is held
at its default, so only one without a default needs a rule in every map that reaches it, and a
rule must name a field of some kind. Changing any field of a converted model away from its value
must either reach the HF config (a round trip through the family's import gives the value back),
refuse the export by the field's path, or, for a field declared not to be math (layout,
initialisation), leave the HF config as it was.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing

import pytest

import modules  # noqa: F401  (registers the layer library)
from core.registry import (REQUIRED, Component, ConfigError, child_registry, map_registry,
                           optional_child, registry)
from modules import hf_maps
from modules.hf_maps import FAMILIES, Key, NotWritten

MODEL = registry("model")


def _base(arch: str) -> dict:
  """What `convert --from_hf` makes of the family's example config."""
  return FAMILIES[arch].model_node(FAMILIES[arch].example).to_dict()


def _join(slot: str, name: str) -> str:
  return f"{slot}.{name}" if slot else name


def _config_cls(reg, kind: str) -> type:
  return reg.entry(kind).config_cls


# -- every family decides every field it can reach -------------------------------------------

def _tree(kinds_at, skip=lambda path: False, names=lambda path: ()) -> tuple[dict, dict]:
  """The model config tree from the config classes of the registries, through the kinds that
  `kinds_at(registry, slot, field)` gives at each slot, not below a slot that `skip`s, a field
  of named nodes (a block group's blocks) through the names that `names(path)` gives:
  ({slot: (its registry, its field; None for the model)}, {leaf field path: its field})."""
  slots, leaves = {}, {}

  def walk(reg, slot: str, field) -> None:
    slots[slot] = (reg, field)
    for kind in kinds_at(reg, slot, field) or ():
      if kind is None or kind not in reg.kinds():
        continue
      for f in dataclasses.fields(_config_cls(reg, kind)):
        path = _join(slot, f.name)
        if f.name == "kind" or skip(path):
          continue
        if child_registry(f) is not None:
          walk(child_registry(f), path, f)
        elif map_registry(f) is not None:
          for name in names(path):
            walk(map_registry(f), _join(path, name), f)
        else:
          leaves.setdefault(path, f)

  walk(MODEL, "", None)
  return slots, leaves


def undecided(fmap) -> list[str]:
  """What the map leaves undecided or names wrongly, one line each: a field or slot that its
  family reaches (through the kinds it takes, or the defaults where it names none) with neither
  a default nor a rule; a rule or kinds entry that names no field or slot of any registered
  kind (a map may name one that only a kind it does not take has, as a map built on another's
  does); a kind that is not its slot's."""
  names = lambda path: sorted({s[len(path) + 1:].split(".")[0] for s in fmap.kinds
                               if s.startswith(path + ".")})  # the members the map names
  every_slot, every_leaf = _tree(lambda reg, slot, field: reg.kinds(), names=names)
  slots, leaves = _tree(lambda reg, slot, field: fmap.kinds_at(slot, field),
                        skip=lambda path: isinstance(fmap.fields.get(path), NotWritten),
                        names=names)
  out = [f"field {p}: no default and no rule" for p, f in sorted(leaves.items())
         if fmap.rule_at(p, f) is None]
  out += [f"slot {s}: no default and no kinds" for s, (_, f) in sorted(slots.items())
          if fmap.kinds_at(s, f) is None]
  out += [f"rule {p}: names no field" for p in sorted(fmap.fields) if p not in every_leaf
          and not (p in every_slot and isinstance(fmap.fields[p], NotWritten))]
  out += [f"kinds {s}: names no slot" for s in sorted(set(fmap.kinds) - set(every_slot))]
  for slot, kinds in fmap.kinds.items():
    reg, field = every_slot.get(slot, (None, None))
    for kind in kinds if reg is not None else ():
      if kind is None and not (field is not None and optional_child(field)):
        out.append(f"kinds {slot}: None, but the slot is not optional")
      elif kind is not None and kind not in reg.kinds():
        out.append(f"kinds {slot}: '{kind}' is no {reg.name} kind")
  return out


@pytest.mark.parametrize("arch", FAMILIES)
def test_every_family_map_decides_every_model_field(arch):
  assert undecided(FAMILIES[arch].settings) == []


# -- every field changed: carried, refused by name, or not math --------------------------------

def _get(tree: dict, path: str):
  for part in path.split(".") if path else ():
    tree = (dict(tree) if isinstance(tree, tuple) else tree)[part]  # named nodes: (name, node)s
  return tree


def _with(tree: dict, path: str, value) -> dict:
  out = copy.deepcopy(tree)
  *parents, last = path.split(".")
  _get(out, ".".join(parents))[last] = value
  return out


def _changed(value, hint):
  """A value of type `hint` other than `value`."""
  args = typing.get_args(hint)
  if typing.get_origin(hint) is typing.Literal:
    return next(a for a in args if a != value)
  if typing.get_origin(hint) is tuple and args == (str, ...):
    return (*(value or ()), "a")  # a block group's pattern: one layer more, of member "a"
  base = next((a for a in args if a is not type(None)), hint)
  if base is bool:
    return not value
  if base is int:
    return 1 if value is None else (value * 2 or 2)
  if base is float:
    return 0.5 if value is None else (value * 2 or 0.5)
  if base is str:
    return f"{value or ''}_changed"  # not checked before build: any other text serves
  pytest.fail(f"no generic change for a field of type {hint} (value {value!r}): extend _changed")


def _switched(reg, node, kind):
  """`node` switched to `kind` as `--config.<slot>.kind=K` does, required fields filled."""
  if kind is None:
    return None
  if node is not None and kind != node["kind"]:
    for f in dataclasses.fields(_config_cls(reg, node["kind"])):
      if map_registry(f) is reg:  # a block group switched to one block: its first block's parts
        node = next(iter(node[f.name].values()))
        break
  out = reg.switched(node, kind).to_dict()
  hints = typing.get_type_hints(_config_cls(reg, kind))
  for f in dataclasses.fields(_config_cls(reg, kind)):
    if out.get(f.name) is None and f.default is dataclasses.MISSING:
      # named nodes of the slot's own registry (a block group's): the node switched from, "a"
      out[f.name] = ({"a": node} if map_registry(f) is reg
                     else _changed(None, hints[f.name]))
  return out


@dataclasses.dataclass
class Change:
  label: str  # what changed, as `--config.model.<label>`
  tree: dict  # the model node with the change
  names: tuple[str, ...]  # paths a refusal may name ('x.kind' for a kind switch)
  compare: str  # the path whose value a carried change must bring back


def _changes(base: dict) -> list[Change]:
  """One change per slot kind and per field, enumerated from the registries."""
  out: list[Change] = []

  def visit(reg, slot: str, node, optional: bool) -> None:
    current = None if node is None else node["kind"]
    others = [k for k in reg.kinds() if k != current]
    for kind in others + ([None] if optional and current is not None else []):
      switched = _switched(reg, node, kind)
      out.append(Change(f"{slot}.kind={kind}", _with(base, slot, switched),
                        (f"{slot}.kind", slot), slot))
      if kind is None:
        continue
      hints = typing.get_type_hints(_config_cls(reg, kind))
      current_fields = ({f.name for f in dataclasses.fields(_config_cls(reg, current))}
                        if current else set())
      for f in dataclasses.fields(_config_cls(reg, kind)):
        if f.name == "kind" or f.name in current_fields or child_registry(f) is not None or (
            map_registry(f) is not None):
          continue  # a field the current kind has too is changed below
        path = _join(slot, f.name)
        out.append(Change(f"{slot}.kind={kind}, {f.name}",
                          _with(base, slot, {**switched,
                                             f.name: _changed(switched[f.name], hints[f.name])}),
                          (f"{slot}.kind", slot, path), path))
    if node is None:
      return
    hints = typing.get_type_hints(_config_cls(reg, current))
    for f in dataclasses.fields(_config_cls(reg, current)):
      path = _join(slot, f.name)
      if f.name == "kind":
        continue
      if child_registry(f) is not None:
        visit(child_registry(f), path, node[f.name], optional_child(f))
      elif map_registry(f) is not None:  # named nodes: each a slot of its own
        for name, member in node[f.name].items():
          visit(map_registry(f), _join(path, name), member, False)
      else:
        out.append(Change(path, _with(base, path, _changed(node[f.name], hints[f.name])),
                          (path,), path))

  visit(MODEL, "", base, False)
  return out


def _not_math(family, path: str) -> bool:
  parts = path.split(".")
  return any(isinstance(family.settings.fields.get(".".join(parts[:i])), NotWritten)
             for i in range(1, len(parts) + 1))


def _without_not_math(family, tree, slot: str):
  """`tree` (the node at `slot`) without the fields the family does not write."""
  if not isinstance(tree, dict):
    return tree
  return {k: _without_not_math(family, v, _join(slot, k)) for k, v in tree.items()
          if not _not_math(family, _join(slot, k))}


def _outcome(change: Change, base_hf: dict, source: str) -> str | None:
  """None when the change is carried, refused by name or (not math) leaves the export alone;
  else what went wrong. `source`: the class the model came from, as a converted run's."""
  m = MODEL.parse(change.tree, "model")
  family = hf_maps.family_of_model(m, source=source)
  try:
    hf = family.hf_config(m)
  except ConfigError as e:
    named = any(re.search(rf"model\.{re.escape(p)} is ", str(e)) for p in change.names)
    return None if named else f"refused without naming it: {e}"
  if _not_math(family, change.compare):
    return None if hf == base_hf else f"not math, but the export changed: {hf}"
  back = MODEL.parse(family.model_node(hf), "model")
  want = _without_not_math(family, _get(change.tree, change.compare), change.compare)
  got = _get(dataclasses.asdict(back), change.compare)
  got = _without_not_math(family, got, change.compare)
  return None if got == want else f"exported as {family.architecture}, read back {got!r}"


@pytest.mark.parametrize("arch", FAMILIES)
def test_every_model_field_changed_is_carried_or_refused_by_name(arch):
  base = _base(arch)
  base_hf = FAMILIES[arch].hf_config(MODEL.parse(base, "model"))
  changes = _changes(base)
  assert len(changes) > 40  # every slot's kinds and every field: not a vacuous walk
  wrong = {c.label: why for c in changes if (why := _outcome(c, base_hf, arch)) is not None}
  assert wrong == {}


# -- the cases the issue names -------------------------------------------------------------

def _refusal(tree: dict, source: str | None = None) -> str:
  """The export's refusal of `tree` (converted from class `source`, if given)."""
  m = MODEL.parse(tree, "model")
  with pytest.raises(ConfigError) as e:
    hf_maps.family_of_model(m, source=source).hf_config(m)
  return str(e.value)


def _parallel(block: dict) -> dict:
  """A pre_norm block node as a parallel one (its own fields dropped)."""
  return {**{k: v for k, v in block.items() if k != "post_norms"}, "kind": "parallel"}


def test_a_qwen3_refusal_names_qwen3():
  base = _base("Qwen3ForCausalLM")
  parallel = _with(base, "block", {**_parallel(base["block"]), "separate_norms": False})
  assert _refusal(parallel) == ("the model cannot be written as Qwen3ForCausalLM: model.block.kind"
                                " is 'parallel' (Qwen3ForCausalLM takes only 'pre_norm')")
  assert _refusal(_with(base, "block.ffn.use_bias", True)) == (
      "the model cannot be written as Qwen3ForCausalLM: model.block.ffn.use_bias is True "
      "(Qwen3ForCausalLM takes only False)")


def test_a_refusal_names_each_field_also_under_a_kind_the_family_lacks():
  """A parallel block with layernorm and a soft-cap: every refused field by its path, not only
  the block's kind (the fields under it that the map knows are still checked)."""
  base = _base("LlamaForCausalLM")
  block = {**_parallel(base["block"]), "separate_norms": False,
           "norm": {"kind": "layernorm", "eps": 1e-5, "use_bias": True},
           "attention": {**base["block"]["attention"], "logit_softcap": 30.0}}
  assert _refusal(_with(base, "block", block)) == (
      "the model cannot be written as LlamaForCausalLM: model.block.kind is 'parallel' "
      "(LlamaForCausalLM takes only 'pre_norm'); model.block.attention.logit_softcap is 30.0 "
      "(LlamaForCausalLM takes only None); model.block.norm.kind is 'layernorm' "
      "(LlamaForCausalLM takes only 'rmsnorm')")


def _attentions(base: dict) -> list[str]:
  """The paths of a family's attention nodes: its block's, or each of its block group's."""
  if "attention" in base["block"]:
    return ["block.attention"]
  return [f"block.blocks.{name}.attention" for name in sorted(base["block"]["blocks"])]


def _add_to_attention(monkeypatch, cls) -> None:
  """`cls`, the attention config with a field more, as kind 'attention' for this test only."""
  attention = registry("attention")
  monkeypatch.setitem(attention._entries, "attention",  # pylint: disable=protected-access
                      Component("attention", cls, attention.entry("attention").target))


def test_a_field_added_later_needs_a_rule_only_in_the_map_of_a_family_that_holds_it(monkeypatch):
  """A field added later with no parameters (a soft-cap of the attention logits, 0 = off) needs
  no rule in any map: at its default every family's export is what it was, and any other value
  is refused by its path. A family whose HF class holds it names it in its own map, and carries
  it; the other maps stay as they are."""
  before = {arch: FAMILIES[arch].hf_config(MODEL.parse(_base(arch), "model")) for arch in FAMILIES}

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class WithSoftCap(registry("attention").entry("attention").config_cls):
    logit_soft_cap: float = 0.0  # 0 = off

  _add_to_attention(monkeypatch, WithSoftCap)
  for arch, family in FAMILIES.items():
    assert undecided(family.settings) == []
    base = _base(arch)
    attention = _attentions(base)[0]
    assert _get(base, attention)["logit_soft_cap"] == 0.0
    assert family.hf_config(MODEL.parse(base, "model")) == before[arch]
    assert _refusal(_with(base, f"{attention}.logit_soft_cap", 30.0), source=arch) == (
        f"the model cannot be written as {arch}: model.{attention}.logit_soft_cap is 30.0 "
        f"({arch} takes only 0.0)")
  llama = FAMILIES["LlamaForCausalLM"]
  holds = dataclasses.replace(llama, settings=dataclasses.replace(llama.settings, fields={
      **llama.settings.fields, "block.attention.logit_soft_cap": Key("attn_logit_softcapping")}))
  monkeypatch.setitem(FAMILIES, "LlamaForCausalLM", holds)
  assert undecided(holds.settings) == []
  m = MODEL.parse(_with(_base("LlamaForCausalLM"), "block.attention.logit_soft_cap", 30.0),
                  "model")
  assert hf_maps.family_of_model(m) is holds
  assert holds.hf_config(m)["attn_logit_softcapping"] == 30.0


def test_a_field_without_a_default_needs_a_rule_in_every_map_that_reaches_it(monkeypatch):
  """Held at no default, a field added without one is undecided in every family that reaches
  its kind, and export refuses it by its path, naming the map's file."""
  base = _base("LlamaForCausalLM")

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class WithWindow(registry("attention").entry("attention").config_cls):
    window: int = REQUIRED  # tokens each query attends to

  attentions = {arch: _attentions(_base(arch)) for arch in FAMILIES}
  _add_to_attention(monkeypatch, WithWindow)
  for arch, family in FAMILIES.items():
    assert undecided(family.settings) == [f"field {a}.window: no default and no rule"
                                          for a in attentions[arch]]
  assert _refusal(_with(base, "block.attention.window", 4096)) == (
      "the model cannot be written as LlamaForCausalLM: model.block.attention.window has no "
      "default and no entry in the LlamaForCausalLM map (modules/llama_hf.py)")


def test_the_map_check_names_a_rule_or_slot_that_no_kind_has():
  """A rule may name a field of a kind its family does not take (a map built on another's
  keeps its rules: here LLaMA's without `rope_llama3`), but not a path that no kind has."""
  llama = FAMILIES["LlamaForCausalLM"].settings
  rope_only = dataclasses.replace(llama, kinds={**llama.kinds, "block.attention.position": {
      "rope": {"rope_scaling": None}}})
  assert "block.attention.position.factor" in rope_only.fields and undecided(rope_only) == []
  wrong = dataclasses.replace(llama, fields={**llama.fields, "block.attention.num_head": Key("n")},
                              kinds={**llama.kinds, "block.mlp": {"mlp": {}},
                                     "block.ffn": {"mlp": {}, "dense": {}}})
  assert undecided(wrong) == ["rule block.attention.num_head: names no field",
                              "kinds block.mlp: names no slot",
                              "kinds block.ffn: 'dense' is no ffn kind"]
