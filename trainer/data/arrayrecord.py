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


@DATA.register("arrayrecord", ArrayRecordConfig)
class ArrayRecordSource(DocumentSource):

  @staticmethod
  def documents(cfg, files, *, errors):
    del cfg
    for path in files:
      for i, record in enumerate(records(path)):
        text = documents.utf8(record, f"{path}: record {i}", errors)
        if text is not None:
          yield path, f": record {i}", text
