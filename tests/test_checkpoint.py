"""trainer/checkpoint.py on small pytrees: keep/GC policy, restore_step, validation before reads,
the checks made before a run writes anything, write_initial/load_params."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from core.registry import ConfigError
from tests.conftest import ROOT, xla_flags
from trainer import checkpoint, checkpoint_files
from trainer.config import CheckpointConfig


def _state(step: int) -> dict:
  return {"step": jnp.int32(step), "params": {"w": jnp.full((4, 3), float(step))},
          "opt_state": {"mu": jnp.full((4, 3), -float(step))}}


def _shardings(tree):
  one = NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",)), PartitionSpec())
  return jax.tree.map(lambda _: one, tree)


def _save_every_10(ckpt, upto: int, start: int = 10) -> list[list[int]]:
  seen = []
  for step in range(start, upto + 1, 10):
    assert ckpt.save(step, _state(step), {"step": step})
    ckpt.wait_until_finished()
    seen.append(ckpt.all_steps())
  return seen


def test_keep_latest_and_every_n(tmp_path):
  cfg = CheckpointConfig(every_steps=10, keep=2, keep_every_steps=20)
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", cfg)
  assert ckpt.due(10) and not ckpt.due(15)
  seen = _save_every_10(ckpt, 60)
  assert seen == [[10], [10, 20], [20, 30], [20, 30, 40], [20, 40, 50], [20, 40, 50, 60]]
  assert not ckpt.save(60, _state(60), {})  # already on disk
  ckpt.close()
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["20", "40", "50", "60"]
  # A later process (a resumed run) applies the same policy to what it finds.
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", cfg)
  assert _save_every_10(ckpt, 70, start=70) == [[20, 40, 60, 70]]
  ckpt.close()


def test_keep_one(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, CheckpointConfig(every_steps=10, keep=1))
  assert _save_every_10(ckpt, 30) == [[10], [20], [30]]
  ckpt.close()


def test_a_save_commits_only_when_the_commit_lock_is_free(tmp_path):
  """Saves commit under checkpoint_files' lock, which a process about to exit takes for good
  (final_committed_steps): a save that finishes its writes meanwhile stays in its temporary
  folder, so the steps listed before the exit are the steps the exit leaves."""
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every_steps=10))
  with checkpoint_files._COMMITS:  # pylint: disable=protected-access
    assert ckpt.save(10, _state(10), {"step": 10})
    deadline = time.monotonic() + 60
    while not list((tmp_path / "checkpoints").glob("10.orbax-checkpoint-tmp*")):
      assert time.monotonic() < deadline
      time.sleep(0.05)
    time.sleep(1.0)  # the writes of these few bytes end; without the lock the commit follows
    assert checkpoint_files.committed_steps(tmp_path / "checkpoints") == []
  ckpt.wait_until_finished()
  assert checkpoint_files.committed_steps(tmp_path / "checkpoints") == [10]
  ckpt.close()


def test_restore_step_and_set_aside(tmp_path):
  cfg = CheckpointConfig(every_steps=10, keep=5)
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", cfg)
  _save_every_10(ckpt, 30)
  abstract = jax.eval_shape(lambda: _state(0))
  restored = ckpt.restore_newest(abstract, _shardings(abstract), at_most=20)
  assert restored.step == 20 and restored.data_state == {"step": 20}
  np.testing.assert_array_equal(restored.state["params"]["w"], np.full((4, 3), 20.0))
  assert ckpt.set_aside([30]) == tmp_path / checkpoint.SUPERSEDED
  assert ckpt.all_steps() == [10, 20]
  assert (tmp_path / checkpoint.SUPERSEDED / "30" / "state").is_dir()
  assert ckpt.save(30, _state(31), {"step": 31})  # the step can be written again
  ckpt.wait_until_finished()
  assert ckpt.restore(30, abstract, _shardings(abstract)).data_state == {"step": 31}
  with pytest.raises(checkpoint.CheckpointError, match="restore_step=25 is not a committed"):
    ckpt.restore_newest(abstract, _shardings(abstract), at_most=25)
  ckpt.close()


def test_compression_off_writes_the_arrays_as_they_are_and_either_kind_restores(tmp_path):
  """checkpoint.compression: 1 MB of zeros zstd-compresses to almost nothing, and without
  compression takes its own size on disk; a Checkpointer of either setting restores both
  checkpoints bit for bit (only new saves follow the setting)."""
  state = {"step": jnp.int32(7), "params": {"w": jnp.zeros((512, 512))},
           "opt_state": {"mu": jnp.arange(12.0).reshape(4, 3)}}
  abstract = jax.eval_shape(lambda: state)
  sizes = {}
  for compression in (True, False):
    ckpt = checkpoint.Checkpointer(tmp_path / str(compression),
                                   CheckpointConfig(compression=compression))
    assert ckpt.save(7, state, {"step": 7})
    ckpt.close()
    sizes[compression] = sum(p.stat().st_size for p in (tmp_path / str(compression)).rglob("*")
                             if p.is_file())
  assert sizes[True] < 100_000 < 1_048_576 < sizes[False], sizes
  for compression in (True, False):
    for written in (True, False):
      ckpt = checkpoint.Checkpointer(tmp_path / str(written),
                                     CheckpointConfig(compression=compression))
      restored = ckpt.restore(7, abstract, _shardings(abstract))
      ckpt.close()
      jax.tree.map(np.testing.assert_array_equal, restored.state, state)


def test_deleted_manifest_falls_back(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every_steps=10))
  _save_every_10(ckpt, 20)
  ckpt.close()
  (tmp_path / "checkpoints" / "20" / "state" / "manifest.ocdbt").unlink()
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every_steps=10))
  abstract = jax.eval_shape(lambda: _state(0))
  said = []
  restored = ckpt.restore_newest(abstract, _shardings(abstract), warn=said.append)
  assert restored.step == 10
  assert len(said) == 1 and "20 is unreadable (state/manifest.ocdbt is missing)" in said[0]
  assert "falling back to step 10" in said[0]
  assert ckpt.all_steps() == [10]
  ckpt.close()


def test_an_entry_named_like_a_step_that_is_no_folder_is_set_aside(tmp_path):
  """A file and a link to nothing where steps 30 and 40 would go: Orbax lists neither, and its
  save of the step would write over it. Both are moved to corrupt_checkpoints/ with the
  warning an unreadable checkpoint gets; the steps are saved afresh beside them."""
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every_steps=10))
  _save_every_10(ckpt, 20)
  (tmp_path / "checkpoints" / "30").write_text("x\n")
  (tmp_path / "checkpoints" / "40").symlink_to(tmp_path / "nowhere")
  abstract = jax.eval_shape(lambda: _state(0))
  said = []
  assert ckpt.restore_newest(abstract, _shardings(abstract), warn=said.append).step == 20
  aside = tmp_path / checkpoint.QUARANTINE
  assert said == [
      f"checkpoint {tmp_path / 'checkpoints' / '30'} is unreadable (a file, not a checkpoint "
      f"folder); moved it to {aside / '30'}",
      f"checkpoint {tmp_path / 'checkpoints' / '40'} is unreadable (a link to nothing); moved "
      f"it to {aside / '40'}"]
  _save_every_10(ckpt, 40, start=30)
  assert ckpt.restore(40, abstract, _shardings(abstract)).data_state == {"step": 40}
  assert (aside / "30").read_text() == "x\n" and (aside / "40").is_symlink()
  ckpt.close()


def test_write_initial_then_load_params(tmp_path):
  checkpoint.write_initial(tmp_path / "converted", _state(7))
  abstract = jax.eval_shape(lambda: _state(0)["params"])
  params = checkpoint.load_params(tmp_path / "converted", abstract, _shardings(abstract))
  assert set(params) == {"w"}
  np.testing.assert_array_equal(params["w"], np.full((4, 3), 7.0))
  with pytest.raises(checkpoint.CheckpointError, match="no checkpoints"):
    checkpoint.load_params(tmp_path / "missing", abstract, _shardings(abstract))


def test_sigkill_during_save_keeps_committed(tmp_path):
  code = f"""
import os, signal
import jax.numpy as jnp
from trainer.checkpoint import Checkpointer
from trainer.config import CheckpointConfig
ckpt = Checkpointer({str(tmp_path / "checkpoints")!r}, CheckpointConfig(every_steps=1, keep=1))
ckpt.save(1, {{"w": jnp.full((1000,), 1.0)}}, {{"step": 1}})
ckpt.wait_until_finished()
ckpt.save(2, {{"w": jnp.full((1000,), 2.0), "big": jnp.ones((32, 2**20))}}, {{"step": 2}})
os.kill(os.getpid(), signal.SIGKILL)  # while step 2 is being written
"""
  proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every_steps=1))
  abstract = {"w": jax.ShapeDtypeStruct((1000,), jnp.float32)}
  restored = ckpt.restore_newest(abstract, _shardings(abstract), at_most=1)
  np.testing.assert_array_equal(restored.state["w"], np.full((1000,), 1.0))
  if ckpt.all_steps() == [1]:  # (unless it committed before the kill) step 2 can be redone
    assert ckpt.save(2, {"w": jnp.full((1000,), 3.0)}, {"step": 2})
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [1, 2]
  ckpt.close()
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1", "2"]  # no temporaries


RESHARD = """
import json, sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from trainer.checkpoint import Checkpointer
from trainer.config import CheckpointConfig
rng = np.random.default_rng(0)
host = {"step": np.int32(7), "params": {"w": rng.normal(size=(6, 4)).astype(np.float32),
                                         "b": rng.normal(size=(6,)).astype(np.float32)}}
specs = {"step": P(), "params": {"w": P("fsdp", None), "b": P("fsdp")}}
def placed(n):
  mesh = Mesh(np.array(jax.devices()[:n]), ("fsdp",))
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
out = []
for write, read in ((2, 1), (1, 2)):
  ckpt = Checkpointer(f"{sys.argv[1]}/{write}to{read}", CheckpointConfig())
  ckpt.save(7, jax.device_put(host, placed(write)), {})
  ckpt.wait_until_finished()
  got = ckpt.restore(7, jax.eval_shape(lambda: host), placed(read)).state
  ckpt.close()
  same = jax.tree.map(lambda a, b: bool((np.asarray(a).view(np.uint32) ==
                                          np.asarray(b).view(np.uint32)).all()), host, got)
  devices = jax.tree.map(lambda a: len(a.sharding.device_set), got["params"])
  out.append({"same": same, "devices": devices})
print(json.dumps(out))
"""


def test_a_checkpoint_restores_bit_exact_on_another_mesh(tmp_path):
  """Written sharded over 2 fake devices (fsdp=2) and read onto 1, and the reverse: every bit of
  every array comes back, placed in the reading mesh's shardings."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(2))
  proc = subprocess.run([sys.executable, "-c", RESHARD, str(tmp_path)], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  same = {"step": True, "params": {"w": True, "b": True}}
  assert json.loads(proc.stdout) == [
      {"same": same, "devices": {"w": 1, "b": 1}}, {"same": same, "devices": {"w": 2, "b": 2}}]


# -- validation before a read ----------------------------------------------------------------

def _big_state(step: int) -> dict:
  """Arrays over Orbax's 1 KiB inline limit live in OCDBT data files (ocdbt.process_0/d/)."""
  return {"step": jnp.int32(step), "params": {"w": jnp.full((4, 3), float(step)),
                                              "layer": {"b": jnp.arange(3000.0) + step}}}


def _saved(tmp_path, steps=(10,)) -> checkpoint.Checkpointer:
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every_steps=10))
  for step in steps:
    assert ckpt.save(step, _big_state(step), {"step": step})
    ckpt.wait_until_finished()
  return ckpt


def _biggest_data_file(step_dir):
  return max((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
             key=lambda p: p.stat().st_size)


def _truncate(step_dir):
  path = _biggest_data_file(step_dir)
  path.write_bytes(path.read_bytes()[:100])


def _delete_nodes(step_dir):
  for path in (step_dir / "state" / "d").iterdir():  # the merged B+tree's nodes
    path.unlink()


def _unknown_array(step_dir):
  path = step_dir / "state" / "_METADATA"
  meta = json.loads(path.read_text())
  leaf = json.loads(json.dumps(meta["tree_metadata"]["('params', 'w')"]))
  leaf["key_metadata"][1]["key"] = "v"
  meta["tree_metadata"]["('params', 'v')"] = leaf
  path.write_text(json.dumps(meta))


def _drop_chunk(step_dir):
  """A new OCDBT version without params.layer.b's only chunk."""
  import tensorstore as ts  # pylint: disable=import-outside-toplevel
  db = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{step_dir / 'state'}/"}).result()
  db.delete_range(ts.KvStore.KeyRange(b"params.layer.b/0", b"params.layer.b/0\0")).result()


@pytest.mark.parametrize("damage,reason", [
    (_truncate, r"state/ocdbt.process_0/d/\w+ holds 100 bytes, the manifest needs \d+"),
    (_delete_nodes, r"state/d/\w+ is missing"),
    (lambda d: (d / "state" / "manifest.ocdbt").unlink(), "state/manifest.ocdbt is missing"),
    (lambda d: (d / "state" / "_METADATA").write_text("{"),
     "state/_METADATA is not readable JSON"),
    (lambda d: (d / "data" / "metadata").unlink(), "data/metadata is missing"),
    (_unknown_array, "array params.v has no zarr header in state/manifest.ocdbt"),
    (_drop_chunk, "array params.layer.b has 0 of its 1 chunks"),
])
def test_check_step_refuses_damaged_checkpoints(tmp_path, damage, reason):
  _saved(tmp_path).close()
  step_dir = tmp_path / "checkpoints" / "10"
  arrays = checkpoint_files.check_step(step_dir)
  assert {k: v.shape for k, v in arrays.items()} == {
      "step": (), "params.w": (4, 3), "params.layer.b": (3000,)}
  damage(step_dir)
  with pytest.raises(checkpoint.CheckpointError, match=f"^{reason}"):
    checkpoint_files.check_step(step_dir)


def _garble_inside_a_value(step_dir) -> None:
  """Damage that check_step cannot see (sizes intact): only the read finds it."""
  path = _biggest_data_file(step_dir)
  data = bytearray(path.read_bytes())
  data[: len(data) // 2] = b"\x07" * (len(data) // 2)
  path.write_bytes(bytes(data))
  checkpoint_files.check_step(step_dir)  # passes


def test_failed_read_leaves_hooks_and_filters_as_they_were(tmp_path):
  ckpt = _saved(tmp_path, steps=(10, 20))
  for step in (10, 20):
    _garble_inside_a_value(tmp_path / "checkpoints" / str(step))
  abstract = jax.eval_shape(lambda: _big_state(0))
  hook, filters = sys.unraisablehook, list(warnings.filters)
  asyncio_filters = list(logging.getLogger("asyncio").filters)
  with pytest.raises(checkpoint.CheckpointError, match="^a read failed: "):
    ckpt.restore(20, abstract, _shardings(abstract))
  assert sys.unraisablehook is hook and warnings.filters == filters
  assert logging.getLogger("asyncio").filters == asyncio_filters
  said = []
  with pytest.raises(checkpoint.CheckpointError, match=r"steps \[10, 20\] are all unreadable"):
    ckpt.restore_newest(abstract, _shardings(abstract), warn=said.append)
  assert sys.unraisablehook is hook and warnings.filters == filters
  assert logging.getLogger("asyncio").filters == asyncio_filters
  assert len(said) == 2 and all("\n" not in w and "<" not in w for w in said), said
  assert "is unreadable (a read failed: " in said[0] and "falling back to step 10" in said[0]
  assert 'Error reading "params.layer.b/0"' in said[0]
  ckpt.close()


# -- checks made before a run writes anything --------------------------------------------------

def test_check_restore_step(tmp_path):
  _saved(tmp_path, steps=(10, 20)).close()
  checkpoint.check_restore_step(tmp_path / "checkpoints", 0)  # 0 = the latest
  checkpoint.check_restore_step(tmp_path / "checkpoints", 20)
  with pytest.raises(ConfigError, match=r"^checkpoint.restore_step=7: .* holds no committed "
                     r"checkpoint of step 7 \(committed steps: 10, 20\)$"):
    checkpoint.check_restore_step(tmp_path / "checkpoints", 7)
  with pytest.raises(ConfigError, match=r"\(committed steps: none\)$"):
    checkpoint.check_restore_step(tmp_path / "new" / "checkpoints", 7)
  assert not (tmp_path / "new").exists()


def test_check_params_compatible(tmp_path):
  checkpoint.write_initial(tmp_path, _big_state(0))
  shapes = lambda **kw: {k: jax.ShapeDtypeStruct(v, jnp.float32) for k, v in kw.items()}
  checkpoint.check_params_compatible(tmp_path, shapes(w=(4, 3)) | {"layer": shapes(b=(3000,))})
  with pytest.raises(ConfigError, match=r"parameter params.layer.b has shape \(3000,\) in the "
                     r"checkpoint \(.*/checkpoints/0\) but \(2000,\) in this model$"):
    checkpoint.check_params_compatible(tmp_path, shapes(w=(4, 3)) | {"layer": shapes(b=(2000,))})
  with pytest.raises(ConfigError, match=r"parameter params.u \(2,\) of this model is not in"):
    checkpoint.check_params_compatible(tmp_path, shapes(u=(2,), w=(4, 3)) | {
        "layer": shapes(b=(3000,))})
  with pytest.raises(ConfigError, match=r"holds parameter params.layer.b \(3000,\) that this "
                     r"model does not have \(1 such\)$"):
    checkpoint.check_params_compatible(tmp_path, shapes(w=(4, 3)))
  _truncate(tmp_path / "checkpoints" / "0")
  with pytest.raises(ConfigError, match=r"^init.from_run=.*: state/ocdbt.process_0/d/\w+ holds"):
    checkpoint.check_params_compatible(tmp_path, shapes(w=(4, 3)))


def test_load_params_logs_no_orbax_warnings(tmp_path, caplog):
  caplog.set_level(logging.INFO)
  checkpoint.write_initial(tmp_path, _big_state(3))
  abstract = jax.eval_shape(lambda: _big_state(0)["params"])
  params = checkpoint.load_params(tmp_path, abstract, _shardings(abstract))
  np.testing.assert_array_equal(params["layer"]["b"], np.arange(3000.0) + 3)
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
  _truncate(tmp_path / "checkpoints" / "0")
  with pytest.raises(checkpoint.CheckpointError, match=r"checkpoints/0 is unreadable \(state/"):
    checkpoint.load_params(tmp_path, abstract, _shardings(abstract))
