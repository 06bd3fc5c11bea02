"""Strict parsing of a config file's `:arg` (e.g. `configs/gpt2.py:size=medium`).

A config whose argument picks a row of a table names the table in a module-level
`CHOICES = {"size": gpt2.SIZES}` and checks the value with `choice("size", ..., CHOICES["size"])`;
tests/test_golden_configs.py keeps a golden file for every value it declares."""

from __future__ import annotations

import dataclasses

from core.registry import ConfigError, suggest


@dataclasses.dataclass(frozen=True)
class Needed:
  """A config argument without a default (`parse_arg(arg, size=Needed("one of test, tiny"))`):
  the command line must give it, `what` says what it is. Its values are strings."""
  what: str


def parse_arg(arg: str | None, **defaults) -> dict:
  """`key=value,key=value` -> dict; keys must be among `defaults`, values take their type; a
  `Needed` key that `arg` does not give is refused, saying how to give it."""
  out = _parsed(arg, defaults)
  for key, value in out.items():
    if isinstance(value, Needed):
      raise ConfigError(f"this config needs its argument {key} ({value.what}): add :{key}=VALUE "
                        f"after the file name")
  return out


def _parsed(arg: str | None, defaults: dict) -> dict:
  out = dict(defaults)
  if not arg:
    return out
  if not defaults:
    raise ConfigError(f"config argument '{arg}': this config takes no argument; drop ':{arg}'")
  for item in arg.split(","):
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
      raise ConfigError(f"config argument '{arg}': expected key=value[,key=value...]; keys: "
                        f"{', '.join(defaults)}")
    if key not in defaults:
      raise ConfigError(f"config argument: unknown key '{key}'{suggest(key, defaults)}; keys: "
                        f"{', '.join(defaults)}")
    kind = str if isinstance(defaults[key], Needed) else type(defaults[key])
    try:
      out[key] = {bool: lambda v: {"true": True, "false": False}[v.lower()]}.get(kind, kind)(value)
    except (KeyError, ValueError):
      raise ConfigError(f"config argument {key}={value}: expected {kind.__name__}") from None
  return out


def choice(key: str, value: str, choices) -> str:
  if value not in choices:
    raise ConfigError(f"config argument {key}={value}: unknown{suggest(value, choices)}; "
                      f"choices: {', '.join(choices)}")
  return value


def row(table, name: str, family: str):
  """`table[name]`, a family's size row; ConfigError with a did-you-mean for a name it lacks."""
  if name not in table:
    raise ConfigError(f"unknown {family} size '{name}'{suggest(name, table)}; sizes: "
                      f"{', '.join(table)}")
  return table[name]
