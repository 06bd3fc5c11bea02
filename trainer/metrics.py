"""metrics.jsonl: one JSON object per logged step (and per evaluation)."""

from __future__ import annotations

import json
import math
import pathlib


class MetricsWriter:
  def __init__(self, path: pathlib.Path | None):
    self.path = path
    self._file = open(path, "a", encoding="utf-8") if path is not None else None
    self.records: list[dict] = []

  def write(self, record: dict) -> None:
    record = {k: (float(v) if not isinstance(v, (int, str)) else v) for k, v in record.items()}
    self.records.append(record)
    if self._file is not None:
      self._file.write(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v)
                                       else v) for k, v in record.items()}) + "\n")
      self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
