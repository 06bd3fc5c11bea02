"""The embedded corpus: the running interpreter's standard-library `.py` files, as bytes.

No download and no setup: every Python has it. Files are read in sorted path
order; a file goes to the validation split when crc32(relative path) % 100 <
`eval_percent`, so the split is deterministic for a given Python version.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sysconfig
import zlib

import numpy as np

from modules.registry import ConfigError
from trainer.data.base import DATA, Source, StepIndexedIterator, check_batch_split, crops


@dataclasses.dataclass(frozen=True, kw_only=True)
class StdlibConfig:
  kind: str = "stdlib"
  seq_len: int = 256  # tokens (bytes) per training sequence
  batch_size: int = 32  # global batch (sequences)
  eval_percent: int = 2  # share of files held out for validation (%)

  def check(self, *, vocab_size: int, seed: int):
    if vocab_size < 256:
      raise ConfigError(f"data 'stdlib' emits bytes (256 ids) but model.vocab_size is {vocab_size};"
                        " set --config.model.vocab_size=256 or more")
    if self.seq_len <= 0:
      raise ConfigError(f"data.seq_len must be positive, got {self.seq_len}")
    if not 0 < self.eval_percent < 100:
      raise ConfigError(f"data.eval_percent must be in 1..99, got {self.eval_percent}")


@functools.cache
def stdlib_files() -> tuple[pathlib.Path, ...]:
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  return tuple(sorted((p for p in root.rglob("*.py")
                       if "site-packages" not in p.parts and p.is_file()),
                      key=lambda p: p.relative_to(root).as_posix()))


@functools.cache
def load_split(eval_percent: int) -> tuple[np.ndarray, np.ndarray]:
  """(train bytes, eval bytes) as uint8 arrays; each file ends with a newline."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  parts: dict[bool, list[bytes]] = {True: [], False: []}
  for path in stdlib_files():
    held_out = zlib.crc32(path.relative_to(root).as_posix().encode()) % 100 < eval_percent
    parts[held_out].append(path.read_bytes() + b"\n")
  return tuple(np.frombuffer(b"".join(parts[k]), np.uint8) for k in (False, True))


@DATA.register("stdlib", StdlibConfig)
class StdlibSource(Source):
  vocab_size = 256

  def __init__(self, *, cfg: StdlibConfig, vocab_size: int, seed: int):
    self.cfg, self.seed = cfg, seed
    self.batch_size, self.seq_len = cfg.batch_size, cfg.seq_len
    self.train, self.eval = load_split(cfg.eval_percent)

  def train_iterator(self, *, process_index: int, process_count: int) -> StepIndexedIterator:
    check_batch_split(self.batch_size, process_count)
    local = self.batch_size // process_count
    high = len(self.train) - self.seq_len - 1

    def batch_at(step: int):
      rng = np.random.default_rng([self.seed, step])
      starts = rng.integers(0, high, size=self.batch_size)
      return crops(self.train, starts[process_index * local:(process_index + 1) * local],
                   self.seq_len)

    return StepIndexedIterator(batch_at)

  def eval_batches(self, *, batch_size, num_batches, process_index, process_count):
    check_batch_split(batch_size, process_count, "eval.batch_size")
    local = batch_size // process_count
    count = batch_size * num_batches
    stride = (len(self.eval) - self.seq_len - 1) // count
    if stride < 1:
      raise ConfigError(f"eval asks for {count} sequences of {self.seq_len} tokens but the held-out"
                        f" split has {len(self.eval)} tokens; lower eval.num_batches")
    starts = (np.arange(count) * stride).reshape(num_batches, batch_size)
    return [crops(self.eval, s[process_index * local:(process_index + 1) * local], self.seq_len)
            for s in starts]
