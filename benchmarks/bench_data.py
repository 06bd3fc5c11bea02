"""Loader throughput: tokens/s of the data iterator alone, on the embedded corpus and on a
generated JSONL corpus, at the batch shape of configs/tiny.py.

    PYTHONPATH=. python -m benchmarks.bench_data

`run()` returns the figures; benchmarks/run.py puts them next to the training step's
consumption (the loader must be >= 20x faster).
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time

import numpy as np

import trainer.data  # noqa: F401  (registers the sources)
from configs import tiny
from core.registry import registry
from trainer.data.base import DATA

_TINY = tiny.get_config().data
BATCH, SEQ_LEN = _TINY.batch_size, _TINY.seq_len
STEPS = 819_200 // (BATCH * SEQ_LEN)  # ~0.8M tokens per measurement, whatever tiny's shape


def _source(kind: str, **values):
  node = registry("data").node(kind, batch_size=BATCH, seq_len=SEQ_LEN, **values)
  return DATA.build(registry("data").parse(node, "data"), vocab_size=256, seed=0)


def _tokens_per_s(src) -> float:
  it = src.train_iterator(process_index=0, process_count=1)
  next(it)  # first epoch's document order
  start = time.perf_counter()
  for _ in range(STEPS):
    next(it)
  return STEPS * BATCH * SEQ_LEN / (time.perf_counter() - start)


def _write_jsonl(path: pathlib.Path, docs: int) -> int:
  rng = np.random.default_rng(0)
  words = np.array("the of and to in is was for on that with as by at from it his an were "
                   "are which be this has also or had its first one their after new".split())
  size = 0
  with open(path, "w", encoding="utf-8") as f:
    for i in range(docs):
      text = " ".join(words[rng.integers(0, len(words), size=int(rng.integers(20, 400)))])
      line = json.dumps({"id": i, "text": text})
      size += len(line) + 1
      f.write(line + "\n")
  return size


def run() -> dict:
  out = {}
  start = time.perf_counter()
  src = _source("stdlib")
  out["stdlib_startup_s"] = time.perf_counter() - start
  out["stdlib_tokens"] = src.train.corpus.num_tokens
  out["stdlib_loader_tokens_per_s"] = _tokens_per_s(src)
  with tempfile.TemporaryDirectory() as tmp:
    path = pathlib.Path(tmp) / "corpus.jsonl"
    out["jsonl_bytes"] = _write_jsonl(path, docs=20_000)
    start = time.perf_counter()
    src = _source("jsonl", path=str(path))
    out["jsonl_startup_s"] = time.perf_counter() - start  # read + validate + tokenize
    out["jsonl_tokens"] = src.train.corpus.num_tokens
    out["jsonl_loader_tokens_per_s"] = _tokens_per_s(src)
  return out


if __name__ == "__main__":
  for key, value in run().items():
    print(f"{key:32s} {value:,.1f}" if isinstance(value, float) else f"{key:32s} {value:,}")
