"""Strict parsing of a config file's `:arg` (e.g. `configs/gpt2.py:size=medium`).

A config whose argument picks a row of a table names the table in a module-level
`CHOICES = {"size": gpt2.SIZES}` and checks the value with `choice("size", ..., CHOICES["size"])`;
tests/test_golden_configs.py keeps a golden file for every value it declares."""

from __future__ import annotations

from core.registry import ConfigError, suggest


def parse_arg(arg: str | None, **defaults) -> dict:
  """`key=value,key=value` -> dict; keys must be among `defaults`, values take their type."""
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
    kind = type(defaults[key])
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
