"""Loading `--config=FILE[:arg]` with config_flags (locked), with one-line errors.

ml_collections reports mistakes as long tracebacks or bare KeyErrors; this
module turns each into a UserError that says what is wrong and how to fix it.
"""

from __future__ import annotations

import pathlib
import re
import sys

import ml_collections
from absl import flags
from ml_collections import config_flags

from launcher.errors import UserError, suggest


class _FloatOrNone(flags.FloatParser):
  def parse(self, argument):
    return None if argument == "None" else super().parse(argument)


class _IntOrNone(flags.IntegerParser):
  def parse(self, argument):
    return None if argument == "None" else super().parse(argument)


# `--config.x=None` for a number field: the typed check of the config then accepts it where
# the field allows None ("None = off", e.g. optimizer.clip_norm) and names the field elsewhere.
config_flags.register_flag_parser_for_type(float, _FloatOrNone())
config_flags.register_flag_parser_for_type(int, _IntOrNone())


def define(fv: flags.FlagValues, argv: list[str]) -> None:
  """Defines --config on `fv`; config_flags finds the `--config.*` overrides in `argv`."""
  # config_flags loads every file as module `config_config` with the deprecated load_module(),
  # which re-executes a new file into the cached module: without this, a second load in one
  # process (tests, tools) would keep the first file's get_config.
  sys.modules.pop("config_config", None)
  config_flags.DEFINE_config_file(
      "config", None, "Python config file with get_config(arg=None), optionally FILE:key=value,"
      " ...; override fields with --config.a.b=value.", flag_values=fv, lock_config=True,
      sys_argv=argv)


def overrides(argv: list[str]) -> list[tuple[str, str]]:
  """[(path, raw value)] of the `--config.a.b=value` flags, in order."""
  out = []
  for i, arg in enumerate(argv):
    m = re.match(r"^--?config\.([^=]+)(?:=(.*))?$", arg)
    if m:
      value = m[2] if m[2] is not None else (argv[i + 1] if i + 1 < len(argv) else "")
      out.append((m[1], value))
  return out


def config_file_arg(argv: list[str]) -> str | None:
  for i, arg in enumerate(argv):
    m = re.match(r"^--?config(?:=(.*))?$", arg)
    if m:
      return m[1] if m[1] is not None else (argv[i + 1] if i + 1 < len(argv) else None)
  return None


def check_file(value: str | None) -> None:
  if not value:
    raise UserError("--config is required, e.g. --config=configs/tiny.py")
  path = value.split(":", 1)[0]
  if not pathlib.Path(path).is_file():
    raise UserError(f"config file '{path}' not found")


def _last_line(text: str) -> str:
  lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
  line = lines[-1] if lines else text
  # "core.registry.ConfigError: message" -> "message"
  return re.sub(r"^[\w.]*(Error|Exception)\w*: ", "", line)


def load_plain(value: str) -> ml_collections.ConfigDict:
  """The config without overrides (used to explain a bad override)."""
  fv = flags.FlagValues()
  argv = ["axtrain", f"--config={value}"]
  define(fv, argv)
  fv(argv)
  return fv["config"].value


def bad_override(config: ml_collections.ConfigDict, items: list[tuple[str, str]]) -> str | None:
  """A message for the first override whose path is not in `config`."""
  for path, _ in items:
    node, walked = config, []
    for part in path.split("."):
      keys = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      if part not in keys:
        where = ".".join(walked) or "the config"
        if not keys:
          return f"--config.{path}: '{'.'.join(walked)}' is a value, not a section"
        return (f"--config.{path}: unknown key '{part}' in {where}{suggest(part, keys)}"
                f"; see --print_config")
      node = node[part]
      walked.append(part)
  return None


def translate(error: BaseException, argv: list[str]) -> UserError:
  """A one-line UserError for an exception raised while parsing the flags."""
  value = config_file_arg(argv)
  if isinstance(error, flags.UnrecognizedFlagError):
    return UserError(f"unknown flag --{error.flagname}{suggest(error.flagname, _FLAG_NAMES)};"
                     f" see --help")
  if isinstance(error, SyntaxError):
    return UserError(f"config file '{error.filename}' line {error.lineno}: {error.msg}")
  text = str(error)
  if "has no attribute 'get_config'" in text:
    return UserError(f"config file '{value.split(':')[0]}' defines no get_config(arg=None)")
  if "Error whilst parsing config file" in text:
    return UserError(f"config file '{value}': {_last_line(text)}")
  if isinstance(error, (AttributeError, KeyError)):
    try:
      message = bad_override(load_plain(value), overrides(argv))
    except Exception:  # pylint: disable=broad-except
      message = None
    return UserError(message or f"bad config override: {_last_line(text)}")
  m = re.match(r"flag (--\S+?)=(.*?): (.*)$", text, re.S)
  if m:
    reason = m[3].splitlines()[0]
    kind = re.match(r"invalid literal for (\w+)\(\)", reason) or re.match(
        r"could not convert string to (\w+)", reason)
    if kind:
      reason = f"expected a value of type {kind[1]}"
    return UserError(f"{m[1]}={m[2]}: {reason}")
  return UserError(_last_line(text))


_FLAG_NAMES: list[str] = []


def register_flag_names(fv: flags.FlagValues) -> None:
  _FLAG_NAMES[:] = [name for name in fv]
