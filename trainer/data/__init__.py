"""Data sources (the `data` registry). Importing the package registers every source."""

from trainer.data import mixture, sources, synthetic  # noqa: F401
from trainer.data.base import DATA, Batch, DataIterator, Source

__all__ = ["DATA", "Batch", "DataIterator", "Source"]
