"""The layer library. Importing it registers every component: each module of this folder is
imported, so a layer kind in a new file needs no import line here."""

import importlib
import pkgutil

from core.registry import ConfigError, registry

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")

from modules.decoder import MODELS  # noqa: E402  (registered above)


def families() -> dict:
  """{name: module} of the model families of this folder: a module with a size table `SIZES`
  and `model_node(size)` (modules/llama.py, ...), found here as every module is."""
  found = {info.name: importlib.import_module(f"{__name__}.{info.name}")
           for info in pkgutil.iter_modules(__path__)}
  return {name: module for name, module in found.items()
          if isinstance(getattr(module, "SIZES", None), dict) and hasattr(module, "model_node")}


__all__ = ["MODELS", "ConfigError", "families", "registry"]
