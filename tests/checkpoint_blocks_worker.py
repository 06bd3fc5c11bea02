"""Run by tests/test_checkpoint_memory.py in a process of 4 fake CPU devices: a host-memory
state sharded over a 2x2 mesh (rows, columns, both, replicated) saved in blocks of rows and
restored onto another layout, inside the mesh (jax.set_mesh, as a run's restore is), from the
view of each buffer (CPU's own path) and through device memory (a TPU's or GPU's path, forced
with HOST_VIEW_PLATFORMS empty). Prints one JSON line: each source's arrays equal or not."""

import json
import sys
import tempfile
import pathlib

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from trainer import checkpoint, checkpoint_blocks
from trainer.config import CheckpointConfig


def round_trip(mesh: Mesh, folder: pathlib.Path) -> bool:
  rng = np.random.default_rng(0)
  host = lambda spec: NamedSharding(mesh, spec, memory_kind="pinned_host")  # noqa: E731
  specs = {"rows": P("a", None), "cols": P(None, "b"), "both": P("a", "b"), "rep": P(None, None)}
  state = {"step": jax.device_put(np.int32(3), host(P()))}
  for key, spec in specs.items():
    state[key] = jax.device_put(rng.standard_normal((512, 768), np.float32), host(spec))
  views = {key: np.asarray(value) for key, value in state.items()}
  other = {key: host(P("b", "a") if key != "step" else P()) for key in state}
  with jax.set_mesh(mesh):
    saver = checkpoint.Checkpointer(folder, CheckpointConfig(keep=1))
    assert saver.save(1, state, {})
    saver.close()
    restored = checkpoint.Checkpointer(folder, CheckpointConfig(keep=1)).restore(
        1, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state), other)
  return all(np.array_equal(np.asarray(restored.state[key]), value)
             and restored.state[key].sharding == other[key] for key, value in views.items())


def main() -> None:
  checkpoint_blocks.HOST_STATE_BLOCK_BYTES = 2**18  # shards of 0.1-0.4 MB in blocks of rows
  checkpoint_blocks.HOST_STATE_WRITE_BYTES = 4 * 2**18
  checkpoint_blocks.HOST_STATE_READ_BLOCK_BYTES = 2**18
  checkpoint_blocks.HOST_STATE_READ_BYTES = 4 * 2**18
  mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
  root = pathlib.Path(tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else None))
  equal = {"view": round_trip(mesh, root / "view")}
  checkpoint_blocks.HOST_VIEW_PLATFORMS = ()
  equal["device"] = round_trip(mesh, root / "device")
  print(json.dumps(equal))


if __name__ == "__main__":
  main()
