"""trainer/checkpoint.py on small pytrees: keep/GC policy, restore_step, write_initial/load_params."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from tests.conftest import ROOT
from trainer import checkpoint
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
  assert not ckpt.save(15, _state(15), {})  # not due
  seen = _save_every_10(ckpt, 60)
  assert seen == [[10], [10, 20], [20, 30], [20, 30, 40], [20, 40, 50], [20, 40, 50, 60]]
  assert not ckpt.save(60, _state(60), {}, force=True)  # already on disk
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


def test_restore_step_and_set_aside(tmp_path):
  cfg = CheckpointConfig(every_steps=10, keep=5)
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", cfg)
  _save_every_10(ckpt, 30)
  abstract = jax.eval_shape(lambda: _state(0))
  restored = ckpt.restore_latest(abstract, _shardings(abstract), step=20)
  assert restored.step == 20 and restored.data_state == {"step": 20} and not restored.skipped
  np.testing.assert_array_equal(restored.state["params"]["w"], np.full((4, 3), 20.0))
  assert ckpt.set_aside([30]) == tmp_path / checkpoint.SUPERSEDED
  assert ckpt.all_steps() == [10, 20]
  assert (tmp_path / checkpoint.SUPERSEDED / "30" / "state").is_dir()
  assert ckpt.save(30, _state(31), {"step": 31}, force=True)  # the step can be written again
  ckpt.wait_until_finished()
  assert ckpt.restore(30, abstract, _shardings(abstract))[1] == {"step": 31}
  with pytest.raises(checkpoint.CheckpointError, match="restore_step=25 is not a committed"):
    ckpt.restore_latest(abstract, _shardings(abstract), step=25)
  ckpt.close()


def test_deleted_manifest_falls_back(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every_steps=10))
  _save_every_10(ckpt, 20)
  ckpt.close()
  (tmp_path / "checkpoints" / "20" / "state" / "manifest.ocdbt").unlink()
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", CheckpointConfig(every_steps=10))
  abstract = jax.eval_shape(lambda: _state(0))
  warnings = []
  restored = ckpt.restore_latest(abstract, _shardings(abstract), warn=warnings.append)
  assert restored.step == 10 and [s for s, _ in restored.skipped] == [20]
  assert len(warnings) == 1 and "20 is unreadable" in warnings[0]
  assert "falling back to step 10" in warnings[0]
  assert ckpt.all_steps() == [10]
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
  restored = ckpt.restore_latest(abstract, _shardings(abstract), step=1)
  np.testing.assert_array_equal(restored.state["w"], np.full((1000,), 1.0))
  if ckpt.all_steps() == [1]:  # (unless it committed before the kill) step 2 can be redone
    assert ckpt.save(2, {"w": jnp.full((1000,), 3.0)}, {"step": 2}, force=True)
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [1, 2]
  ckpt.close()
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1", "2"]  # no temporaries


_LATE_REPORTS = """
import asyncio, gc, logging, sys
from trainer import checkpoint
logging.basicConfig()  # as absl does: the asyncio logger reaches stderr
if sys.argv[1] == "quiet":
  checkpoint._quiet_abandoned_reads()

class ClosedLoopCallback:  # what TensorStore's late callbacks raise, unraisably
  def __del__(self):
    raise RuntimeError("Event loop is closed")

async def fails():
  raise ValueError("a read of an abandoned restore")

async def never_awaited():
  pass

class Pending:  # an awaitable that suspends once, with no loop
  def __await__(self):
    yield

async def suspended_read():  # as orbax's _read_array_index_and_device_put wraps its read
  try:
    await Pending()
  except BaseException as e:
    raise Exception("Encountered error while reading array index") from e

async def gather_unawaited():  # an asyncio.gather whose caller went away
  return asyncio.gather(fails())

loop = asyncio.new_event_loop()
task = loop.create_task(fails())
gathered = loop.run_until_complete(gather_unawaited())
loop.run_until_complete(asyncio.sleep(0.01))
loop.close()
del task, gathered
coro = never_awaited()
del coro
read = suspended_read()
read.send(None)  # suspended inside the sleep; collecting it closes it with GeneratorExit
del read
ClosedLoopCallback()
gc.collect()
print("done")
"""


@pytest.mark.parametrize("mode", ["quiet", "default"])
def test_late_reports_of_an_abandoned_restore_are_dropped(mode):
  """The ways the reads of a failed restore report late print nothing once quieted."""
  done = subprocess.run([sys.executable, "-c", _LATE_REPORTS, mode], capture_output=True,
                        text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                        timeout=120)
  assert done.returncode == 0 and done.stdout == "done\n", done.stderr
  reports = ("Event loop is closed", "Task exception was never retrieved", "was never awaited",
             "Exception ignored in: <coroutine object suspended_read",
             "_GatheringFuture exception was never retrieved")
  if mode == "quiet":
    assert done.stderr == ""
  else:  # the control: without it, each report reaches stderr
    assert all(r in done.stderr for r in reports), done.stderr
