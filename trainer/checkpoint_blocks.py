"""A host-memory save's and restore's large arrays, a block of rows at a time
(trainer/checkpoint_bounded.py uses them; its docstring has the measurements).

A save hands Orbax's write an array whose pieces are larger than HOST_STATE_BLOCK_BYTES as a
`Streamed`: each block of rows is brought into host RAM only when it is written, instead of
Orbax's copy of the whole array first. A restore's reads share one `ReadBudget` of host RAM,
each read holding its part until its copy into host memory is done (`read_bounded`); off CPU a
shard larger than HOST_STATE_READ_BLOCK_BYTES is read a block at a time through device memory,
instead of a whole read buffer and its copy into host memory, and a smaller one whole through
device memory (twice as fast into host memory as NumPy's buffer put there directly, on the
v5e). On CPU (HOST_VIEW_PLATFORMS) a save's blocks are views of the buffers and a restore's
reads are Orbax's own, each held in the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import weakref

import jax
import numpy as np
from orbax.checkpoint._src.arrays import numpy_utils
from orbax.checkpoint._src.serialization import limits, replica_slices

from trainer import host_memory

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
# A restore into host memory holds read buffers of fewer than HOST_STATE_READ_BYTES at once, all
# its arrays together (ReadBudget), each until its copy into host memory is done; off CPU it reads
# a shard larger than HOST_STATE_READ_BLOCK_BYTES in blocks of rows of at most that, through
# device memory, READ_SHARDS_AT_ONCE such shards at once (`read_bounded`). READ_RELEASE_BYTES:
# read bytes freed between two givebacks of the heap (host_memory.release).
# A shard of at most HOST_STATE_READ_BLOCK_BYTES goes the same way whole, READ_WHOLE_AT_ONCE at
# once: on the v5e host NumPy -> pinned_host ran 0.45-0.54 GB/s and NumPy -> device -> pinned_host
# 1.0-1.3 GB/s (64 MiB arrays, .chip/xfer2.py, 2026-12-08); llm_1b's state is mostly 64 MiB shards.
HOST_STATE_READ_BLOCK_BYTES = 64 * 2**20
HOST_STATE_READ_BYTES = 4 * HOST_STATE_READ_BLOCK_BYTES
READ_SHARDS_AT_ONCE = 2
READ_WHOLE_AT_ONCE = 8
READ_RELEASE_BYTES = 2**30


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


class ReadBudget:
  """A restore's reads into host memory, all of them together: read buffers of fewer than
  HOST_STATE_READ_BYTES in host RAM at once (a larger one alone), each held until its copy into
  host memory is done; READ_SHARDS_AT_ONCE shards read a block at a time through device memory
  at once, and READ_WHOLE_AT_ONCE smaller ones whole. Made inside the restore's event loop; its
  waits for copies run in threads, so the loop goes on reading meanwhile."""

  def __init__(self):
    self.limit = HOST_STATE_READ_BYTES
    self._bytes = limits.LimitInFlightBytes(self.limit)
    self.shards = asyncio.Semaphore(READ_SHARDS_AT_ONCE)
    self.wholes = asyncio.Semaphore(READ_WHOLE_AT_ONCE)
    self._freed = 0  # bytes released since the heap was last given back

  @contextlib.asynccontextmanager
  async def held(self, nbytes: int):
    """Holds `nbytes` of the budget while the block runs (all of it for a read that large:
    Orbax's limiter keeps what it holds under its limit)."""
    nbytes = max(1, min(int(nbytes), self.limit - 1))
    await self._bytes.wait_for_bytes(nbytes)
    try:
      yield
    finally:
      await self._bytes.release_bytes(nbytes)
      self._freed += nbytes
      if self._freed >= READ_RELEASE_BYTES:  # freed read buffers stay in malloc's arenas
        self._freed = 0
        host_memory.release()


async def _placed(arrays):
  """`arrays` once their copies are done, waited for in a thread (the event loop reads on)."""
  await asyncio.to_thread(jax.block_until_ready, arrays)
  return arrays


async def read_bounded(orbax_read, budget: ReadBudget, devices, index, t, *, global_shape,
                       new_shard_shape, dtype, byte_limiter, strict, dll, memory_kind):
  """Orbax's read of one shard of a restore (`serialization._read_array_index_and_device_put`)
  under `budget`, for a pinned_host target: the shard's read buffer held in the budget until
  its copy into host memory is done (Orbax lets it go once the copy is dispatched, and the copy
  holds the buffer until done). Off HOST_VIEW_PLATFORMS, a shard larger than
  HOST_STATE_READ_BLOCK_BYTES is read a block of rows at a time (`_read_rows`), and a smaller
  one as one block. Other targets are Orbax's alone."""
  def orbax():
    return orbax_read(devices, index, t, global_shape=global_shape,
                      new_shard_shape=new_shard_shape, dtype=dtype, byte_limiter=byte_limiter,
                      strict=strict, dll=dll, memory_kind=memory_kind)

  if memory_kind != "pinned_host":
    return await orbax()
  stored = np.dtype(t.dtype.numpy_dtype)
  shape = tuple(new_shard_shape)
  itemsize = max(stored.itemsize, np.dtype(dtype or stored).itemsize)
  rows = block_rows(shape, itemsize, HOST_STATE_READ_BLOCK_BYTES)
  whole = (rows is None and bool(shape)
           and 0 < math.prod(shape) * itemsize <= HOST_STATE_READ_BLOCK_BYTES)
  if whole:
    rows = shape[0]  # the shard as one block
  resolved = numpy_utils.resolve_slice(index, tuple(global_shape))
  if (strict and dll is None and rows is not None and tuple(t.shape) == tuple(global_shape)
      and not any(d.platform in HOST_VIEW_PLATFORMS for d in devices)
      and tuple(sl.stop - sl.start for sl in resolved) == shape):
    try:
      async with budget.wholes if whole else budget.shards:
        return await _read_rows(budget, devices, resolved, t, shape, rows, stored, dtype,
                                itemsize)
    except jax.errors.JaxRuntimeError:  # out of device memory: Orbax's read
      pass
  async with budget.held(math.prod(shape) * itemsize):
    result, nbytes = await orbax()
    return await _placed(result), nbytes


async def _read_rows(budget, devices, index, t, shape, rows, stored, dtype, itemsize):
  """One shard, a block of `rows` rows at a time, each held in `budget` (at the larger of the
  stored and the restored itemsize) until put into device memory; joined there and copied into
  host memory: never the whole shard in host RAM, nor NumPy's buffer beside its copy into host
  memory."""
  device = jax.sharding.SingleDeviceSharding(devices[0], memory_kind="device")
  block_bytes = math.prod(shape[1:]) * rows * itemsize

  async def block(start: int):
    async with budget.held(block_bytes):
      piece = t[(slice(index[0].start + start, index[0].start + start + rows), *index[1:])]
      data = await piece.read()
      if dtype is not None:
        data = data.astype(dtype, copy=False)
      return await _placed(jax.device_put(data, device))  # its host buffer is free once copied

  parts = await asyncio.gather(*(block(start) for start in range(0, shape[0], rows)))
  with jax.set_mesh(None):  # a single device's program (a restore runs in the run's mesh)
    whole = _join_rows(parts) if len(parts) > 1 else parts[0]
  for part in parts:
    if part is not whole:
      part.delete()
  result = await _placed([jax.device_put(
      whole, jax.sharding.SingleDeviceSharding(d, memory_kind="pinned_host")) for d in devices])
  whole.delete()
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
