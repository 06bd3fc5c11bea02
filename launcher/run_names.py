"""The default run directory of a command: named from the values its overrides resolve to.

    runs/<config stem>[_<arg>]/base/                       no override names a directory
    runs/<config stem>[_<arg>]/<key=value,...>/            the overrides that do, sorted by key

One run, one directory: `learning_rate=2e-3` and `learning_rate=0.002` both name
`optimizer.learning_rate=0.002` (the value as Python writes it), and an override that sets what
the config file already holds (`--config.optimizer.kind=adamw` on an AdamW config) names nothing.
Nor does an override that leaves the run the same run (launcher/run_dir.py:names_directory):
trainer.max_steps (raised, it extends the run, so `--config.trainer.max_steps=40` finds the run
to extend), the mesh's axes and what else says where and how the steps run (PLACEMENT), and
how the run is logged and checkpointed (BOOKKEEPING). A run directory named under an earlier
rule (from the override text as typed, or with such overrides in its name) is still found by
the same command (`choose`).
"""

from __future__ import annotations

import hashlib
import pathlib
import re

from core import paths
from launcher.errors import ConfigError, UserError
from launcher.flat import flatten
from launcher.folders import is_run
from launcher.run_dir import RunDir, names_directory

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


def name(config_path: str, effective: list[tuple[str, str]]) -> pathlib.Path:
  """The directory that `effective` (effective_overrides) names: from its overrides that name
  one (launcher/run_dir.py:names_directory)."""
  return default_dir(config_path, [(k, v) for k, v in effective if names_directory(k)])


def choose(config_path: str, items: list[tuple[str, str]],
           effective: list[tuple[str, str]]) -> pathlib.Path:
  """The run directory of a command: named from the overrides in `effective` that name one.

  A directory that an earlier axtrain named for the same run is still found, if it holds one:
  the name from all of `effective` (before max_steps, the mesh, ... stopped naming directories),
  else a sibling named from this command's overrides and its own values of such fields (a run
  named `trainer.max_steps=20` is extended by `--config.trainer.max_steps=40`), else, if the new
  name does not exist, the name from the override text as typed (before values were resolved).
  More than one such run: UserError naming them.
  """
  named_items = [(k, v) for k, v in effective if names_directory(k)]
  named = name(config_path, effective)
  earlier = default_dir(config_path, effective)
  if earlier != named:  # the command sets fields that named directories under the earlier rule
    if is_run(earlier):
      return earlier
    found = _named_earlier(config_path, named_items, named) + ([named] if named.exists() else [])
    if len(found) > 1:
      raise UserError(f"{named.parent} holds {len(found)} runs that this command continues ("
                      f"{', '.join(p.name for p in found)}; trainer.max_steps and the mesh name "
                      f"no directory now); give --output_dir=<one of them>")
    if found:
      return found[0]
  typed = default_dir(config_path, items)
  if typed != named and not named.exists() and is_run(typed):
    return typed
  return named


def _named_earlier(config_path: str, named_items: list[tuple[str, str]],
                   named: pathlib.Path) -> list[pathlib.Path]:
  """Runs beside `named` whose name is `named_items` plus fields that name no directory now
  (trainer.max_steps, mesh axes, ...): the same run, named under the earlier rule. The values
  are read from the name: the run may have been extended or moved since."""
  folder = named.parent
  out = []
  for sibling in sorted(folder.iterdir()) if folder.is_dir() else []:
    if sibling == named or not is_run(sibling):
      continue
    keys = {k for k, _ in named_items} | set(flatten(RunDir(sibling).stored_config() or {}))
    parts = _components(sibling.name, {_UNSAFE.sub("_", k) for k in keys})
    extra = [(k, v) for k, v in parts.items() if not names_directory(k)]
    if extra and default_dir(config_path, named_items + extra) == sibling:
      out.append(sibling)
  return out


def _components(text: str, keys: set[str]) -> dict[str, str]:
  """{key: value text} of a directory name `k1=v1,k2=v2` written by default_dir, splitting only
  where one of `keys` begins (a value may hold commas); {} if the name is not of that form."""
  starts = [(0, k) for k in keys if text.startswith(f"{k}=")]
  for k in keys:
    at = text.find(f",{k}=")
    while at >= 0:
      starts.append((at + 1, k))
      at = text.find(f",{k}=", at + 1)
  starts.sort()
  if not starts or starts[0][0] != 0:
    return {}
  ends = [at - 1 for at, _ in starts[1:]] + [len(text)]
  return {k: text[at + len(k) + 1:end] for (at, k), end in zip(starts, ends)}


def directory(config_value: str, items: list[tuple[str, str]], *, resolved,
              mesh: str | None) -> pathlib.Path:
  """The default run directory of `--config=config_value` with overrides `items`, whose config
  resolved to `resolved` under the mesh entry named `mesh` (its rule applied; None: no rule).
  Training (launcher/session.py) and `axtrain launch` name the same directory through this."""
  from launcher import config_loading  # pylint: disable=import-outside-toplevel
  from trainer import mesh_rules  # pylint: disable=import-outside-toplevel
  base = config_loading.load(config_value)  # the file's own values, under the same mesh rule
  if mesh is not None:
    mesh_rules.apply_rules(base, mesh, set())
  return choose(config_value, items, effective_overrides(items, resolved=resolved, base=base))
