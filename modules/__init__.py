"""The layer library. Importing it registers every component: each module of this folder is
imported, so a layer kind in a new file needs no import line here."""

import importlib
import pkgutil

from core.registry import ConfigError, registry

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")

from modules.decoder import MODELS  # noqa: E402  (registered above)

__all__ = ["MODELS", "ConfigError", "registry"]
