"""Loading `--config=FILE[:arg]` with config_flags (locked), with one-line errors.

Before the file is loaded, every package that registers components is imported
(`register_components`), so that whatever the file imports, each registry that the kind
switches and override checks look up exists. Between loading the file and applying the
`--config.*` overrides, every kind switch
`--config.<path>.kind=K` replaces the node at <path> by K's node (parents before
children, whatever the order on the command line; trainer.config.switch_kind), so
that the other overrides may then set K's fields. Every override path is checked
against the switched config before config_flags sees it.

ml_collections reports mistakes as long tracebacks or bare KeyErrors; this
module turns each into a UserError that says what is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import logging
import os
import pathlib
import re
import sys
import traceback

import ml_collections
from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from core import paths
from core.registry import child_registry, optional_child
from launcher.errors import ConfigError, UserError, suggest
from launcher.flat import flatten
from trainer.config import field_at, switch_kind


class _FloatOrNone(flags.FloatParser):
  def parse(self, argument):
    return None if argument == "None" else super().parse(argument)


class _IntOrNone(flags.IntegerParser):
  def parse(self, argument):
    return None if argument == "None" else super().parse(argument)


class _OffOnly(flags.ArgumentParser):
  """`--config.<path>=None` on a component node: only an optional child gets here
  (bad_override refuses the others), and None switches it off."""

  def parse(self, argument):
    if not isinstance(argument, str):  # the node itself, as the override flag's default
      return argument
    if argument != "None":
      raise ValueError("a component node takes only None (off); set its fields or its kind")
    return None


# `--config.x=None` for a number field: the typed check of the config then accepts it where
# the field allows None ("None = off", e.g. optimizer.clip_norm) and names the field elsewhere.
config_flags.register_flag_parser_for_type(float, _FloatOrNone())
config_flags.register_flag_parser_for_type(int, _IntOrNone())
# An optional child (child(..., default=None)), on or already off.
config_flags.register_flag_parser_for_type(ml_collections.ConfigDict, _OffOnly())
config_flags.register_flag_parser_for_type(type(None), _OffOnly())


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
  fv["config"].parser = _SwitchingParser(argv)


class Refused(flags.Error):
  """A ConfigError found while loading (absl would wrap a ValueError in its flag message)."""


class _SwitchingParser(ConfigFileFlagParser):
  """config_flags' file parser, plus the kind switches and override checks before locking."""

  def __init__(self, argv: list[str]):
    super().__init__(name="config", lock_config=False)  # locked below, after the switches
    self._argv = argv

  def parse(self, path):
    register_components()
    returned_none = logging.Filter()  # config_flags warns of it; the refusal below says it
    returned_none.filter = lambda record: "get_config() returned None" not in str(record.msg)
    logging.getLogger("absl").addFilter(returned_none)
    try:
      cfg = super().parse(path)
    except Exception as e:  # pylint: disable=broad-except  (whatever the file raises: one line)
      raise Refused(file_error(path, e)) from None
    finally:
      logging.getLogger("absl").removeFilter(returned_none)
    error = vars(cfg).get("_error") if type(cfg).__name__ == "_ErrorConfig" else None
    if isinstance(error, BaseException):  # config_flags defers an OSError of the file to here
      raise Refused(file_error(path, error))
    if not isinstance(cfg, ml_collections.ConfigDict):
      got = "None" if cfg is None else f"a {type(cfg).__name__}"
      raise Refused(f"config file '{path.split(':')[0]}'{_get_config_line()}: get_config() "
                    f"returned {got}, not an ml_collections.ConfigDict; end it with `return cfg`")
    try:
      prepare(cfg, overrides(self._argv))
    except ConfigError as e:
      raise Refused(str(e)) from None
    cfg.lock()
    return cfg


def register_components() -> None:
  """Imports the packages whose modules register every component: the layer library
  (modules), data sources and tokenizers (trainer.data), optimizers and schedules
  (trainer.optimizer). A config file that builds its config from plain data (the config.py
  that `axtrain convert` writes) imports none of them, and without them the override checks
  and kind switches find no `data`, `optimizer` or `model` registry. Imported here, not at
  the top: `axtrain --help` and the subcommands need no jax."""
  import modules  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  import trainer.data  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  import trainer.optimizer  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import


def _get_config_line() -> str:
  """' line N' of the loaded config file's get_config (config_flags loads it as config_config)."""
  code = getattr(getattr(sys.modules.get("config_config"), "get_config", None), "__code__", None)
  return f" line {code.co_firstlineno}" if code is not None else ""


def file_error(value: str, error: BaseException) -> str:
  """One line for an exception raised while loading config file `value` (FILE[:arg]): the file
  and the line in it where it was raised, and the error."""
  path = value.split(":", 1)[0]
  if str(error).startswith("Error whilst parsing config file") and error.__context__:
    error = error.__context__  # config_flags re-raises TypeError/ValueError with a traceback text
  if isinstance(error, ConfigError):  # a config's own message (e.g. core.config_args.parse_arg)
    return f"config file '{value}': {' '.join(str(error).split())}"
  if isinstance(error, SyntaxError):
    return f"config file '{error.filename}' line {error.lineno}: {error.msg}"
  if isinstance(error, AttributeError) and "get_config" in str(error):
    return f"config file '{path}' defines no get_config(arg=None)"
  line = None
  for frame, lineno in traceback.walk_tb(error.__traceback__):
    if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(path):
      line = lineno  # the innermost frame in the file
  where = f" line {line}" if line is not None else ""
  return f"config file '{path}'{where}: {type(error).__name__}: {' '.join(str(error).split())}"


def prepare(cfg: ml_collections.ConfigDict, items: list[tuple[str, str]]) -> None:
  """Applies the kind switches among `items`, then checks that every override path names
  a field (not a section) of the switched config."""
  switches = {path[:-len(".kind")]: value for path, value in items if path.endswith(".kind")}
  for path in sorted(switches, key=lambda p: p.count(".")):  # parents first
    try:
      node = paths.get_path(cfg, path)
    except ConfigError:
      continue  # reported below as an unknown key
    if node is None or (isinstance(node, ml_collections.ConfigDict) and "kind" in node):
      dropped: dict = {}
      switch_kind(cfg, path, switches[path], dropped=dropped)  # an empty slot gets K's node too
      overridden = {p for p, _ in items}
      note = _not_carried_note(f"--config.{path}.kind={switches[path]}", switches[path], {
          k: d for k, d in dropped.items() if k not in overridden})
      if note:  # changed by the config file (not defaults): say so rather than drop silently
        print(note, file=sys.stderr)
  message = bad_override(cfg, items)
  if message:
    raise ConfigError(message)


def _not_carried_note(switch: str, kind: str, dropped: dict) -> str | None:
  """One `axtrain: note:` line for the changed fields that a kind switch leaves behind."""
  if not dropped:
    return None
  gone = [f"{k}={d.value!r}" for k, d in dropped.items() if not d.has_field]
  reset = [f"{k}={d.value!r} to {d.new_default!r}" for k, d in dropped.items() if d.has_field]
  parts = []
  if gone:
    parts.append(f"drops {', '.join(gone)} (kind '{kind}' has no such field)")
  if reset:
    parts.append(f"resets {', '.join(reset)} (kind '{kind}''s own default: the kinds do not "
                 f"share the field; set it with --config.<path>=VALUE to keep a value)")
  return f"axtrain: note: {switch} {'; '.join(parts)}"


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


def _file_hint(path: pathlib.Path) -> str:
  """' (did you mean 'configs/tiny.py'?)': a close name in the same folder, or in configs/ for a
  bare file name."""
  bare = path.parent == pathlib.Path()
  for folder in [path.parent] + ([pathlib.Path("configs")] if bare else []):
    names = sorted(p.name for p in folder.glob("*.py")) if folder.is_dir() else []
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)  # by name, not folder
    if close:
      return f" (did you mean '{folder / close[0]}'?)"
  return ""


def check_file(value: str | None, *, argv: tuple[str, ...] = ()) -> None:
  """UserError unless --config names an existing file; a misspelt flag or file name gets a
  did-you-mean (`--confg=...`, `configs/tinny.py`)."""
  if not value:
    for arg in argv:
      name = arg.lstrip("-").split("=", 1)[0]
      if arg.startswith("-") and name != "config" and suggest(name, ["config"]):
        raise UserError(f"unknown flag --{name} (did you mean 'config'?); see --help")
    raise UserError("--config is required, e.g. --config=configs/tiny.py")
  path = pathlib.Path(value.split(":", 1)[0])
  if path.is_dir():
    files = sorted(p.as_posix() for p in path.glob("*.py")
                   if "def get_config(" in p.read_text(errors="replace"))
    listed = f"; its config files: {', '.join(files[:6])}{' ...' if len(files) > 6 else ''}" if (
        files) else ""
    raise UserError(f"--config={value}: '{path}' is a directory; give a config file{listed}")
  if not path.is_file():
    raise UserError(f"config file '{path}' not found{_file_hint(path)}")
  if path.suffix != ".py":
    raise UserError(f"config file '{path}' is not a Python file: a config is a .py file whose "
                    f"get_config(arg=None) returns the config, e.g. configs/tiny.py")


_BARE = re.compile(r"^--?([A-Za-z_][\w.-]*)$")  # a flag without `=value`
_FLAG = re.compile(r"^--?[A-Za-z_]")  # an argument that is a flag, not a value (-1 is a value)


def check_values(fv: flags.FlagValues, argv: list[str]) -> None:
  """UserError for a flag of `fv` that takes a value, given without one and followed by another
  flag, which absl would take as its value (`--output_dir --overwrite` would train into a
  directory named `--overwrite`). After `fv(argv)` also `--config.a.b` overrides (a boolean
  field takes no value); before it, only the flags `fv` already defines."""
  config = fv["config"].value if "config" in fv else None
  for arg, following in zip(argv[1:], argv[2:]):
    m = _BARE.match(arg)
    if not m or not _FLAG.match(following):
      continue
    name = m[1]
    if name in fv and not fv[name].boolean:
      takes = True
    elif name.startswith("config.") and isinstance(config, ml_collections.ConfigDict):
      try:
        takes = not isinstance(paths.get_path(config, name[len("config."):]), bool)
      except ConfigError:
        takes = False  # an unknown key: its own error says so
    else:
      continue
    if takes:
      raise UserError(f"--{name} is given no value (the next argument, {following}, is a flag); "
                      f"write --{name}=VALUE")


def _last_line(text: str) -> str:
  lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
  line = lines[-1] if lines else text
  # "core.registry.ConfigError: message" -> "message"
  return re.sub(r"^[\w.]*(Error|Exception)\w*: ", "", line)


def load(value: str, *overrides: str) -> ml_collections.ConfigDict:
  """The config of `--config=value` with `--config.*` overrides applied (kind switches too)."""
  fv = flags.FlagValues()
  argv = ["axtrain", f"--config={value}", *overrides]
  define(fv, argv)
  fv(argv)
  return fv["config"].value


def bad_override(config: ml_collections.ConfigDict, items: list[tuple[str, str]]) -> str | None:
  """A message for the first override whose path is not a field of `config`."""
  for path, value in items:
    try:
      target = paths.get_path(config, path)
    except ConfigError as e:
      return f"--config.{path}: {_off_parent(config, path) or e}"
    field = field_at(config, path)
    if value == "None" and field is not None and optional_child(field):
      continue  # switches an optional child off
    if isinstance(target, ml_collections.ConfigDict):
      fields = ", ".join(sorted(target.keys()))
      return (f"--config.{path}={value}: '{path}' is a section, not a value; set its fields "
              f"(--config.{path}.FIELD=VALUE{', or its kind' if 'kind' in target else ''}):"
              f" {fields}")
    if target is None and field is not None and optional_child(field):
      return (f"--config.{path}={value}: '{path}' is an optional component, off; turn it on "
              f"with --config.{path}.kind=KIND ({', '.join(child_registry(field).kinds())})")
  return None


def _off_parent(config: ml_collections.ConfigDict, path: str) -> str | None:
  """For a path below an optional child that is off: how to turn it on."""
  parts = path.split(".")
  for i in range(1, len(parts)):
    prefix = ".".join(parts[:i])
    try:
      node = paths.get_path(config, prefix)
    except ConfigError:
      return None
    field = field_at(config, prefix)  # an optional child, or one a kind switch carried as None
    if node is None and field is not None and child_registry(field) is not None:
      kinds = ", ".join(child_registry(field).kinds())
      return (f"'{prefix}' is off (None); turn it on first with --config.{prefix}.kind=KIND "
              f"({kinds}), then set its fields")
  return None


def translate(error: BaseException, argv: list[str]) -> UserError:
  """A one-line UserError for an exception raised while parsing the flags."""
  value = config_file_arg(argv)
  if isinstance(error, Refused):
    return UserError(str(error))
  if isinstance(error, flags.UnrecognizedFlagError):
    hint = suggest(error.flagname, _FLAG_NAMES) or _field_hint(error.flagname, value)
    return UserError(f"unknown flag --{error.flagname}{hint}; see --help")
  if isinstance(error, SyntaxError):
    return UserError(f"config file '{error.filename}' line {error.lineno}: {error.msg}")
  text = str(error)
  early = re.search(r"Found (--config\.\S+) in argv before a value for --config", text)
  if early:  # ml_collections reads the overrides against the file: the file comes first
    return UserError(f"{early[1]} comes before --config=FILE; give --config first, then its "
                     f"overrides")
  if "has no attribute 'get_config'" in text:
    return UserError(f"config file '{value.split(':')[0]}' defines no get_config(arg=None)")
  if "Error whilst parsing config file" in text:
    return UserError(f"config file '{value}': {_last_line(text)}")
  if isinstance(error, (AttributeError, KeyError)):
    try:
      message = bad_override(load(value), overrides(argv))
    except Exception:  # pylint: disable=broad-except
      message = None
    return UserError(message or f"bad config override: {_last_line(text)}")
  m = re.match(r"flag (--\S+?)=(.*?): (.*)$", text, re.S)
  if m and _FLAG.match(m[2]) and [m[1], m[2]] in map(list, zip(argv, argv[1:])):
    return UserError(f"{m[1]} is given no value (the next argument, {m[2]}, is a flag); write "
                     f"{m[1]}=VALUE")  # a number's flag, whose parse took the next flag
  if m:
    reason = m[3].splitlines()[0]
    kind = re.match(r"invalid literal for (\w+)\(\)", reason) or re.match(
        r"could not convert string to (\w+)", reason)
    if kind:
      reason = f"expected a value of type {kind[1]}"
    elif reason.startswith("('Non-boolean argument"):
      reason = "expected true or false"
    return UserError(f"{m[1]}={m[2]}: {reason}")
  return UserError(_last_line(text))


def _field_hint(name: str, value: str | None) -> str:
  """` (did you mean --config.trainer.max_steps?)` for a flag named like a field of the config
  (`--max_step`, `--trainer.max_steps`): config fields are set with --config.<path>=..."""
  try:
    keys = list(flatten(load(value))) if value else []
  except Exception:  # pylint: disable=broad-except  (the config's own error is reported elsewhere)
    return ""
  name = name.removeprefix("config.")
  by_name: dict[str, list[str]] = {}
  for key in keys:  # a path by its field name and by its whole path
    by_name.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    by_name.setdefault(key, []).append(key)
  close = difflib.get_close_matches(name, list(by_name), n=1, cutoff=0.8)
  if not close:
    return ""
  paths = sorted(by_name[close[0]])
  return (f" (did you mean --config.{paths[0]}? config fields are set as --config.<path>)"
          if len(paths) == 1 else
          f" (did you mean one of {', '.join('--config.' + p for p in paths[:3])}? config "
          f"fields are set as --config.<path>)")


_FLAG_NAMES: list[str] = []


def register_flag_names(fv: flags.FlagValues) -> None:
  _FLAG_NAMES[:] = [name for name in fv]
