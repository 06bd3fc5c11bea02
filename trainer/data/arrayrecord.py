"""ArrayRecord files: each record is one UTF-8 document (`data.kind=arrayrecord`)."""

from __future__ import annotations

import dataclasses

from core.registry import ConfigError
from trainer.data import documents
from trainer.data.base import DATA
from trainer.data.config import DocumentFilesConfig
from trainer.data.corpus import DocumentSource


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArrayRecordConfig(DocumentFilesConfig):
  kind: str = "arrayrecord"


def records(path: str) -> list[bytes]:
  """Every record of one ArrayRecord file (also the shards of `axtrain tokenize`)."""
  import grain  # pylint: disable=import-outside-toplevel
  try:
    source = grain.sources.ArrayRecordDataSource([path])
    return source.__getitems__(list(range(len(source))))
  except (RuntimeError, OSError, ValueError) as e:
    raise ConfigError(f"{path}: not an ArrayRecord file ({' '.join(str(e).split())[:120]})") \
        from None


def write_records(path: str, records_: list[bytes]) -> None:
  """One ArrayRecord file holding `records_`, one record per group (read back one by one)."""
  from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
  for record in records_:
    writer.write(record)
  writer.close()


@DATA.register("arrayrecord", ArrayRecordConfig)
class ArrayRecordSource(DocumentSource):
  SUFFIXES = (".array_record",)

  @staticmethod
  def write(directory, texts):
    path = str(directory / "example.array_record")
    write_records(path, [t.encode("utf-8") for t in texts])
    return path

  @staticmethod
  def documents(cfg, files, *, errors):
    del cfg
    for path in files:
      for i, record in enumerate(records(path)):
        text = documents.utf8(record, f"{path}: record {i}", errors)
        if text is not None:
          yield path, f": record {i}", text
