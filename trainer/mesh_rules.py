"""A config's mesh rules applied: the first rule of `mesh.rules` that matches the selected mesh
entry (trainer/mesh_match.py) sets its config paths, kind switches first, leaving alone what
the command line set.
"""

from __future__ import annotations

from core.registry import ConfigError, suggest
from trainer import config as config_lib
from trainer.mesh_match import check_rule, describe_match, matches
from trainer.meshes import Entry, lookup

# Fields that set the same thing another way: a rule leaves one alone when the command line set
# the other (a user's grad_accum_steps wins over a recipe's microbatch_rows).
ALTERNATIVES = {"trainer.microbatch_rows": "trainer.grad_accum_steps",
                "trainer.grad_accum_steps": "trainer.microbatch_rows"}


def _switch(cfg, node: str, kind, what: str) -> None:
  """A rule's `node.kind`: the node becomes `kind`'s, keeping the fields both kinds share."""
  try:
    config_lib.switch_kind(cfg, node, kind)
  except (KeyError, AttributeError, ValueError, ConfigError) as e:
    raise ConfigError(f"mesh rule '{what}': {node}.kind={kind!r}: "
                      f"{' '.join(str(e).split())}") from None


def apply_rules(cfg, entry: Entry | str, explicit: set[str]) -> str | None:
  """Applies the first of `cfg.mesh.rules` that matches `entry` (an Entry, or a name that
  `lookup` knows); returns that rule's match in words (describe_match), else None.

  A rule matches by the entry's name (a regex, which must match all of it) or by what the
  hardware is (MATCH_FACTS: platform, devices per host, hosts, devices, HBM per device).
  `cfg` is the run's ConfigDict; paths in `explicit` (command-line overrides) are left as set.
  """
  from ml_collections.config_flags import config_path  # pylint: disable=import-outside-toplevel
  if isinstance(entry, str):
    entry = lookup(entry)
  rules = cfg.mesh.rules
  if not isinstance(rules, (tuple, list)):
    raise ConfigError(f"mesh.rules must be a tuple of (match, {{path: value}}) pairs, got "
                      f"{rules!r:.80}")
  for i, rule in enumerate(rules):
    check_rule(i, rule)
  for match, changes in rules:
    if not matches(match, entry):
      continue
    what = describe_match(match)
    # Kind switches first, parents before children, as on the command line; a switch of a
    # component the command line configured (its kind or any field under it) is left out.
    for path in sorted((p for p in changes if p.endswith(".kind")), key=lambda p: p.count(".")):
      node = path[:-len(".kind")]
      if not any(e == node or e.startswith(f"{node}.") for e in explicit):
        _switch(cfg, node, changes[path], what)
    for path, value in changes.items():
      if path.endswith(".kind") or path in explicit or ALTERNATIVES.get(path) in explicit:
        continue
      try:
        config_path.set_value(path, cfg, value)
      except (KeyError, AttributeError, IndexError):
        parent, _, leaf = path.rpartition(".")
        try:
          keys = list(config_path.get_value(parent, cfg).keys()) if parent else list(cfg.keys())
        except (KeyError, AttributeError, IndexError):
          keys = []
        raise ConfigError(f"mesh rule '{what}': unknown key '{path}'{suggest(leaf, keys)}"
                          ) from None
      except (TypeError, ValueError) as e:
        raise ConfigError(f"mesh rule '{what}': {path}={value!r}: {' '.join(str(e).split())}"
                          ) from None
    return what
  return None
