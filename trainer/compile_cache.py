"""JAX's persistent compilation cache, on by default (`trainer.compile_cache`).

A run's programs (the train and eval steps, init) compile once per setting and machine: a
resumed run, a second run of the same setting or an extension reads them back from the cache
folder instead of compiling again (llm_1b on one TPU v5e compiles for about 3.5 minutes). The
key is JAX's own (the program, the compiler and its flags, the devices), so a hit never changes
what a run computes. JAX caches only programs that took at least
`jax_persistent_cache_min_compile_time_secs` (1 s by default) to compile. The next start of a
setting loads the programs its last run used while it traces its steps
(trainer/compile_prefetch.py; its index is `axtrain-prefetch/` in the cache folder).

    trainer.compile_cache="auto"   $JAX_COMPILATION_CACHE_DIR if set, else ~/.cache/axtrain/jax
                                   ($XDG_CACHE_HOME/axtrain/jax); off where JAX's own
                                   JAX_ENABLE_COMPILATION_CACHE=false says so
    trainer.compile_cache="off"    no cache
    trainer.compile_cache=DIR      that folder (made if missing)
"""

from __future__ import annotations

import os
import pathlib
import sys

import jax
from jax import monitoring

from core.registry import ConfigError
from trainer.metrics import CACHE

DEFAULT = CACHE / "jax"
_HIT = "/jax/compilation_cache/cache_hits"
_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
_read = {"programs": 0, "saved_s": 0.0}  # what this process read from the cache


def folder(setting: str) -> pathlib.Path | None:
  """The cache folder `setting` names (None: off)."""
  if setting == "off":
    return None
  if setting == "auto":
    if os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "").lower() in ("0", "false", "no"):
      return None
    return pathlib.Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT)
  return pathlib.Path(setting).expanduser()


def enable(setting: str) -> pathlib.Path | None:
  """Points JAX's compilation cache at `setting`'s folder before anything compiles. A folder
  named by the user that cannot be made is refused (ConfigError); the default folder that
  cannot be made turns the cache off, with a warning."""
  if not setting.strip():
    raise ConfigError("trainer.compile_cache is empty; give a folder, 'auto' (the default: "
                      "$JAX_COMPILATION_CACHE_DIR, else ~/.cache/axtrain/jax) or 'off'")
  path = folder(setting)
  if path is not None:
    try:
      path.mkdir(parents=True, exist_ok=True)
      if not os.access(path, os.W_OK):
        raise PermissionError(f"{path} is not writable")
    except OSError as e:
      if setting != "auto":
        raise ConfigError(f"trainer.compile_cache={setting!r}: cannot use it as the "
                          f"compilation cache ({e.strerror or e}); give a writable folder, "
                          f"or 'off'") from None
      print(f"axtrain: warning: no compilation cache: cannot use {path} ({e.strerror or e}); "
            f"set trainer.compile_cache to a writable folder", file=sys.stderr)
      path = None
  jax.config.update("jax_enable_compilation_cache", path is not None)
  if path is not None:
    jax.config.update("jax_compilation_cache_dir", str(path))
  return path


def _count(event: str, **_) -> None:
  if event == _HIT:
    _read["programs"] += 1


def _count_saved(event: str, seconds: float, **_) -> None:
  if event == _SAVED:
    _read["saved_s"] += seconds


monitoring.register_event_listener(_count)
monitoring.register_event_duration_secs_listener(_count_saved)


def read_so_far() -> tuple[int, float]:
  """(programs read from the cache by this process, compile seconds that saved, as JAX
  estimates them)."""
  return _read["programs"], _read["saved_s"]
