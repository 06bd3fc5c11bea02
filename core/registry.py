"""Registries of components, and typed config nodes checked at the boundary.

A component is a config dataclass plus the thing it builds (a flax module, an
optax transform, a data source...). Each kind of component has its own
`Registry`; a config node names its entry with `kind`:

    ATTENTION = Registry("attention")

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class AttentionConfig:
      kind: str = "attention"
      num_heads: int = REQUIRED
      position: Any = child("position")     # a node of another registry

    @ATTENTION.register("attention", AttentionConfig)
    class Attention(nn.Module): ...

A field may also hold named nodes of a registry, {name: node} (`child_map`: a block group's
blocks), each reached by its name in a dotted path.

`Registry.node(kind)` gives a ConfigDict with every field of `kind` (config
files start from it), `Registry.switched(node, kind)` replaces a node by another
kind's, carrying over the fields that both kinds declare shared (core/paths.py:switch_kind
does it at a dotted path, which is what `--config.<path>.kind=K` runs).
`Registry.parse` turns a ConfigDict node into the frozen dataclass (unknown,
missing or mistyped fields raise `ConfigError` naming the path), and
`Registry.build(cfg, **inputs)` constructs the component after its config's
optional `check(**inputs)` has validated cross-field constraints. `inputs`
are what the parent hands the child (e.g. the model width), never more.

A config class says which of its fields mean the same thing in its registry's other kinds
with `SHARED: ClassVar = ("name", ...)` (inherited like any class attribute); a kind switch
carries a field only when both kinds list it, or both hold it as a `child()` of the same
registry (a switch to the node's own kind keeps every field). `learning_rate` is shared by
every optimizer; `b2` is not (its default and role differ between kinds), so a switch gives
the new kind's own default.
"""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

REQUIRED: Any = dataclasses.MISSING
_REGISTRY_KEY = "axtrain_registry"
_DEFAULT_KIND_KEY = "axtrain_default_kind"
_LIST_KEY = "axtrain_list_of"
_MAP_KEY = "axtrain_map_of"
_OMIT_KEY = "axtrain_list_omits"
_HOW_KEY = "axtrain_how_to_set"


class ConfigError(ValueError):
  """A user mistake in a config. The CLI prints it as one `axtrain: error:` line."""


def suggest(name: str, choices) -> str:
  """' (did you mean 'x'?)' when a close match exists, else ''."""
  close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
  return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_field(key: str, where: str, fields, *, kind: str | None = None,
                  elsewhere: list[str] = ()) -> str:
  """How every unknown config key is told, on the command line or in a config file: the key,
  the node (and its kind), a did-you-mean and the node's fields. `elsewhere`: the full paths
  of fields named `key` in other nodes of the config, which the did-you-mean names first when
  they are few (a name that many nodes have, `kind`, points nowhere in particular)."""
  if 0 < len(elsewhere) <= 3:
    shown = ", ".join(f"'{p}'" for p in elsewhere)
    hint = f" (did you mean {'one of ' if len(elsewhere) > 1 else ''}{shown}?)"
  else:
    hint = suggest(key, fields)
  return (f"unknown field '{key}' of {where or 'the config'}"
          + (f" (kind '{kind}')" if kind is not None else "") + hint
          + f"; its fields: {', '.join(sorted(fields))}")


def child(registry: str, default: Any = REQUIRED, *, kind: str | None = None,
          how: str = "") -> Any:
  """Declares a config field that holds a child node of `registry`.

  `kind`: the child's default kind; `node()` then fills the field with that kind's node.
  `default=None`: an optional child, off unless a config turns it on (`--config.<path>.kind=K`)
  and switched off again with `--config.<path>=None`. `how`: how to set a required child,
  for the message when it is None (a kind switch carries None from an optional child).
  """
  kwargs: dict[str, Any] = {"metadata": {_REGISTRY_KEY: registry, _DEFAULT_KIND_KEY: kind,
                                         _HOW_KEY: how}}
  if default is not REQUIRED:
    kwargs["default"] = default
  return dataclasses.field(**kwargs)


def child_list(registry: str, *, omit: tuple[str, ...] = (), how: str = "") -> Any:
  """Declares a required field holding a tuple of `registry` nodes, each without the fields
  in `omit` (the owner supplies them) and with any extra keys the owner reads (a mixture's
  components: data nodes without seq_len and batch_size, each with a weight). `how`: how
  to set it, for the message when it is missing (a tuple of nodes is no command-line value)."""
  return dataclasses.field(metadata={_LIST_KEY: registry, _OMIT_KEY: tuple(omit),
                                     _HOW_KEY: how})


def child_map(registry: str, *, how: str = "") -> Any:
  """Declares a required field holding named nodes of `registry`, {name: node}: each is set by
  its name in a dotted path (`model.block.blocks.local.attention.num_heads`) and switched with
  `--config.<path>.<name>.kind=K` like any child. Parsed as a tuple of (name, config) pairs in
  name order (`members`), so that the config stays hashable. `how`: how to set it, for the
  message when it is missing."""
  return dataclasses.field(metadata={_MAP_KEY: registry, _HOW_KEY: how})


def map_registry(f: dataclasses.Field) -> Registry | None:
  """The registry of a `child_map()` field, else None."""
  name = f.metadata.get(_MAP_KEY)
  return None if name is None else _ALL[name]


def members(pairs: Any) -> dict[str, Any]:
  """{name: config} of a parsed `child_map()` field."""
  return dict(pairs)


def child_registry(f: dataclasses.Field) -> Registry | None:
  """The registry of a `child()` field, else None."""
  name = f.metadata.get(_REGISTRY_KEY)
  return None if name is None else _ALL[name]


def list_registry(f: dataclasses.Field) -> tuple[Registry, tuple[str, ...]] | None:
  """(registry, omitted fields) of a `child_list()` field, else None."""
  name = f.metadata.get(_LIST_KEY)
  return None if name is None else (_ALL[name], f.metadata[_OMIT_KEY])


def optional_child(f: dataclasses.Field) -> bool:
  """Whether `f` is a child field that may be None (off)."""
  return child_registry(f) is not None and f.default is None


def child_default_kind(f: dataclasses.Field) -> str | None:
  """The default kind of a `child()` field (None: the field names none)."""
  return f.metadata.get(_DEFAULT_KIND_KEY)


def shared_fields(cls: type) -> frozenset[str]:
  """The fields of config class `cls` that mean the same in the other kinds that share them:
  its `SHARED` names, and its `child()` fields."""
  fields = _fields(cls)
  declared = {n for n in getattr(cls, "SHARED", ()) if n in fields}
  return frozenset(declared | {n for n, f in fields.items()
                               if child_registry(f) is not None or map_registry(f) is not None})


_ALL: dict[str, Registry] = {}


def registry(name: str) -> Registry:
  """The registry called `name` (they register themselves on creation)."""
  return _ALL[name]


_ABSENT: Any = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class NotCarried:
  """A field that a kind switch leaves behind although the config had changed it."""
  name: str
  value: Any
  new_default: Any = _ABSENT  # the new kind's own default for a same-named field, else _ABSENT

  @property
  def has_field(self) -> bool:
    return self.new_default is not _ABSENT


@dataclasses.dataclass(frozen=True)
class Component:
  kind: str
  config_cls: type
  target: Any  # what `build` constructs: a module class or a factory function


class Registry:
  """One registry per kind of component: short names, duplicates refused."""

  def __init__(self, name: str):
    if name in _ALL:
      raise ValueError(f"registry {name!r} exists already")
    self.name = name
    self._entries: dict[str, Component] = {}
    _ALL[name] = self

  def register(self, kind: str, config_cls: type) -> Callable[[Any], Any]:
    if not dataclasses.is_dataclass(config_cls):
      raise TypeError(f"{config_cls} is not a dataclass")

    def decorator(target):
      if kind in self._entries:
        raise ValueError(f"{self.name} kind {kind!r} registered twice")
      self._entries[kind] = Component(kind, config_cls, target)
      return target

    return decorator

  def kinds(self) -> list[str]:
    return sorted(self._entries)

  def entry(self, kind: str, *, path: str = "") -> Component:
    if kind not in self._entries:
      where = f"{path}.kind" if path else f"{self.name} kind"
      raise ConfigError(
          f"{where}: unknown {self.name} kind '{kind}'{suggest(kind, self._entries)};"
          f" registered: {', '.join(self.kinds())}")
    return self._entries[kind]

  # -- config nodes ---------------------------------------------------------

  def node(self, kind: str, **values) -> ml_collections.ConfigDict:
    """A ConfigDict with every field of `kind`, defaults filled in.

    Config files call this so that every option is visible (and overridable)
    in the resolved config. Child fields must be given as nodes unless the
    field names a default kind (`child(..., kind=...)`).
    """
    return self._node(self.entry(kind), values, partial=False)

  def switched(self, old: Any, kind: str, **values) -> ml_collections.ConfigDict:
    """`kind`'s node in place of `old`: each field of `old` that both kinds share
    (`shared_fields`: same name, same meaning, value valid for `kind`) is carried over,
    `values` are set, the rest of `kind`'s fields take their defaults and `old`'s other
    fields are dropped (`not_carried` lists those that the config had changed).

    A required field that nothing sets becomes a typed placeholder (None), which
    `parse` reports as missing unless an override sets it. `old` may be None.
    """
    component = self.entry(kind)
    return self._node(component, {**self._carried(old, component), **values}, partial=True)

  def _carried(self, old: Any, component: Component) -> dict[str, Any]:
    old_cls = self._config_cls_of(old)
    if old_cls is None:
      return {}
    fields = _fields(component.config_cls)
    hints = typing.get_type_hints(component.config_cls)
    both = (set(fields) - {"kind"} if old.get("kind") == component.kind
            else shared_fields(old_cls) & shared_fields(component.config_cls))
    return {name: value for name, value in old.items()
            if name in both and _valid(fields[name], hints[name], value)}

  def _config_cls_of(self, node: Any) -> type | None:
    if not isinstance(node, (Mapping, ml_collections.ConfigDict)):
      return None
    kind = node.get("kind")
    return self._entries[kind].config_cls if kind in self._entries else None

  def not_carried(self, old: Any, kind: str) -> list[NotCarried]:
    """The fields of `old` that `switched(old, kind)` does not carry although the config
    changed them from the old kind's defaults ([] when `old` is not a node of this registry)."""
    old_cls = self._config_cls_of(old)
    if old_cls is None:
      return []
    component = self.entry(kind)
    default = self._node(self.entry(old["kind"]), {}, partial=True).to_dict()
    new_default = self._node(component, {}, partial=True).to_dict()
    carried = self._carried(old, component)
    out = []
    for name, value in old.items():
      plain = value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value
      if name != "kind" and name not in carried and plain != default.get(name):
        out.append(NotCarried(name, plain, new_default.get(name, _ABSENT)))
    return out

  def _node(self, component: Component, values: dict, *, partial: bool):
    kind = component.kind
    fields = {n: f for n, f in _fields(component.config_cls).items() if n != "kind"}
    hints = typing.get_type_hints(component.config_cls)
    for key in values:
      if key not in fields:
        raise ConfigError(f"{self.name} '{kind}' has no field '{key}'{suggest(key, fields)};"
                          f" fields: {', '.join(sorted(fields))}")
    out: dict[str, Any] = {"kind": kind}
    for name, f in fields.items():
      default_kind = f.metadata.get(_DEFAULT_KIND_KEY)
      if name in values:
        out[name] = _placeholder_or(hints[name], values[name])
      elif f.default is not dataclasses.MISSING:
        out[name] = _placeholder_or(hints[name], f.default)
      elif f.default_factory is not dataclasses.MISSING:
        out[name] = f.default_factory()
      elif default_kind is not None:
        out[name] = child_registry(f).node(default_kind)
      elif partial:
        out[name] = _placeholder_or(hints[name], None)
      else:
        raise ConfigError(f"{self.name} '{kind}': field '{name}' is required")
    return ml_collections.ConfigDict(out)

  def parse(self, node: Any, path: str) -> Any:
    """Checks `node` against its kind's fields; returns the frozen config."""
    if isinstance(node, ml_collections.ConfigDict):
      node = node.to_dict()
    if not isinstance(node, Mapping) or "kind" not in node:
      raise ConfigError(f"{path}: expected a {self.name} node with a 'kind' field")
    entry = self.entry(node["kind"], path=path)
    return parse_dataclass(entry.config_cls, node, path, what=f"{self.name} '{entry.kind}'")

  def build(self, cfg: Any, *, name: str | None = None, **inputs) -> Any:
    """Constructs the component for a parsed config, after `cfg.check(**inputs)`.

    `name` is passed through to flax modules (their parameter scope).
    """
    entry = self.entry(cfg.kind)
    check = getattr(cfg, "check", None)
    if check is not None:
      check(**inputs)
    if name is not None:
      inputs["name"] = name
    return entry.target(cfg=cfg, **inputs)


def _fields(cls: type) -> dict[str, dataclasses.Field]:
  return {f.name: f for f in dataclasses.fields(cls)}


def _valid(f: dataclasses.Field, tp: Any, value: Any) -> bool:
  """Whether `value` may fill field `f` (of type `tp`) of another kind's node."""
  reg = child_registry(f)
  if reg is not None:
    return value is None or _is_node_of(reg, value)
  reg = map_registry(f)
  if reg is not None:
    return value is None or (isinstance(value, (Mapping, ml_collections.ConfigDict))
                             and all(_is_node_of(reg, v) for v in value.values()))
  try:
    check_type(value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value, tp, "")
  except ConfigError:
    return False
  return True


def _is_node_of(reg: Registry, value: Any) -> bool:
  return (isinstance(value, (Mapping, ml_collections.ConfigDict))
          and value.get("kind") in reg.kinds())


def _placeholder_or(tp: Any, default: Any) -> Any:
  """A None default becomes a typed placeholder so that overrides type-check."""
  if default is not None:
    return default
  base = _optional_base(tp)
  if base in (int, float, str, bool):
    return ml_collections.config_dict.placeholder(base)
  return None


def _optional_base(tp: Any) -> Any:
  origin = typing.get_origin(tp)
  if origin in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 else tp
  return tp


def parse_dataclass(cls: type, node: Mapping, path: str, *, what: str) -> Any:
  """Builds frozen dataclass `cls` from `node`, checking names and types."""
  hints = typing.get_type_hints(cls)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  for key in node:
    if key not in fields:
      raise ConfigError(f"{_join(path, key)}: " + unknown_field(key, path, fields,
                                                                kind=node.get("kind")))
  values = {}
  for name, f in fields.items():
    sub = _join(path, name)
    if name not in node or (node[name] is None and f.default is REQUIRED
                            and f.default_factory is dataclasses.MISSING):
      if f.default is REQUIRED and f.default_factory is dataclasses.MISSING:
        how = f.metadata.get(_HOW_KEY) or f"set --config.{sub}=..."
        raise ConfigError(f"{sub}: required field of {what} is missing ({how})")
      continue
    value = node[name]
    reg = child_registry(f)
    if reg is not None:
      values[name] = None if value is None else reg.parse(value, sub)
    elif map_registry(f) is not None:
      values[name] = _parse_map(map_registry(f), value, sub)
    else:
      values[name] = check_type(value, hints[name], sub)
  return cls(**values)


def _parse_map(reg: Registry, value: Any, path: str) -> tuple[tuple[str, Any], ...]:
  """A `child_map()` field's nodes, parsed: ((name, config), ...) in name order."""
  if not isinstance(value, Mapping) or not value:
    raise ConfigError(f"{path}: expected named {reg.name} nodes {{name: node, ...}}, got "
                      f"{value!r}")
  for name in value:
    if not (isinstance(name, str) and name.isidentifier()) or keyword.iskeyword(name):
      raise ConfigError(f"{path}: {name!r} is no name for a {reg.name} node (letters, digits "
                        f"and _, not first a digit, and no Python keyword: --config.{path}.NAME "
                        f"must reach it)")
  return tuple((name, reg.parse(value[name], _join(path, name))) for name in sorted(value))


def _join(path: str, name: str) -> str:
  return f"{path}.{name}" if path else name


def check_type(value: Any, tp: Any, path: str) -> Any:
  """Returns `value` converted to `tp` where that is lossless, else ConfigError."""
  if tp is Any:
    return value
  origin = typing.get_origin(tp)
  if origin in (typing.Union, types.UnionType):
    args = typing.get_args(tp)
    if value is None and type(None) in args:
      return None
    errors = []
    for arg in args:
      if arg is type(None):
        continue
      try:
        return check_type(value, arg, path)
      except ConfigError as e:
        errors.append(str(e))
    raise errors[0] if len(errors) == 1 else ConfigError(
        f"{path}: {value!r} is not one of {_type_name(tp)}")
  if origin is typing.Literal:
    choices = typing.get_args(tp)
    if value not in choices:
      raise ConfigError(f"{path}: '{value}' is not one of {', '.join(map(str, choices))}"
                        f"{suggest(value, choices)}")
    return value
  if origin in (tuple, list) or tp in (tuple, list):  # JSON gives lists for tuples
    if not isinstance(value, (tuple, list)):
      raise ConfigError(f"{path}: expected a sequence, got {value!r}")
    args = typing.get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
      return tuple(check_type(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if origin is tuple and args and len(args) != len(value):
      raise ConfigError(f"{path}: expected {len(args)} items, got {len(value)}")
    if args:
      return tuple(check_type(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    return tuple(value)
  if origin is dict or tp is dict:
    if not isinstance(value, Mapping):
      raise ConfigError(f"{path}: expected a mapping, got {value!r}")
    return dict(value)
  if tp is bool:
    if isinstance(value, bool):
      return value
  elif tp is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
  elif tp is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
  elif tp is str:
    if isinstance(value, str):
      return value
  elif isinstance(value, tp):
    return value
  raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")


def _type_name(tp: Any) -> str:
  return getattr(tp, "__name__", str(tp))
