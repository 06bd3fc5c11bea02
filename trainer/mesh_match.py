"""What a mesh rule matches: the selected entry's name (a regex of all of it) or facts of its
hardware, so that a new entry of the same hardware takes the same recipe.

A config's `mesh.rules` is `((match, {config.path: value}), ...)`; `check_rule` checks each
when the config is parsed (trainer/config.py:MeshConfig), `matches` tells whether one holds of
an entry, and trainer/mesh_rules.py applies the first that does.
"""

from __future__ import annotations

import re

from core.registry import ConfigError, suggest
from trainer.meshes import GB, Entry

# What a mesh rule may match besides the entry's name: facts of the hardware, so that a new
# entry of the same kind (another 8-GPU host with as much memory) takes the same recipe.
# Each number matches exactly, or as a bound with a `min_`/`max_` prefix.
MATCH_FACTS = {
    "platform": lambda e: e.hardware.platform,
    "devices_per_host": lambda e: e.hardware.devices_per_host,
    "num_hosts": lambda e: e.num_hosts,
    "num_devices": lambda e: e.num_devices,
    "hbm_gb": lambda e: None if e.hardware.hbm_bytes is None else e.hardware.hbm_bytes / GB,
    # Host RAM per device (Hardware.host_memory_bytes): room for host offload.
    "host_memory_gb": lambda e: (None if e.hardware.host_memory_bytes is None
                                 else e.hardware.host_memory_bytes / GB),
}
MATCH_KEYS = ("name", "platform", *(f"{p}{k}" for k in MATCH_FACTS if k != "platform"
                                    for p in ("", "min_", "max_")))


def check_rule(i: int, rule) -> None:
  """A mesh rule is (match, {config.path: value}); match is a name regex or {fact: value}."""
  shape = "(regex or {fact: value, ...}, {path: value, ...})"
  if not isinstance(rule, (tuple, list)) or len(rule) != 2 or not hasattr(rule[1], "items"):
    raise ConfigError(f"mesh.rules[{i}] must be {shape}, got {rule!r:.80}")
  match = rule[0]
  if isinstance(match, str):
    return
  if not hasattr(match, "items") or not match:
    raise ConfigError(f"mesh.rules[{i}] must be {shape}, got {rule!r:.80}")
  for key, value in match.items():
    if key not in MATCH_KEYS:
      raise ConfigError(f"mesh.rules[{i}]: unknown fact '{key}'{suggest(key, MATCH_KEYS)}; "
                        f"facts: {', '.join(MATCH_KEYS)}")
    text = key in ("name", "platform")
    if text != isinstance(value, str) or isinstance(value, bool):
      raise ConfigError(f"mesh.rules[{i}]: {key}={value!r} must be "
                        f"{'a string' if text else 'a number'}")


def matches(match, entry: Entry) -> bool:
  """Whether a rule's `match` (a regex of the whole name, or {fact: value}) holds of `entry`."""
  if isinstance(match, str):
    match = {"name": match}
  for key, want in match.items():
    if key == "name":
      try:
        if not re.fullmatch(want, entry.name):
          return False
      except re.error as e:
        raise ConfigError(f"mesh.rules: bad regex '{want}': {e}") from None
      continue
    bound, _, fact = key.partition("_") if key.startswith(("min_", "max_")) else ("", "", key)
    have = MATCH_FACTS[fact](entry)
    if fact == "platform":
      if have != want:
        return False
    elif have is None or have < 0:  # not known, or any size (a generic entry)
      return False
    elif not (have >= want if bound == "min" else have <= want if bound == "max"
              else have == want):
      return False
  return True


def describe_match(match) -> str:
  """A rule's match in words, as --print_config and the plan show which rule applied."""
  if isinstance(match, str):
    return match
  return ", ".join(f"{k}={v}" for k, v in match.items())
