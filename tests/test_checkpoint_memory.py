"""A save of a state in host memory copies it a batch at a time (trainer/checkpoint.py:_Transfers).

Measured by benchmarks/checkpoint_memory.py, one process per save: the peak of VmRSS during the
save minus VmRSS before it, over the state's bytes. On CPU, for a 0.2 GB pinned_host state,
Orbax's default save added 1.21x and the Checkpointer's with 0.02 GB batches 0.41x (for 0.44 GB:
1.0x and 0.31x).
"""

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
