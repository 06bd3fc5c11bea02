"""A save of a state in host memory copies it a batch at a time (trainer/checkpoint.py:_Transfers).

Measured by benchmarks/checkpoint_memory.py, one process per save: the peak of VmRSS during the
save minus VmRSS before it, over the state's bytes. On CPU, for a 0.2 GB pinned_host state,
Orbax's default save added 1.21x and the Checkpointer's with 0.02 GB batches 0.41x (for 0.44 GB:
1.0x and 0.31x).
"""

import contextlib

import pytest

from benchmarks.checkpoint_memory import run_variant


def test_host_state_save_adds_a_bounded_batch():
  default = run_variant("orbax_default", "pinned_host", gb=0.2)
  bounded = run_variant("checkpointer", "pinned_host", gb=0.2, bound_gb=0.02)
  assert bounded["extra_over_state"] <= 0.6, (default, bounded)
  assert default["extra_over_state"] >= bounded["extra_over_state"] + 0.2, (default, bounded)


def test_a_host_state_save_says_nothing_on_the_console(tmp_path, caplog):
  """Orbax warned 'No prioritized params found for saving' on every save of a state in host
  memory, and 'Waiting for previous save to complete took ...' about the save's own wait; the
  small arrays are copied at once now, and that wait is the run's own save_time_s record."""
  import logging  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
  state = {"step": jax.device_put(np.int32(1), host),
           "w": jax.device_put(np.ones((512, 1024), np.float32), host)}
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(keep=3))
  with caplog.at_level(logging.WARNING):
    for step in (1, 2):
      assert ckpt.save(step, state, {})
  ckpt.close()
  assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_host_state_save_writes_small_data_files(tmp_path):
  """TensorStore holds a data file's encoded chunks until it writes the file: Orbax's 2 GB
  files held 1.0-1.6 GB more for llm_1b's 1.07 GB arrays (CPU); a host-memory save writes
  files of HOST_STATE_FILE_BYTES (trainer/checkpoint_bounded.py), so a 48 MB array is several."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint  # pylint: disable=import-outside-toplevel
  from trainer.checkpoint_bounded import HOST_STATE_FILE_BYTES  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  w = rng.standard_normal((12, 1024, 1024), np.float32)
  files = {}
  for kind in ("device", "pinned_host"):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=kind)
    state = {"step": jax.device_put(np.int32(1), sharding), "w": jax.device_put(w, sharding)}
    ckpt = checkpoint.Checkpointer(tmp_path / kind, CheckpointConfig(keep=1))
    assert ckpt.save(1, state, {})
    ckpt.wait_until_finished()
    ckpt.close()
    files[kind] = sorted(f.stat().st_size for f in (tmp_path / kind).rglob("d/*") if f.is_file())
    restored = checkpoint.Checkpointer(tmp_path / kind, CheckpointConfig(keep=1)).restore(
        1, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state),
        jax.tree.map(lambda a: a.sharding, state))
    np.testing.assert_array_equal(np.asarray(restored.state["w"]), w)
  assert files["device"][-1] > 40e6  # Orbax's default: the array in one file
  # a file closes once it passes the target: at most the target and one 16 MiB chunk
  data = [n for n in files["pinned_host"] if n > 2**20]
  assert len(data) >= 2 and data[-1] <= 2 * HOST_STATE_FILE_BYTES, files


def test_a_recipes_state_is_built_either_way_with_its_shapes_and_memory():
  """benchmarks/checkpoint_memory.py --config: the recipe's train state, in host memory, filled
  by device_put (as a restore makes it) or by a jitted program (as a step does)."""
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks.checkpoint_memory import config_state  # pylint: disable=import-outside-toplevel
  made = {how: config_state("configs/llama.py:size=test", "pinned_host", how)
          for how in ("device_put", "jit")}
  assert made["device_put"].keys() == made["jit"].keys() and len(made["jit"]) > 20
  for key, a in made["jit"].items():
    b = made["device_put"][key]
    assert (a.shape, a.dtype, a.sharding) == (b.shape, b.dtype, b.sharding), key
  host = sum(a.nbytes for a in made["jit"].values() if a.sharding.memory_kind == "pinned_host")
  assert host > 0.99 * sum(a.nbytes for a in made["jit"].values())  # all but the step counter
  assert any(float(jax.numpy.abs(a).sum()) > 0 for a in made["jit"].values())


def test_a_host_state_save_writes_few_files_at_once(tmp_path, monkeypatch):
  """On the v5e host, TensorStore's 128 data files written at once (Orbax's) held 0.75 GB more
  than 8 in a save of two 1.07 GB arrays: a host-memory save's writes go through a context of
  HOST_STATE_FILE_WRITES files and HOST_STATE_ENCODERS chunks at once; a device state's keep
  Orbax's. What the writes get is read where Orbax hands it to TensorStore."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from orbax.checkpoint._src.serialization import serialization  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint  # pylint: disable=import-outside-toplevel
  from trainer.checkpoint_bounded import (HOST_STATE_ENCODERS,  # pylint: disable=import-outside-toplevel
                                          HOST_STATE_FILE_WRITES)
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  seen: dict[str, list] = {}
  write = serialization.async_serialize_from_host

  async def recording(value, tspec, *args, context=None, **kwargs):
    spec = context.spec.to_json() if context is not None else {}
    seen.setdefault(kind, []).append((spec.get("file_io_concurrency", {}).get("limit"),
                                      spec.get("data_copy_concurrency", {}).get("limit")))
    return await write(value, tspec, *args, context=context, **kwargs)

  monkeypatch.setattr(serialization, "async_serialize_from_host", recording)
  for kind in ("device", "pinned_host"):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=kind)
    state = {"step": jax.device_put(np.int32(1), sharding),
             "w": jax.device_put(np.ones((256, 1024), np.float32), sharding)}
    ckpt = checkpoint.Checkpointer(tmp_path / kind, CheckpointConfig(keep=1))
    assert ckpt.save(1, state, {})
    ckpt.wait_until_finished()
    ckpt.close()
  assert set(seen["pinned_host"]) == {(HOST_STATE_FILE_WRITES, HOST_STATE_ENCODERS)}, seen
  assert len(seen["pinned_host"]) == 2 and (HOST_STATE_FILE_WRITES, HOST_STATE_ENCODERS) not in seen["device"], seen


def _host_state(shapes):
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
  rng = np.random.default_rng(0)
  state = {"step": jax.device_put(np.int32(1), host)}
  for i, shape in enumerate(shapes):
    state[f"w{i}"] = jax.device_put(rng.standard_normal(shape, np.float32), host)
  return state


def _restores_bit_for_bit(folder, state, views=None) -> None:
  """Restores step 1 of `folder` onto `state`'s shapes and shardings and checks every array
  against `views` (default: `state` itself), bit for bit and in host memory."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  restored = checkpoint.Checkpointer(folder, CheckpointConfig(keep=1)).restore(
      1, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state),
      jax.tree.map(lambda a: a.sharding, state))
  for key, value in (views or state).items():
    np.testing.assert_array_equal(np.asarray(restored.state[key]), np.asarray(value))
    assert restored.state[key].sharding.memory_kind == "pinned_host"


def test_a_host_state_save_drops_each_batchs_copies_before_the_next_is_made(tmp_path,
                                                                            monkeypatch):
  """Orbax's save loop held the last batch's copies while it copied the next: llm_1b's save
  held two 1.07 GB arrays at once on the v5e (+2.17 GB). When each copy is made, no earlier
  copy may still be alive (weak references to Orbax's NumPy copies)."""
  import weakref  # pylint: disable=import-outside-toplevel

  from orbax.checkpoint._src.serialization import replica_slices  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint, checkpoint_bounded  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(checkpoint_bounded, "HOST_STATE_SAVE_GB", 4.2e-3)  # one array a batch
  made, alive_at_copy = [], []
  orbax_transfer = replica_slices.transfer_arrays_to_host

  def transfer(*args, **kwargs):
    alive_at_copy.append(sum(ref().nbytes for ref in made if ref() is not None))
    copies = orbax_transfer(*args, **kwargs)
    made.extend(weakref.ref(s.unsliced_data) for c in copies for s in c.replica_slices)
    return copies

  monkeypatch.setattr(replica_slices, "transfer_arrays_to_host", transfer)
  state = _host_state([(1024, 1024)] * 3)  # 4.2 MB each
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(keep=1))
  assert ckpt.save(1, state, {})
  ckpt.close()
  assert len(alive_at_copy) == 4, alive_at_copy  # the step counter at once, then one a batch
  assert alive_at_copy == [0, 0, 0, 0], alive_at_copy
  assert replica_slices.transfer_arrays_to_host is transfer  # put back after the save


def test_a_host_state_restore_holds_a_bounded_budget_of_reads_until_each_is_placed(
    tmp_path, monkeypatch):
  """Orbax counts a restore's read against its limit only until the read's device_put is
  dispatched; on a TPU host the copy into host memory holds the buffer until it is done, and
  llm_1b's restore peaked 6.7 GB above the RAM in use once it was done. A restore into host
  memory holds read buffers of at most HOST_STATE_READ_BYTES at once, all its arrays together
  (a larger one alone), each from its read until its copy is done; reads run side by side
  under that budget (one group after another took llm_1b's 14.8 GB 59 s on the v5e)."""
  import asyncio  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from orbax.checkpoint._src.serialization import serialization  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint, checkpoint_blocks  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  state = _host_state([(256, 1024)] * 4 + [(2048, 1024)] + [(256, 1024)] * 2)  # 1 MB; 8 MB
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(keep=1))
  assert ckpt.save(1, state, {})
  ckpt.close()
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_READ_BYTES", int(2.2e6))  # two 1 MB reads
  held = {"now": [], "most": 0, "with_large": 0}
  orbax_read, placed = serialization._read_array_index_and_device_put, checkpoint_blocks._placed  # pylint: disable=protected-access

  async def read(devices, index, t, **kwargs):
    nbytes = int(np.prod(kwargs["new_shard_shape"])) * 4
    held["now"].append(nbytes)
    held["most"] = max(held["most"], len(held["now"]))
    if nbytes == 2048 * 1024 * 4:
      held["with_large"] = max(held["with_large"], len(held["now"]))
    await asyncio.sleep(0.02)  # a slow read: the others wait for the budget, not for it
    return await orbax_read(devices, index, t, **kwargs)

  async def placing(arrays):
    out = await placed(arrays)
    held["now"].remove(sum(a.nbytes for a in jax.tree.leaves(arrays)))
    return out

  monkeypatch.setattr(serialization, "_read_array_index_and_device_put", read)
  monkeypatch.setattr(checkpoint_blocks, "_placed", placing)
  _restores_bit_for_bit(tmp_path / "checkpoints", state)
  assert held["now"] == [] and held["with_large"] == 1, held  # all placed; the 8 MB alone
  assert held["most"] == 3, held  # two 1 MB reads and the 4-byte step side by side
  assert serialization._read_array_index_and_device_put is read  # pylint: disable=protected-access


def test_a_restore_reads_its_shards_through_device_memory_a_few_at_once(tmp_path, monkeypatch):
  """Off CPU (forced here with HOST_VIEW_PLATFORMS empty) a shard larger than a read block is
  read a block of rows at a time through device memory, where it is joined whole: at most
  READ_SHARDS_AT_ONCE such shards at once (device memory); a smaller shard goes through device
  memory whole (NumPy -> pinned_host ran at half the rate on the v5e), READ_WHOLE_AT_ONCE at
  once; all blocks in host RAM under the restore's one budget (host RAM), all read back bit for
  bit."""
  import asyncio  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint, checkpoint_blocks  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  # four arrays of 4 MB (4 blocks of 1 MiB each) and six of one block
  state = _host_state([(1024, 1024)] * 4 + [(256, 1024)] * 6)
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(keep=1))
  assert ckpt.save(1, state, {})
  ckpt.close()
  monkeypatch.setattr(checkpoint_blocks, "HOST_VIEW_PLATFORMS", ())
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_READ_BLOCK_BYTES", 2**20)
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_READ_BYTES", 3 * 2**20 + 1)
  monkeypatch.setattr(checkpoint_blocks, "READ_WHOLE_AT_ONCE", 3)
  count = {kind: {"now": 0, "most": 0, "all": 0} for kind in ("split", "whole")}
  blocks = {"now": 0, "most": 0}
  read_rows, placed = checkpoint_blocks._read_rows, checkpoint_blocks._placed  # pylint: disable=protected-access

  async def rows(*args):
    shards = count["whole" if args[5] == args[4][0] else "split"]  # rows == the shard's rows
    shards["now"] += 1
    shards["all"] += 1
    shards["most"] = max(shards["most"], shards["now"])
    try:
      await asyncio.sleep(0.02)
      return await read_rows(*args)
    finally:
      shards["now"] -= 1

  async def placing(arrays):
    if not isinstance(arrays, list):  # a block put into device memory
      blocks["now"] += 1
      blocks["most"] = max(blocks["most"], blocks["now"])
      await asyncio.sleep(0.01)
      blocks["now"] -= 1
    return await placed(arrays)

  monkeypatch.setattr(checkpoint_blocks, "_read_rows", rows)
  monkeypatch.setattr(checkpoint_blocks, "_placed", placing)
  _restores_bit_for_bit(tmp_path / "checkpoints", state)
  assert count["split"] == {"now": 0, "most": checkpoint_blocks.READ_SHARDS_AT_ONCE, "all": 4}
  assert count["whole"] == {"now": 0, "most": 3, "all": 6}, count  # the step is Orbax's
  assert blocks == {"now": 0, "most": 3}, blocks  # 1 MiB blocks under a budget of 3 MiB + 1


def test_a_host_state_save_writes_a_large_array_in_blocks_a_few_at_once(tmp_path, monkeypatch):
  """TensorStore encoded a whole array's chunks ahead of the v5e host's disk and held them until
  written: each of llm_1b's 1.05 GB arrays climbed about 1 GB over its copy (a save +2.09 GB
  over the steps; bound 1.48). A host-memory save writes an array larger than
  HOST_STATE_BLOCK_BYTES in blocks of rows (views of its copy), with HOST_STATE_WRITE_BYTES of
  them written at once; the restore reads it back bit for bit."""
  from orbax.checkpoint._src.serialization import limits  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint, checkpoint_blocks  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_BLOCK_BYTES", 2**20)
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_WRITE_BYTES", 3 * 2**20)
  writes, flight = [], {"now": 0, "most": 0}
  orbax_reserved = limits.reserved_bytes

  @contextlib.asynccontextmanager
  async def reserved(limiter, nbytes):
    async with orbax_reserved(limiter, nbytes):  # waits while the limit is taken
      writes.append(nbytes)
      flight["now"] += nbytes
      flight["most"] = max(flight["most"], flight["now"])
      try:
        yield
      finally:
        flight["now"] -= nbytes

  monkeypatch.setattr(limits, "reserved_bytes", reserved)
  state = _host_state([(2048, 1024), (256, 1024)])  # 8 MB, 1 MB
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(keep=1))
  assert ckpt.save(1, state, {})
  ckpt.close()
  assert sorted(writes) == [4] + [2**20] * 9, writes  # the step counter; 8 blocks; the 1 MB array
  assert flight["most"] <= 3 * 2**20, flight
  _restores_bit_for_bit(tmp_path / "checkpoints", state)


@pytest.mark.parametrize("source", ["view", "device"])
def test_a_streamed_array_is_written_a_block_at_a_time_from_its_view_or_a_device_copy(
    tmp_path, monkeypatch, source):
  """Orbax copies a save's array whole into host RAM before writing it: on a TPU host a
  pinned_host buffer's copy (llm_1b's 1.07 GB arrays: +1.7-2.5 GB over the steps, bound 1.48).
  An array larger than HOST_STATE_BLOCK_BYTES is written in blocks of rows, each brought into
  host RAM when it is written: a slice of NumPy's view of the buffer where NumPy views it (CPU),
  else of one copy in device memory (TPU, GPU; forced here with HOST_VIEW_PLATFORMS empty). A
  piece whose rows do not divide into such blocks is written in blocks of fewer rows; the
  restore reads it all back bit for bit: off CPU (the device source) a block of rows at a time
  too, each put into device memory and joined there before its copy into host memory."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from orbax.checkpoint._src.serialization import serialization  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint, checkpoint_blocks  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_BLOCK_BYTES", 2**20)
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_WRITE_BYTES", 4 * 2**20)
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_READ_BLOCK_BYTES", 2**20)
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_READ_BYTES", 4 * 2**20)
  if source == "device":
    monkeypatch.setattr(checkpoint_blocks, "HOST_VIEW_PLATFORMS", ())
  blocks, orbax_write = [], serialization.async_serialize_from_host

  async def write(value, tspec, **kwargs):  # what Orbax is given to write, once streamed
    blocks.extend(s.unsliced_data for s in value.replica_slices)
    return await orbax_write(value, tspec, **kwargs)

  monkeypatch.setattr(serialization, "async_serialize_from_host", write)
  state = _host_state([(1536, 1024), (7, 3 * 2**16)])  # 6 MB in 1 MiB blocks; 7 rows of 0.75 MiB
  views = {key: np.asarray(value) for key, value in state.items()}
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(keep=1))
  assert ckpt.save(1, state, {})
  ckpt.close()
  assert serialization.async_serialize_from_host is write  # put back after the save
  large = sorted(b.shape for b in blocks if b.nbytes > 4)
  assert large == [(1, 3 * 2**16)] * 7 + [(256, 1024)] * 6, large
  shared = [any(np.shares_memory(b, v) for v in views.values()) for b in blocks if b.nbytes > 4]
  assert all(shared) if source == "view" else not any(shared), shared
  joined, join = [], checkpoint_blocks._join_rows  # pylint: disable=protected-access
  monkeypatch.setattr(checkpoint_blocks, "_join_rows", lambda b: joined.append(len(b)) or join(b))
  _restores_bit_for_bit(tmp_path / "checkpoints", state, views)
  # The restore reads the large arrays a block at a time through device memory off CPU
  assert sorted(joined) == ([] if source == "view" else [6, 7]), joined


def test_a_saves_streamed_arrays_share_their_blocks_in_host_ram(tmp_path, monkeypatch):
  """Blocks of all of a save's streamed arrays in host RAM at once (taken, not yet written): at
  most HOST_STATE_WRITE_BYTES // HOST_STATE_BLOCK_BYTES - 1, however many arrays are written
  side by side (a semaphore per array let each hold that many). Written slowly here, so that
  the arrays' writes overlap; off CPU (a copy in device memory, the blocks brought back)."""
  import asyncio  # pylint: disable=import-outside-toplevel

  from orbax.checkpoint._src.serialization import serialization  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint, checkpoint_blocks  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_BLOCK_BYTES", 2**20)
  monkeypatch.setattr(checkpoint_blocks, "HOST_STATE_WRITE_BYTES", 4 * 2**20)
  monkeypatch.setattr(checkpoint_blocks, "HOST_VIEW_PLATFORMS", ())
  held, take = {"now": 0, "most": 0}, checkpoint_blocks._Rows.take  # pylint: disable=protected-access
  orbax_write = serialization.async_serialize_from_host

  def taken(rows, start, count):
    held["now"] += 1
    held["most"] = max(held["most"], held["now"])
    return take(rows, start, count)

  async def write(value, tspec, **kwargs):
    streamed = any(s.unsliced_data.nbytes == 2**20 for s in value.replica_slices)
    try:
      await asyncio.sleep(0.02)
      return await orbax_write(value, tspec, **kwargs)
    finally:
      held["now"] -= streamed

  monkeypatch.setattr(checkpoint_blocks._Rows, "take", taken)  # pylint: disable=protected-access
  monkeypatch.setattr(serialization, "async_serialize_from_host", write)
  state = _host_state([(1024, 1024)] * 3)  # three arrays of 4 MB: 4 blocks of 1 MiB each
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(keep=1))
  assert ckpt.save(1, state, {})
  ckpt.close()
  assert held == {"now": 0, "most": 3}, held


def test_a_sharded_host_state_saves_and_restores_in_blocks_inside_the_mesh(tmp_path):
  """Blocks of sharded and replicated arrays on 4 devices, saved and restored onto another
  layout inside the run's mesh (jax.set_mesh: a single device's slicing or joining program
  must not take the mesh's devices), from the buffers' views and through device memory."""
  import json  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  from tests.conftest import ROOT, _env  # pylint: disable=import-outside-toplevel
  done = subprocess.run([sys.executable, "-m", "tests.checkpoint_blocks_worker", str(tmp_path)],
                        cwd=ROOT, env=_env(None, 4), capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads(done.stdout.strip().splitlines()[-1]) == {"view": True, "device": True}
