"""Flat `a.b.c: value` views of a config (for --print_config and golden files)."""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections


def flatten(cfg, prefix: str = "") -> dict:
  if isinstance(cfg, ml_collections.ConfigDict):
    cfg = cfg.to_dict()
  out = {}
  for key, value in cfg.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping) and value:
      out.update(flatten(value, path + "."))
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Mapping) for v in value):
      for i, item in enumerate(value):  # e.g. a mixture's components: data.sources[0].kind
        out.update(flatten(item, f"{path}[{i}]."))
    else:
      out[path] = value
  return out


def _show(value) -> str:
  if isinstance(value, float):
    return repr(value)
  if isinstance(value, (list, tuple)):
    return repr(tuple(value))
  return str(value)


def flat_text(cfg) -> str:
  return "".join(f"{k}: {_show(v)}\n" for k, v in sorted(flatten(cfg).items()))
