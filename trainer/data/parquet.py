"""Parquet files: one document per row, its text in the column `field` (`data.kind=parquet`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from core.registry import ConfigError
from trainer.data import documents
from trainer.data.base import DATA
from trainer.data.config import DocumentFilesConfig
from trainer.data.corpus import DocumentSource


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParquetConfig(DocumentFilesConfig):
  kind: str = "parquet"
  field: str = "text"  # column holding the document text
  SHARED: ClassVar = (*DocumentFilesConfig.SHARED, "field")  # jsonl's `field` means the same


@DATA.register("parquet", ParquetConfig)
class ParquetSource(DocumentSource):
  SUFFIXES = (".parquet",)

  @staticmethod
  def write(directory, texts):
    import pyarrow  # pylint: disable=import-outside-toplevel
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    path = directory / "example.parquet"
    pq.write_table(pyarrow.table({"text": texts}), path)
    return str(path)

  @staticmethod
  def documents(cfg, files, *, errors):
    import pyarrow  # pylint: disable=import-outside-toplevel
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    field = cfg.field
    for path in files:
      try:
        pf = pq.ParquetFile(path)
      except (pyarrow.ArrowException, OSError) as e:
        raise ConfigError(f"{path}: not a Parquet file ({' '.join(str(e).split())[:120]})"
                          ) from None
      names = pf.schema_arrow.names
      if field not in names:
        raise ConfigError(f"{path}: no column '{field}' (columns: {', '.join(names)}); "
                          f"set data.field")
      row = 0
      for batch in pf.iter_batches(columns=[field]):
        for value in batch.column(0).to_pylist():
          place = f": row {row}"
          where = path + place
          row += 1
          if isinstance(value, bytes):
            value = documents.utf8(value, where, errors)
            if value is None:
              continue
          if not isinstance(value, str):
            errors.bad(where, f"column '{field}' is {type(value).__name__}, not text")
            continue
          yield path, place, value
