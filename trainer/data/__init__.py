"""Data sources (the `data` registry). Importing the package registers every source: each
module of this folder is imported, so a new source is one new file (its config, its
reader, its registration) and no list to extend."""

import importlib
import pkgutil

from trainer.data.base import DATA, Batch, DataIterator, Source

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DATA", "Batch", "DataIterator", "Source"]
