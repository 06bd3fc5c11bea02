"""Dotted paths in a config (`model.block.ffn.hidden_dim`): get, set, and switch a node's kind.

One walker serves the command line's overrides, the mesh rules and config files,
so every unknown key is reported the same way (core/registry.py:unknown_field, which config
files' nodes get too): the key, where, its kind in a component node, a did-you-mean (the whole
paths of fields of that name elsewhere in the config, else a close name there) and the fields
there.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import ml_collections

from core.registry import (ConfigError, Registry, child_registry, map_registry, suggest,
                           unknown_field)


def _keys(node: Any) -> list[str]:
  return list(node.keys()) if isinstance(node, (ml_collections.ConfigDict, dict)) else []


def _unknown(part: str, node: Any, walked: list[str], root: Any) -> str:
  keys = _keys(node)
  return unknown_field(part, ".".join(walked), keys, kind=node["kind"] if "kind" in keys else None,
                       elsewhere=named(root, part, near=walked))


def named(root: Any, key: str, *, near: list[str] = ()) -> list[str]:
  """The dotted paths in `root` whose last key is `key`: those below `near` first, then the
  shortest."""
  found = []
  def walk(node, prefix):
    for k in _keys(node):
      if k == key:
        found.append(prefix + [k])
      walk(node[k], prefix + [k])
  walk(root, [])
  found.sort(key=lambda p: (p[:len(near)] != list(near), len(p), p))
  return [".".join(p) for p in found]


def parent_of(cfg: ml_collections.ConfigDict, path: str) -> tuple[ml_collections.ConfigDict, str]:
  """(node holding the last key, last key) of `path`; ConfigError when a key is unknown."""
  parts = path.split(".")
  node, walked = cfg, []
  for i, part in enumerate(parts):
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      raise ConfigError(f"'{'.'.join(walked)}' is a value, not a section")
    if part not in _keys(node):
      raise ConfigError(_unknown(part, node, walked, cfg))
    if i == len(parts) - 1:
      return node, part
    node = node[part]
    walked.append(part)
  raise ConfigError("empty config path")


def get_path(cfg: ml_collections.ConfigDict, path: str) -> Any:
  node, key = parent_of(cfg, path)
  return node[key]


def set_path(cfg: ml_collections.ConfigDict, path: str, value: Any) -> None:
  """Sets an existing field; ConfigError names the path when the key or type is wrong."""
  node, key = parent_of(cfg, path)
  try:
    node[key] = value
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{path}={value!r}: {' '.join(str(e).split())}") from None


def switch_kind(cfg: ml_collections.ConfigDict, path: str, kind: str, *, schema: type,
                dropped: dict | None = None, **values) -> ml_collections.ConfigDict:
  """Replaces the component node at `path` by `kind`'s node (Registry.switched); returns it.

  `schema` is the dataclass of `cfg` (e.g. trainer.config.RunConfig); the registry of
  each node on the way comes from its parent's `child()` field (or `child_map()` field, whose
  nodes are named by the next part of the path), so this works for every registry without
  knowing any of them. `dropped`, if given, receives {path.field: NotCarried} for the old
  node's changed fields that the switch does not carry (Registry.not_carried).
  """
  parts = path.split(".")
  for i, (node, part, reg, _) in enumerate(_walk(cfg, parts, schema)):
    if i < len(parts) - 1:
      continue
    where = ".".join(parts)
    if reg is None:
      raise ConfigError(f"{where}.kind: {where} is not a component with a kind")
    reg.entry(kind, path=where)  # an unknown kind is reported with its path
    if dropped is not None:
      dropped.update({f"{where}.{d.name}": d for d in reg.not_carried(node[part], kind)})
    new = reg.switched(node[part], kind, **values)
    node[part] = new
    return new
  raise ConfigError("empty config path")


def field_at(cfg: ml_collections.ConfigDict, path: str, *,
             schema: type) -> dataclasses.Field | None:
  """The dataclass field that `path` names in `cfg` (whose dataclass is `schema`), or None when
  a part of the path is not a field of a known node (an unknown key, a value's member, a named
  node of a `child_map()` field)."""
  parts = path.split(".")
  try:
    for i, (_, _, _, f) in enumerate(_walk(cfg, parts, schema)):
      if i == len(parts) - 1:
        return f
  except ConfigError:
    return None
  return None


def _walk(cfg: Any, parts: list[str], schema: type):
  """(node holding the part, part, registry of the node at the part or None, its dataclass field
  or None for a named node of a map) for each part of a path, walking down from `cfg` (of
  dataclass `schema`); ConfigError (`<path so far>.kind: ...`, as a kind switch reports it)
  where a part is unknown or a value."""
  node: Any = cfg
  named = None  # the registry of the `child_map()` node we are in: its keys are names
  for i, part in enumerate(parts):
    where = ".".join(parts[:i + 1])
    if named is not None:
      if part not in _keys(node):
        raise ConfigError(f"{where}.kind: " + _unknown(part, node, parts[:i], cfg))
      reg, f, hint = named, None, None
    else:
      fields = {f.name: f for f in dataclasses.fields(schema)}
      if part not in fields or part not in _keys(node):
        raise ConfigError(f"{where}.kind: " + _unknown(part, node, parts[:i], cfg))
      f = fields[part]
      reg, hint = child_registry(f), typing.get_type_hints(schema)[part]
    yield node, part, reg, f
    node = node[part]
    named = map_registry(f) if f is not None else None
    if named is not None:
      if not isinstance(node, ml_collections.ConfigDict):
        raise ConfigError(f"{where}: expected named {named.name} nodes")
      continue
    if i < len(parts) - 1:
      schema = _schema(reg, hint, node, where)


def _schema(reg: Registry | None, hint: Any, node: Any, where: str) -> type:
  if reg is not None:
    if not isinstance(node, ml_collections.ConfigDict) or "kind" not in node:
      raise ConfigError(f"{where}: expected a {reg.name} node with a 'kind' field")
    return reg.entry(node["kind"], path=where).config_cls
  if dataclasses.is_dataclass(hint) and isinstance(node, ml_collections.ConfigDict):
    return hint
  raise ConfigError(f"'{where}' is a value, not a section")
