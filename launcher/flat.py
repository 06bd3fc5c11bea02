"""Flat `a.b.c: value` views of a config (--print_config, golden files, run-directory diffs)."""

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


def chosen_text(cfg) -> str:
  """The flat text of what a run config chooses (its kinds, required fields and values
  other than the defaults): a golden file."""
  from trainer.config import chosen  # pylint: disable=import-outside-toplevel
  return flat_text(chosen(cfg))


def human(n: int) -> str:
  """1234567 -> '1.23M'."""
  for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
    if n >= scale:
      return f"{n / scale:.2f}{unit}"
  return str(n)


def print_config_text(cfg, *, num_params: int, mesh: str, axes: dict, rule: str | None) -> str:
  """What --print_config prints: the flat config, the parameter count and the mesh."""
  return (flat_text(cfg) + f"# parameters: {num_params:,} ({human(num_params)})\n"
          f"# mesh: {mesh} {axes}{f' (rule {rule!r})' if rule else ''}\n")
