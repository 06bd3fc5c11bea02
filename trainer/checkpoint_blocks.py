"""A host-memory save's and restore's large arrays, a block of rows at a time
(trainer/checkpoint_bounded.py uses them; its docstring has the measurements).

A save hands Orbax's write an array whose pieces are larger than HOST_STATE_BLOCK_BYTES as a
`Streamed`: each block of rows is brought into host RAM only when it is written, instead of
Orbax's copy of the whole array first. A restore reads a shard larger than
HOST_STATE_READ_BLOCK_BYTES with `read_in_blocks`, a block at a time through device memory,
instead of a whole read buffer and its copy into host memory. On CPU (HOST_VIEW_PLATFORMS) a
save's blocks are views of the buffers and a restore is Orbax's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import weakref

import jax
import numpy as np
from orbax.checkpoint._src.arrays import numpy_utils
from orbax.checkpoint._src.serialization import replica_slices

# A host-memory save writes an array larger than HOST_STATE_BLOCK_BYTES in blocks of rows of at
# most that (Streamed), and has blocks of fewer than HOST_STATE_WRITE_BYTES in all in host RAM
# at once (three blocks), each until TensorStore has written it: TensorStore otherwise
# encoded a whole array's chunks ahead of the v5e host's disk (about 190 MB/s) and held them
# until written, about 1 GB over each 1.05 GB array's copy. A block in flight costs about three
# times its bytes (the block, TensorStore's copy, its encoded chunks): on this repo's CPU machine
# a 4.3 GB state of 1.07 GB arrays (benchmarks/checkpoint_memory.py --gb=4.3 --stack=64
# --block_mib) saved at +0.52-0.67 GB of RSS with blocks of 64 MiB and +0.31-0.42 GB with
# 32 MiB, in the same 7.8-10.5 s (2026-12-07, four runs each); on the v5e host 64 MiB blocks
# gave that state +1.05-1.13 GB (bound 1.0) and llm_1b +1.22-1.27 GB (bound 1.48); with 32 MiB
# blocks +0.72 GB and llm_1b +0.18/+0.26 GB, in 94.2/60.0 s against 89.3/57.7 s (2026-12-07).
HOST_STATE_BLOCK_BYTES = 32 * 2**20
HOST_STATE_WRITE_BYTES = 4 * HOST_STATE_BLOCK_BYTES
# A restore into host memory reads a shard larger than HOST_STATE_READ_BLOCK_BYTES in blocks of
# rows of at most that, fewer than HOST_STATE_READ_BYTES of them at once (read_in_blocks): as
# measured on the v5e host (llm_1b's restore peaked under its steps' RAM; 2026-12-07).
HOST_STATE_READ_BLOCK_BYTES = 64 * 2**20
HOST_STATE_READ_BYTES = 4 * HOST_STATE_READ_BLOCK_BYTES


def block_rows(shape: tuple, itemsize: int, limit: int) -> int | None:
  """Rows of a block of an array piece of `shape`, the most that divide its rows and fit
  `limit` bytes; None where the piece fits `limit` whole, or no block of rows fits or splits it."""
  nbytes = math.prod(shape) * itemsize
  if not shape or nbytes <= limit:
    return None
  row_bytes = nbytes // shape[0]
  fitting = [d for d in range(1, shape[0]) if shape[0] % d == 0 and d * row_bytes <= limit]
  return max(fitting) if fitting else None


def fragment_bytes(array, limit: int) -> int:
  """The bytes of the largest piece of `array` that TensorStore writes at once: a shard, or its
  block of rows (Streamed)."""
  shape = tuple(array.sharding.shard_shape(array.shape)) if hasattr(array, "sharding") else ()
  itemsize = np.dtype(array.dtype).itemsize
  rows = block_rows(shape, itemsize, limit)
  return math.prod(shape[1:] if rows else shape) * (rows or 1) * itemsize


# Platforms where NumPy views a host-memory array's buffer (np.asarray copies nothing): a streamed
# piece's blocks are slices of that view. On a TPU or GPU host np.asarray copies a pinned_host
# buffer whole, so the piece is copied once into device memory (free between steps: the state
# lives in host memory, and the save ends before the next step) and each block comes back alone.
HOST_VIEW_PLATFORMS = ("cpu",)


@dataclasses.dataclass(frozen=True)
class Streamed(replica_slices.ReplicaSlices):
  """An array of a host-memory save whose pieces (`pieces`: its shards this process writes,
  still in host memory) are written in blocks of `rows` rows, each brought into host RAM only
  when it is written (`write`), instead of Orbax's copy of the whole array before its writes.
  Its local_shape is a block's, so the files' chunks tile the blocks (as the pieces' would)."""

  pieces: tuple = ()
  rows: int = 0

  @property
  def nbytes(self) -> int:
    return sum(piece.unsliced_data.nbytes for piece in self.pieces)

  def _block(self, piece, start: int, data: np.ndarray) -> replica_slices.ReplicaSlices:
    index = numpy_utils.resolve_slice(piece.index, self.global_shape)
    first = slice(index[0].start + start, index[0].start + start + data.shape[0])
    return replica_slices.ReplicaSlices(
        global_shape=self.global_shape, local_shape=self.local_shape, sharding=self.sharding,
        dtype=self.dtype, is_on_host=True, replica_slices=[replica_slices.ReplicaSlice(
            index=(first, *index[1:]), unsliced_data=data, slice_args=None)])

  async def write(self, write_on_host, tspec, **kwargs) -> None:
    """Writes each piece's blocks with Orbax's `write_on_host` (async_serialize_from_host): the
    first alone (it creates the array), then the rest, a piece at a time. A block comes into
    host RAM only under `_blocks_at_once()`, which all of a save's streamed arrays share, and
    is freed once written."""
    at_once = _blocks_at_once()
    for piece in self.pieces:
      rows = _Rows(piece.unsliced_data)

      async def one(start: int) -> None:
        async with at_once:
          await write_on_host(self._block(piece, start, rows.take(start, self.rows)), tspec,
                              **kwargs)

      try:
        starts = range(0, piece.unsliced_data.shape[0], self.rows)
        await one(starts[0])
        await asyncio.gather(*(one(start) for start in starts[1:]))
      finally:
        rows.close()


# The blocks of a save's streamed arrays in host RAM at once, shared by all of them: one
# semaphore per event loop (a save's writes run in one). A semaphore per array let each array
# written side by side hold three blocks while Orbax's byte limiter let three in all through.
# On the v5e host this did not change the tpu lane's `stacked` save (4.3 GB, seven arrays
# streamed through device memory, 64 MiB blocks): +1.10 GB with a semaphore per array, +1.13
# and +1.05 GB with one shared (2026-12-07); 32 MiB blocks then brought it to +0.72 GB
# (docs/offload.md).
_AT_ONCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def blocks_at_once() -> int:
  """How many blocks of a save's streamed arrays are in host RAM at once (fewer than
  HOST_STATE_WRITE_BYTES of them: TensorStore's writes in flight take that limit too)."""
  return max(1, HOST_STATE_WRITE_BYTES // HOST_STATE_BLOCK_BYTES - 1)


def read_blocks_at_once(block_bytes: int) -> int:
  """How many blocks of `block_bytes` a restore's read of one shard has in host RAM at once
  (read_in_blocks): fewer than HOST_STATE_READ_BYTES of them, one at least."""
  return max(1, HOST_STATE_READ_BYTES // block_bytes)


def _blocks_at_once() -> asyncio.Semaphore:
  count = blocks_at_once()
  loop = asyncio.get_running_loop()
  if loop not in _AT_ONCE or _AT_ONCE[loop][0] != count:  # the constants are tuned in tests
    _AT_ONCE[loop] = (count, asyncio.Semaphore(count))
  return _AT_ONCE[loop][1]


class _Rows:
  """A piece's rows in host RAM, a block at a time: slices of NumPy's view of its buffer
  (HOST_VIEW_PLATFORMS), else of one copy of it in device memory; where that copy does not fit,
  slices of one whole copy in host RAM (what Orbax makes)."""

  def __init__(self, data: jax.Array):
    self._view, self._device = None, None
    device = next(iter(data.devices()))
    if device.platform not in HOST_VIEW_PLATFORMS:
      try:
        self._device = jax.device_put(
            data, jax.sharding.SingleDeviceSharding(device, memory_kind="device"))
        self._device.block_until_ready()
      except jax.errors.JaxRuntimeError:  # out of device memory: the whole copy
        self._device = None
    if self._device is None:
      self._view = np.asarray(data)

  def take(self, start: int, rows: int) -> np.ndarray:
    if self._view is not None:
      return self._view[start:start + rows]
    with jax.set_mesh(None):  # a single device's program, whatever mesh the caller set
      return np.asarray(_take_rows(self._device, start, rows))

  def close(self) -> None:
    if self._device is not None:
      self._device.delete()
    self._view = self._device = None


@functools.partial(jax.jit, static_argnums=2)
def _take_rows(array, start, rows: int):
  return jax.lax.dynamic_slice_in_dim(array, start, rows, 0)


async def read_in_blocks(orbax_read, devices, index, t, *, global_shape, new_shard_shape,
                         dtype, byte_limiter, strict, dll, memory_kind):
  """Orbax's read of one shard of a restore (`serialization._read_array_index_and_device_put`),
  for a pinned_host target whose shard is larger than HOST_STATE_READ_BLOCK_BYTES, off
  HOST_VIEW_PLATFORMS: read a block of rows at a time (fewer than HOST_STATE_READ_BYTES of blocks
  in host RAM at once), each put into device memory, joined there and copied into host memory:
  never the whole shard in host RAM, nor NumPy's buffer beside its copy into host memory.
  Anything else (a reshaped or padded read, a layout, a shard that does not split into rows,
  device memory too small) is Orbax's."""
  def orbax():
    return orbax_read(devices, index, t, global_shape=global_shape,
                      new_shard_shape=new_shard_shape, dtype=dtype, byte_limiter=byte_limiter,
                      strict=strict, dll=dll, memory_kind=memory_kind)

  stored = np.dtype(t.dtype.numpy_dtype)
  shape = tuple(new_shard_shape)
  rows = block_rows(shape, max(stored.itemsize, np.dtype(dtype or stored).itemsize),
                    HOST_STATE_READ_BLOCK_BYTES)
  if (memory_kind != "pinned_host" or not strict or dll is not None or rows is None
      or tuple(t.shape) != tuple(global_shape)
      or any(d.platform in HOST_VIEW_PLATFORMS for d in devices)):
    return await orbax()
  index = numpy_utils.resolve_slice(index, tuple(global_shape))
  if tuple(sl.stop - sl.start for sl in index) != shape:
    return await orbax()
  at_once = asyncio.Semaphore(read_blocks_at_once(math.prod(shape[1:]) * rows * stored.itemsize))
  device = jax.sharding.SingleDeviceSharding(devices[0], memory_kind="device")

  async def block(start: int):
    async with at_once:
      piece = t[(slice(index[0].start + start, index[0].start + start + rows), *index[1:])]
      data = await piece.read()
      if dtype is not None:
        data = data.astype(dtype, copy=False)
      placed = jax.device_put(data, device)
      placed.block_until_ready()  # its host buffer is free once copied
      return placed

  try:
    blocks = await asyncio.gather(*(block(start) for start in range(0, shape[0], rows)))
    with jax.set_mesh(None):  # a single device's program (a restore runs in the run's mesh)
      whole = _join_rows(blocks) if len(blocks) > 1 else blocks[0]
    for b in blocks:
      if b is not whole:
        b.delete()
    result = [jax.device_put(whole, jax.sharding.SingleDeviceSharding(d, memory_kind=memory_kind))
              for d in devices]
    jax.block_until_ready(result)
    whole.delete()
  except jax.errors.JaxRuntimeError:  # out of device memory: Orbax's read
    return await orbax()
  return result, math.prod(shape) * stored.itemsize


@jax.jit
def _join_rows(blocks):
  return jax.numpy.concatenate(blocks, axis=0)


def streamed(array, replica_id, use_replica_parallel, min_slice_bytes=None,
             max_replicas=None) -> Streamed | None:
  """`array` (of a host-memory save) as a Streamed, where its pieces are larger than
  HOST_STATE_BLOCK_BYTES and split into blocks of rows; None: Orbax copies it whole."""
  if getattr(array.sharding, "memory_kind", None) != "pinned_host":
    return None
  pieces = replica_slices.get_replica_slices(array, replica_id, use_replica_parallel,
                                             min_slice_bytes, max_replicas)
  if not pieces.replica_slices or any(p.slice_args is not None for p in pieces.replica_slices):
    return None
  shape = tuple(pieces.local_shape)
  rows = block_rows(shape, np.dtype(pieces.dtype).itemsize, HOST_STATE_BLOCK_BYTES)
  if rows is None:
    return None
  return Streamed(global_shape=pieces.global_shape, local_shape=(rows, *shape[1:]),
                  sharding=pieces.sharding, dtype=pieces.dtype, is_on_host=True,
                  replica_slices=[], pieces=tuple(pieces.replica_slices), rows=rows)
