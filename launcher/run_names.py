"""The default run directory of a command: named from the values its overrides resolve to.

    runs/<config stem>[_<arg>]/base/                       no override changes a value
    runs/<config stem>[_<arg>]/<key=value,...>/            the overrides that do, sorted by key

One config, one directory: `learning_rate=2e-3` and `learning_rate=0.002` both name
`optimizer.learning_rate=0.002` (the value as Python writes it), and an override that sets what
the config file already holds (`--config.optimizer.kind=adamw` on an AdamW config) names nothing.
A run directory named before this rule (from the override text as typed) is still found by the
same command (`choose`).
"""

from __future__ import annotations

import hashlib
import pathlib
import re

from core import paths
from launcher.errors import ConfigError
from launcher.folders import is_run

BASE = "base"  # the directory of a run without overrides (an override name always holds '=')
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def default_dir(config_path: str, overrides: list[tuple[str, str]]) -> pathlib.Path:
  """`runs/tiny/base` or `runs/tiny/data.seq_len=32,trainer.max_steps=200`.

  The name lists the overrides sorted by key (the last value of a repeated key
  wins, as in the config), so flag order does not make another run.
  """
  path, _, arg = config_path.partition(":")
  out = pathlib.Path("runs") / _UNSAFE.sub("_", pathlib.Path(path).stem + (f"_{arg}" if arg else ""))
  if not overrides:
    return out / BASE
  slug = _UNSAFE.sub("_", ",".join(f"{k}={v}" for k, v in sorted(dict(overrides).items())))
  if len(slug) > 150:
    slug = slug[:120] + "-" + hashlib.sha1(slug.encode()).hexdigest()[:10]
  return out / slug


def value_text(value) -> str:
  """One spelling per value: floats as repr (2e-3 -> 0.002), sequences as tuples."""
  if isinstance(value, (list, tuple)):
    return repr(tuple(value))
  return repr(value) if isinstance(value, float) else str(value)


def _get(cfg, path: str):
  try:
    return True, paths.get_path(cfg, path)
  except ConfigError:
    return False, None


def effective_overrides(items: list[tuple[str, str]], *, resolved, base) -> list[tuple[str, str]]:
  """[(path, value_text)] of the overrides `items` whose resolved value differs from the config
  file's own (`base`, with the same mesh rule applied). A field below a node whose kind an
  override changed always counts: the new kind's defaults are not the file's values."""
  last = dict(items)
  switched = [p[:-len(".kind")] for p in last if p.endswith(".kind")
              and _get(base, p) != _get(resolved, p)]
  out = []
  for path in last:
    found, value = _get(resolved, path)
    if not found:
      continue  # refused before a directory is named
    below_switch = any(path.startswith(node + ".") and path != node + ".kind"
                       for node in switched)
    if not below_switch and _get(base, path) == (True, value):
      continue
    out.append((path, value_text(value)))
  return out


def choose(config_path: str, items: list[tuple[str, str]],
           effective: list[tuple[str, str]]) -> pathlib.Path:
  """The run directory of a command: named from `effective`; if that does not exist but the
  directory named from the override text as typed (before values were resolved) holds a run,
  that one, so that an existing run resumes with its own command."""
  named = default_dir(config_path, effective)
  typed = default_dir(config_path, items)
  if typed != named and not named.exists() and is_run(typed):
    return typed
  return named


def directory(config_value: str, items: list[tuple[str, str]], *, resolved,
              mesh: str | None) -> pathlib.Path:
  """The default run directory of `--config=config_value` with overrides `items`, whose config
  resolved to `resolved` under the mesh entry named `mesh` (its rule applied; None: no rule).
  Training (launcher/session.py) and `axtrain launch` name the same directory through this."""
  from launcher import config_loading  # pylint: disable=import-outside-toplevel
  from trainer import meshes  # pylint: disable=import-outside-toplevel
  base = config_loading.load(config_value)  # the file's own values, under the same mesh rule
  if mesh is not None:
    meshes.apply_rules(base, mesh, set())
  return choose(config_value, items, effective_overrides(items, resolved=resolved, base=base))
