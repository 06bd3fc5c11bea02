"""What a config chooses, against the defaults of its components and sections.

A resolved config holds every field of every node (`--print_config`, config.json). Its
*choices* are what a reader needs to know: each node's `kind`, each required field, and
each value that differs from its field's default in that kind's config class (or the
section's dataclass). Golden files hold the choices, so a new field with a default
changes none of them; `with_defaults` is the inverse, which fills every node from its
kind's defaults again. `schema` is the dataclass of the root (trainer.config.RunConfig);
each node's class comes from its parent's `child()` field and the node's `kind`, so no
registry is named here.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections

from core.registry import child_default_kind, child_registry, list_registry, map_registry

_NONE = dataclasses.MISSING


def _dict(value: Any) -> Any:
  """A ConfigDict as a dict (tuples stay tuples, as --print_config shows them)."""
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value


def _plain(value: Any) -> Any:
  """For comparing values: tuples as lists (config.json holds lists)."""
  value = _dict(value)
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def _default(f: dataclasses.Field) -> Any:
  if f.default is not dataclasses.MISSING:
    return f.default
  if f.default_factory is not dataclasses.MISSING:
    return f.default_factory()
  return _NONE


def _is_node(value: Any) -> bool:
  return isinstance(value, Mapping) and "kind" in value


def _node_class(f: dataclasses.Field, hint: Any, value: Any) -> type | None:
  """The config class of the node `value` held by field `f`, if it is a known node."""
  reg = child_registry(f)
  if reg is not None:
    if _is_node(value) and value["kind"] in reg.kinds():
      return reg.entry(value["kind"]).config_cls
    return None
  if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
    return hint
  return None


def _items(f: dataclasses.Field, value: Any):
  """[(item, its config class or None)] of a child_list field, else None."""
  listed = list_registry(f)
  if listed is None or not isinstance(value, (list, tuple)):
    return None
  reg, _ = listed
  return [(item, reg.entry(item["kind"]).config_cls
           if _is_node(item) and item["kind"] in reg.kinds() else None) for item in value]


def _named(f: dataclasses.Field, value: Any):
  """{name: (node, its config class or None)} of a child_map field, else None."""
  reg = map_registry(f)
  if reg is None or not isinstance(value, Mapping):
    return None
  return {name: (node, reg.entry(node["kind"]).config_cls
                 if _is_node(node) and node["kind"] in reg.kinds() else None)
          for name, node in value.items()}


def chosen(cfg: Any, schema: type) -> dict:
  """The choices of `cfg` (a ConfigDict or dict of the dataclass `schema`), nested."""
  node = _dict(cfg)
  fields = {f.name: f for f in dataclasses.fields(schema)}
  hints = typing.get_type_hints(schema)
  out = {}
  for name, value in node.items():
    f = fields.get(name)
    if f is None or name == "kind":  # a kind, or a key its owner reads (a component's weight)
      out[name] = value
      continue
    cls = _node_class(f, hints[name], value)
    items, named = _items(f, value), _named(f, value)
    if cls is not None:
      sub = chosen(value, cls)
      if sub or child_registry(f) is not None:
        out[name] = sub
    elif items is not None:
      out[name] = [chosen(item, c) if c is not None else item for item, c in items]
    elif named is not None:
      out[name] = {k: chosen(node, c) if c is not None else node for k, (node, c) in named.items()}
    elif _default(f) is _NONE or _plain(_default(f)) != _plain(value):
      out[name] = value
  return out


def with_defaults(choices: Any, schema: type, *, omit: tuple[str, ...] = ()) -> dict:
  """The resolved config whose choices are `choices`: every field of every node, the ones
  not chosen at their defaults (the inverse of `chosen`)."""
  node = _dict(choices)
  hints = typing.get_type_hints(schema)
  out = {}
  for f in dataclasses.fields(schema):
    name = f.name
    if name in omit:
      continue
    if name not in node:
      default = _default(f)
      if dataclasses.is_dataclass(hints[name]) and child_registry(f) is None:
        out[name] = with_defaults({}, hints[name])
      elif default is not _NONE:
        out[name] = default
      continue  # a required field that was not chosen stays absent
    value = node[name]
    cls = _node_class(f, hints[name], value)
    items, named = _items(f, value), _named(f, value)
    if cls is not None:
      out[name] = with_defaults(value, cls)
    elif items is not None:
      omitted = list_registry(f)[1]
      out[name] = [with_defaults(item, c, omit=omitted) if c is not None else item
                   for item, c in items]
    elif named is not None:
      out[name] = {k: with_defaults(node, c) if c is not None else node
                   for k, (node, c) in named.items()}
    else:
      out[name] = value
  out.update((k, v) for k, v in node.items() if k not in out and k not in omit)
  return out


def defaults(cfg: Any, schema: type) -> dict:
  """The defaults of `cfg`'s nodes: the tree of `cfg` with its kinds, every field that has a
  default at that default, and no required field (e.g. to tell whether a field that an older
  config lacks is new with its default; launcher/run_dir.py)."""
  out = with_defaults(_kinds(_dict(cfg), schema), schema)
  _drop_chosen_kinds(out, schema)
  return out


def _drop_chosen_kinds(node: dict, schema: type) -> None:
  """Removes the `kind` of each child node whose field names no default kind, or another one:
  that kind was chosen, so a config that lacks the node need not have had it."""
  fields = {f.name: f for f in dataclasses.fields(schema)}
  hints = typing.get_type_hints(schema)
  for name, value in node.items():
    f = fields.get(name)
    if f is None or name == "kind" or not isinstance(value, dict):
      continue
    for node, c in (_named(f, value) or {}).values():  # named nodes: each kind was chosen
      if c is not None and isinstance(node, dict):
        _drop_chosen_kinds(node, c)
        node.pop("kind", None)
    cls = _node_class(f, hints[name], value)
    if cls is None:
      continue
    _drop_chosen_kinds(value, cls)
    if child_registry(f) is not None and child_default_kind(f) != value.get("kind"):
      value.pop("kind", None)


def _kinds(node: dict, schema: type) -> dict:
  """Only the kinds of `node` and of its nodes, as choices."""
  fields = {f.name: f for f in dataclasses.fields(schema)}
  hints = typing.get_type_hints(schema)
  out = {}
  for name, value in node.items():
    f = fields.get(name)
    if f is None or name == "kind":
      out[name] = value
      continue
    cls = _node_class(f, hints[name], value)
    items, named = _items(f, value), _named(f, value)
    if cls is not None:
      out[name] = _kinds(value, cls)
    elif items is not None:
      out[name] = [_kinds(item, c) if c is not None else item for item, c in items]
    elif named is not None:
      out[name] = {k: _kinds(node, c) if c is not None else node
                   for k, (node, c) in named.items()}
  return out
