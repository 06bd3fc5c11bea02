"""What a checkpoint save or restore of a train state in host memory adds to host RAM: a batch.

A state in host memory (trainer.state_memory=host) already takes its bytes of host RAM; a save
or a restore must not take them again. These would:

- Orbax (0.12) copies every array of a save to host RAM before `save` returns and holds the
  copies until all are written. Its `save_device_host_concurrent_gb` option bounds the copies
  only for arrays that its ArrayHandler's callback calls deprioritized, which no handler that
  Orbax builds does; `Transfers` is that callback and `StateHandler` the handler that uses it.
- Each copy is `np.asarray` of the array (of its shard on each device), and JAX keeps that copy
  cached on the array object for as long as the array lives: the state's arrays live on after
  the save, so on a TPU host (where a pinned_host buffer is copied, not viewed) RAM grew by
  every byte written, and llm_1b's save (15.2 GB) ran the 40 GiB machine out of memory. On CPU
  the copy is a view and nothing grows. `drop_host_copies` frees those caches after each batch
  is written (`Transfers.on_write_end`); the arrays keep their buffers.
- TensorStore writes OCDBT data files of up to 2 GB (Orbax's default), each one chunk per array
  of up to that size, and holds a file's encoded chunks until it is written: three arrays of
  1.07 GB (llm_1b's MLP matrices scanned over its 16 layers; its embedding and the embedding's
  moments are 1.05 GB each) added 1.0-1.6 GB on CPU, where no copy is made. A host-memory save
  writes files of HOST_STATE_FILE_BYTES (its arrays chunked to fit): 0.23 GB, and 3x faster
  (14 s to 5 s for the three). It also writes HOST_STATE_FILE_WRITES files and encodes
  HOST_STATE_ENCODERS chunks at once (Orbax: 128 files, a chunk a core): on the v5e host (13
  cores, a disk slower than encoding) a save of two 1.07 GB arrays peaked at +2.99 GB with
  Orbax's concurrency and +2.24 GB with this, in the same time (2.5 s).
- Orbax frees a batch's copies only once the next batch is copied (its loop's variable holds
  them), so a save held two batches at once: llm_1b's, whose embedding and MLP matrices and
  their moments are twelve arrays of 1.05-1.07 GB, each copied alone, peaked at +2.17 GB on
  the v5e (bound: 1.48 GB). `Transfers` empties each batch's copies once it is written
  (`_Copies`), so a save holds one batch of HOST_STATE_SAVE_GB = 0.1 GB, or one larger array
  (on the v5e, a 4.46 GB state's save peaked at +0.48 GB with 0.1 GB batches, 0.75-1.11 GB
  with 0.25 GB batches and Orbax's concurrency).
- A restore reads every array at once by default (restore_concurrent_gb=96), and Orbax's
  limit on the bytes read at once counts a read only until its `device_put` is dispatched:
  a pinned_host placement is a copy on a TPU host, which holds the read buffer until it is
  done, so reads ran ahead of the copies. On the v5e, llm_1b's restore (a 14.8 GB state)
  peaked 6.7 GB above the RAM in use once it was done (a 4.46 GB state's: 0.78-1.43 GB
  beyond the state). A host-memory target was then read a group of HOST_STATE_SAVE_GB (or one
  larger array) at a time, each group's arrays placed before the next group was read. On the
  v5e (2026-12-07) llm_1b's restore then peaked at 22.26 GB in use, below the 22.52 GB of the
  steps after it, in 42.9 s (16-19 s before); the 4.46 GB state's took 0.07 GB beyond it.
- llm_1b's save still peaked 1.5-2.1 GB over its steps (bound 1.48 GB): each 1.05-1.07 GB
  array's whole copy, and what TensorStore holds of it until it is written. Writing the copy in
  blocks of rows, a few at once, left 1.66-2.55 GB (v5e, 2026-12-07: four saves), the copy
  itself still whole. An array larger than HOST_STATE_BLOCK_BYTES is now not copied: it is
  written a block of rows at a time, each brought into host RAM only when it is written
  (checkpoint_blocks.py): a view of the buffer on CPU; on a TPU or GPU host a slice of one copy
  of the array in device memory, which is free between steps. On the v5e (2026-12-07) llm_1b's
  saves then rose +1.27 and +1.22 GB (bound 1.48); the `tpu` lane's `stacked` state (4.3 GB,
  three 1.07 GB arrays) +1.05-1.13 GB of RSS (bound 1.0). With blocks of 32 MiB (since
  6f3ae8b; checkpoint_blocks.py) the `stacked` save rose +0.72 GB and llm_1b's +0.18/+0.26 GB
  (2026-12-07; its layers are unrolled on one chip, so every array over a block is streamed).
- The restore's mirror: a group of one large array held its whole read buffer and then its
  copy into host memory, one after the other (llm_1b's read beside its compile took 62.9 s for
  14.8 GB on the v5e, against 16-19 s when reads ran ahead). Off CPU, a shard larger than
  HOST_STATE_READ_BLOCK_BYTES is read a block of rows at a time, a few at once, each put into
  device memory, joined there and copied into host memory (checkpoint_blocks.py). On the v5e
  (2026-12-07) llm_1b's read beside its compile then peaked at 22.14 GB of RAM in use, under its
  steps' 22.20 GB (61.3 s); the `stacked` state restored 0.77 GB over the state (bound 1.0).
  A smaller shard goes through device memory whole (2026-12-08: NumPy into pinned_host ran at
  half the rate of NumPy through device memory on the v5e host): llm_1b's read alone 21.0 s
  against 29.6 s, at most 0.91 GB over its state.
- The copies and reads are NumPy buffers from malloc's arenas, which keep freed memory:
  `host_memory.release` gives it back after each batch and after a restore.

`python -m benchmarks.checkpoint_memory` measures it; tests/test_checkpoint_memory.py (CPU) and
tests/test_tpu_checkpoint_memory.py (the chip) bound it.
"""

from __future__ import annotations

import functools
import inspect
import time

import jax
import orbax.checkpoint as ocp
# Not exported by orbax.checkpoint 0.12: the order of a save's copies to host RAM (Transfers).
from orbax.checkpoint._src.metadata.array_metadata_store import Store as ArrayMetadataStore
from orbax.checkpoint._src.serialization import limits, replica_slices, serialization
from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
from orbax.checkpoint._src.serialization.types import (DefaultSerializationStatusCallback,
                                                       TransferPriority)

from trainer import checkpoint_blocks as blocks, host_memory
from trainer.checkpoint_files import DATA, STATE

# GB (10**9 bytes) of a state in host memory that a save copies off and writes at once
# (save_device_host_concurrent_gb), and that a restore reads at once; a larger array is copied
# or read alone.
HOST_STATE_SAVE_GB = 0.1
# OCDBT data file (and so chunk) size of a host-memory save: what TensorStore holds encoded
HOST_STATE_FILE_BYTES = 16 * 2**20
SMALL_BYTES = 2**20  # arrays of a host-memory state copied at once, before the batches
# TensorStore's concurrency in a host-memory save: data files written at once and chunks encoded
# at once (Orbax's: 128 files, one chunk a core), each holding a file's or a chunk's bytes
HOST_STATE_FILE_WRITES = 8
HOST_STATE_ENCODERS = 2
_ORBAX_CONCURRENT_GB = 96  # StandardCheckpointHandler's save_ and restore_concurrent_gb


def in_host_memory(state) -> bool:
  """Whether any array of `state` (or ShapeDtypeStruct with a sharding) lives in host memory
  (trainer.state_memory=host)."""
  return any(getattr(getattr(leaf, "sharding", None), "memory_kind", None) == "pinned_host"
             for leaf in jax.tree.leaves(state))


def drop_host_copies(arrays) -> None:
  """Frees the host copies that `np.asarray` left cached on `arrays` and on their per-device
  shards. Each array's storage is replaced by a fresh alias of the same device buffers (no data
  moves, donation still works), which holds no copy. Not in JAX's public API: jax is pinned and
  tests/test_tpu_checkpoint_memory.py fails on the chip if it stops freeing them."""
  for array in arrays:
    if not isinstance(array, jax.Array) or array.is_deleted():
      continue
    array.__dict__.pop("addressable_shards", None)  # its shards' arrays hold copies of their own
    array._replace_with(array._rewrap_with_aval_and_sharding(array.aval, array.sharding))  # pylint: disable=protected-access


_TRANSFER = inspect.signature(replica_slices.transfer_arrays_to_host)  # Orbax's, as it calls it


class _Copies:
  """While installed (a bounded save): Orbax's copies of a save's arrays to host RAM
  (`replica_slices.transfer_arrays_to_host`, which its save loop looks up for each save), kept
  so that `empty` can drop them once their batch is written (Orbax's loop holds the last
  batch's copies until the next batch is copied); arrays larger than HOST_STATE_BLOCK_BYTES
  are not copied but streamed (checkpoint_blocks.Streamed), through Orbax's write
  (`serialization.async_serialize_from_host`, looked up for each array's write)."""

  def __init__(self):
    self._made: list = []
    self._orbax = self._orbax_write = None

  def install(self) -> None:
    self._orbax, self._orbax_write = (replica_slices.transfer_arrays_to_host,
                                      serialization.async_serialize_from_host)

    def transfer(arrays, *args, **kwargs):
      given = _TRANSFER.bind(arrays, *args, **kwargs).arguments
      streamed = [blocks.streamed(a, given["replica_id"], given["use_replica_parallel"],
                                  given.get("min_slice_bytes_for_replica_parallel"),
                                  given.get("max_replicas_for_replica_parallel")) for a in arrays]
      rest = [a for a, s in zip(arrays, streamed) if s is None]
      copied = iter(self._orbax(rest, *args, **kwargs) if rest else ())
      result = [s if s is not None else next(copied) for s in streamed]
      self._made.extend(c for c in result if not isinstance(c, blocks.Streamed))
      return result

    async def write(value, tspec, **kwargs):
      if isinstance(value, blocks.Streamed):
        return await value.write(self._orbax_write, tspec, **kwargs)
      return await self._orbax_write(value, tspec, **kwargs)

    replica_slices.transfer_arrays_to_host = transfer
    serialization.async_serialize_from_host = write

  def uninstall(self) -> None:
    if self._orbax is not None:
      replica_slices.transfer_arrays_to_host = self._orbax
      serialization.async_serialize_from_host = self._orbax_write
    self._orbax = self._orbax_write = None
    self._made = []

  def empty(self) -> None:
    """Drops the NumPy copies held by the batches copied so far (written: Orbax reads them no
    more); the ReplicaSlices objects stay, with no slices."""
    for copies in self._made:
      copies.replica_slices.clear()
    self._made = []


class Transfers(DefaultSerializationStatusCallback):
  """When Orbax copies a save's arrays to host RAM, set by Checkpointer.save for each save.

  Default: every array before `save` returns, the copies held until all are written.
  `bound(state)`: in batches of at most HOST_STATE_SAVE_GB, each written (and its host copies
  freed) before the next is copied, in Orbax's background thread; the train step donates the
  state, so such a save finishes before `save` returns.
  """

  def __init__(self):
    self.state_arrays: list | None = None  # the arrays of a bounded save; None: Orbax's default
    self.ts_context = None  # a bounded save's TensorStore context; None: Orbax's
    self._small: set = set()  # tree paths of a bounded save's small arrays: copied at once
    self._written = False  # a batch was written since the copies were last freed
    self._copies = _Copies()  # a bounded save's copies, emptied as each batch is written

  @property
  def bounded(self) -> bool:
    return self.state_arrays is not None

  def bound(self, state) -> None:
    """Bounds the next save if `state` is in host memory. Its arrays of at most SMALL_BYTES
    (the step counter, norm scales) are copied at once, before `save` returns: Orbax warns on
    every save that has none."""
    paths = jax.tree_util.tree_flatten_with_path(state)[0] if in_host_memory(state) else None
    self.state_arrays = None if paths is None else [leaf for _, leaf in paths]
    self._small = {path for path, leaf in paths or ()
                   if getattr(leaf, "nbytes", SMALL_BYTES + 1) <= SMALL_BYTES}
    self.ts_context = None if paths is None else ts_utils.get_ts_context(
        use_ocdbt=True, file_io_concurrency_limit=HOST_STATE_FILE_WRITES,
        data_copy_concurrency_limit=HOST_STATE_ENCODERS)
    if paths is not None:
      self._copies.install()

  def finish(self) -> None:
    """After the save: frees what its last batch left and forgets the state."""
    self._copies.uninstall()
    if self.state_arrays is not None:
      drop_host_copies(self.state_arrays)
      host_memory.release()
    self.state_arrays, self._small, self.ts_context = None, set(), None

  def key_priority(self, keypath) -> TransferPriority:
    return (TransferPriority.ASYNCHRONOUS_DEPRIORITIZED
            if self.bounded and tuple(keypath) not in self._small
            else TransferPriority.SYNCHRONOUS)

  def on_transfer_end(self, _) -> None:
    self._written = False

  def on_write_end(self, _) -> None:
    """Called for each array of a batch once the batch is written: the first call frees the
    batch's copies (the next batch is copied only after the last call)."""
    if self.state_arrays is not None and not self._written:
      self._written = True
      self._copies.empty()
      drop_host_copies(self.state_arrays)
      host_memory.release()


class _Arrays(ocp.type_handlers.ArrayHandler):
  """Orbax's jax.Array handler, whose copies follow `transfers`; a bounded save's writes go
  through `transfers.ts_context` (one TensorStore context for all of the save's arrays); a
  restore into host memory reads under one budget of host RAM (`deserialize`)."""

  def __init__(self, transfers: Transfers):
    super().__init__(array_metadata_store=ArrayMetadataStore(), callback=transfers)
    self._transfers = transfers

  async def serialize(self, values, infos, args=None):
    if self._transfers.ts_context is not None:
      # Blocks (checkpoint_blocks.Streamed) written HOST_STATE_WRITE_BYTES at a time; an array
      # not split into blocks is written whole, alone (Orbax refuses a write over its limit).
      largest = max((blocks.fragment_bytes(v, blocks.HOST_STATE_BLOCK_BYTES) for v in values),
                    default=0)
      writes = limits.LimitInFlightBytes(max(blocks.HOST_STATE_WRITE_BYTES, largest + 1))
      for info in infos:
        info.ts_context, info.byte_limiter = self._transfers.ts_context, writes
    return await super().serialize(values, infos, args)

  async def deserialize(self, infos, args=None):
    """Orbax's; the reads of arrays restored into host memory share one budget of host RAM
    (checkpoint_blocks.ReadBudget: each read buffer held until its copy into host memory is
    done), and the freed read buffers are given back."""
    if args is None or not any(_memory_kind(arg) == "pinned_host" for arg in args):
      return await super().deserialize(infos, args)
    orbax_read = serialization._read_array_index_and_device_put  # pylint: disable=protected-access
    serialization._read_array_index_and_device_put = functools.partial(  # pylint: disable=protected-access
        blocks.read_bounded, orbax_read, blocks.ReadBudget())
    try:
      arrays = await super().deserialize(infos, args)
    finally:
      serialization._read_array_index_and_device_put = orbax_read  # pylint: disable=protected-access
    placing = time.perf_counter()
    jax.block_until_ready(arrays)
    _placing[0] += time.perf_counter() - placing
    host_memory.release()
    return arrays


_placing = [0.0]  # placing_seconds(), added to by _Arrays.deserialize


def placing_seconds() -> float:
  """Seconds this process's host-memory restores have waited, so far, for their copies into
  host memory once all read (trainer/early_restore.py records a resume's share)."""
  return _placing[0]


def _memory_kind(arg) -> str | None:
  return getattr(getattr(arg, "sharding", None), "memory_kind", None)


class StateHandler(ocp.StandardCheckpointHandler):
  """StandardSave/StandardRestore's handler (the same files and checks), whose jax.Array
  copies follow `transfers`: its PyTreeCheckpointHandler (`_impl`, which Orbax's own
  constructor makes without these options) gets save_device_host_concurrent_gb and an
  ArrayHandler that asks `transfers` (and reads a target in host memory under one budget of
  host RAM), and zstd-compresses the chunks it writes only with `compression`."""

  def __init__(self, transfers: Transfers, *, compression: bool):
    super().__init__()
    self._transfers = transfers
    arrays = _Arrays(transfers)
    self._registry = ocp.type_handlers.create_type_handler_registry(
        *[(ty, arrays if ty is jax.Array else ocp.type_handlers.get_type_handler(ty))
          for ty in ocp.type_handlers.supported_types()])
    self._impl = ocp.PyTreeCheckpointHandler(
        save_concurrent_gb=_ORBAX_CONCURRENT_GB, restore_concurrent_gb=_ORBAX_CONCURRENT_GB,
        save_device_host_concurrent_gb=HOST_STATE_SAVE_GB, type_handler_registry=self._registry,
        use_compression=compression)

  async def async_save(self, directory, item=None, save_args=None, args=None):
    """StandardCheckpointHandler's save; a bounded one (a state in host memory) in OCDBT files
    of HOST_STATE_FILE_BYTES."""
    if not self._transfers.bounded or args is None:
      return await super().async_save(directory, item, save_args, args)
    state = self._validate_save_state(args.item, save_args=args.save_args)
    return await self._impl.async_save(directory, args=ocp.args.PyTreeSave(
        item=state, save_args=args.save_args, custom_metadata=args.custom_metadata,
        ocdbt_target_data_file_size=HOST_STATE_FILE_BYTES))


def handlers(transfers: Transfers, *,
             compression: bool = True) -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  """A Checkpointer's items: the state (StandardSave/StandardRestore, StateHandler) and the
  data iterator's state (JsonSave/JsonRestore)."""
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  state, data = StateHandler(transfers, compression=compression), ocp.JsonCheckpointHandler()
  for args in (ocp.args.StandardSave, ocp.args.StandardRestore):
    registry.add(STATE, args, state)
  for args in (ocp.args.JsonSave, ocp.args.JsonRestore):
    registry.add(DATA, args, data)
  return registry
