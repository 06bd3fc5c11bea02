"""Host RAM that one checkpoint save (and restore) adds, as a multiple of the state's bytes.

    python -m benchmarks.checkpoint_memory                 # ~1.5 GB state, every variant
    python -m benchmarks.checkpoint_memory --gb=0.3 --variants=checkpointer:pinned_host
    python -m benchmarks.checkpoint_memory --config=configs/llm_1b.py --made_by=jit \
        --variants=checkpointer:pinned_host     # a recipe's train state (on the chip)
    python -m benchmarks.checkpoint_memory --gb=4.3 --stack=64 --block_mib=64 \
        --variants=checkpointer:pinned_host     # a save's blocks of 64 MiB (shipped: 32)

Each variant runs in its own process: it builds a state of float32 arrays of a decoder's
shapes (`state_shapes`) with memory kind `device` or `pinned_host`, saves it as the training
loop does (save, then wait_until_finished) and prints one JSON line: `extra_over_state`, the
peak of VmRSS (polled every 5 ms) during the save minus VmRSS before it, over the state's bytes;
`kept_gb`, what the save left in RSS once it returned. The `checkpointer` variant then drops the
state and restores it into the same shardings: `restore_extra_gb` is the peak during the
restore minus RSS once the restored state is held (what the restore took beyond the state),
`restore_kept_gb` the RSS the restored state holds (its bytes, where its memory counts as RSS),
`restore_over_state_gb` the peak during the restore beyond RSS before it plus the state's bytes.
`system_*` are the same figures for the machine's RAM in use (MemTotal - MemAvailable), which
also counts memory a runtime pins outside the process's pages.

    checkpointer        trainer/checkpoint.py's Checkpointer, as the run uses it (with
                        --bound_gb: its HOST_STATE_SAVE_GB set to that)
    orbax_default       a CheckpointManager with StandardSave and Orbax's defaults (what the
                        Checkpointer did before it bounded host-memory saves)
    save_concurrent     the same with StandardCheckpointHandler(save_concurrent_gb=--bound_gb):
                        bounds the bytes TensorStore writes at once, not the copies off devices

On CPU a device or pinned_host array reads into numpy without a copy, so what the CPU shows
is TensorStore's buffers; on a TPU the copies off the chip's memories add the state once more.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from trainer import checkpoint_blocks, host_memory

VARIANTS = ("orbax_default", "save_concurrent", "checkpointer")
KINDS = ("device", "pinned_host")


def state_shapes(gb: float, stack: int = 1) -> list[tuple[int, ...]]:
  """Per layer: four d x d attention matrices, three d x 4d MLP matrices, two norm scales;
  layers of d=1024 until the float32 arrays take `gb` GB (10**9 bytes), plus an embedding.
  stack > 1: each array holds `stack` layers, as a scanned stack's do (llm_1b's MLP matrices
  are 16 layers of 2048 x 8192, 1.07 GB an array)."""
  d = 1024
  lead = (stack,) if stack > 1 else ()
  layer = [lead + s for s in [(d, d)] * 4 + [(d, 4 * d)] * 3 + [(d,)] * 2]
  shapes = [(8192, d)]
  while sum(4 * _size(s) for s in shapes) < gb * 1e9:
    shapes += layer
  return shapes


def _size(shape) -> int:
  n = 1
  for dim in shape:
    n *= dim
  return n


def _save(variant: str, directory: pathlib.Path, state, bound_gb: float) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from trainer import checkpoint, checkpoint_bounded  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  if variant == "checkpointer":
    if bound_gb:  # the Checkpointer's batch of a host-memory state, read when it is made
      checkpoint_bounded.HOST_STATE_SAVE_GB = bound_gb
    ckpt = checkpoint.Checkpointer(directory, CheckpointConfig(keep=1))
    ckpt.save(1, state, {})
    ckpt.wait_until_finished()
    ckpt.close()
    return
  handlers = ({"state": ocp.StandardCheckpointHandler(save_concurrent_gb=bound_gb or 0.1)}
              if variant == "save_concurrent" else None)
  manager = ocp.CheckpointManager(directory, item_handlers=handlers, options=ocp.
                                  CheckpointManagerOptions(enable_async_checkpointing=True))
  manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
  manager.wait_until_finished()
  manager.close()


def config_state(config: str, kind: str, made_by: str) -> dict:
  """The train state of `config` (a config file, its arguments after ':') on this machine's
  devices (--mesh=auto's entry, its mesh rule applied, as the run's), its state in host memory for `kind` pinned_host, as a dict of
  arrays by tree path, filled with random values: by `device_put` of NumPy arrays (as a
  restore makes them) or by a jitted program (as a train step does)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import modules  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from launcher import config_loading  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib, experiment, meshes  # pylint: disable=import-outside-toplevel
  from trainer import mesh_rules  # pylint: disable=import-outside-toplevel
  memory = "host" if kind == "pinned_host" else "device"
  cfg = config_loading.load(config, f"--config.trainer.state_memory={memory}")
  entry = meshes.select("auto")
  mesh_rules.apply_rules(cfg, entry, {"trainer.state_memory"})  # the layout the run has here
  exp = experiment.build(config_lib.parse(cfg), entry)
  abstract = {jax.tree_util.keystr(path): leaf for path, leaf in
              jax.tree_util.tree_flatten_with_path(exp.abstract_state_inputs())[0]}
  if made_by == "device_put":
    rng = np.random.default_rng(0)
    return {k: jax.device_put(rng.random(a.shape, np.float32).astype(a.dtype, copy=False),
                              a.sharding) for k, a in abstract.items()}

  def fill(key):
    return {k: (jax.random.uniform(jax.random.fold_in(key, i), a.shape, a.dtype)
                if jax.numpy.issubdtype(a.dtype, jax.numpy.floating)
                else jax.numpy.zeros(a.shape, a.dtype)) for i, (k, a) in enumerate(abstract.items())}
  return jax.jit(fill, out_shardings={k: a.sharding for k, a in abstract.items()})(
      jax.random.key(0))


def measure(variant: str, kind: str, gb: float, bound_gb: float, stack: int = 1,
            config: str = "", made_by: str = "device_put") -> dict:
  """One variant in this process: the save's extra peak RSS over the state's bytes."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=kind)
  rng = np.random.default_rng(0)
  jax.device_put(np.zeros(8, np.float32), sharding).block_until_ready()  # the runtime, started
  host_memory.release()
  made = host_memory.Peak()
  made.__enter__()
  state = (config_state(config, kind, made_by) if config else
           {f"a{i}": jax.device_put(rng.standard_normal(s, np.float32), sharding)
            for i, s in enumerate(state_shapes(gb, stack))})
  jax.block_until_ready(state)
  nbytes = sum(a.nbytes for a in state.values())
  gc.collect()
  host_memory.release()
  time.sleep(0.3)
  made.__exit__()
  gb = lambda n: round(n / 1e9, 3)  # pylint: disable=unnecessary-lambda-assignment
  out = {"variant": variant, "memory_kind": kind, "state_gb": round(nbytes / 1e9, 3),
         "arrays": len(state), "platform": jax.default_backend(),
         "state_rss_gb": gb(made.after[0] - made.before[0]),
         "system_state_gb": gb(made.after[1] - made.before[1])}
  with tempfile.TemporaryDirectory() as tmp:
    directory = pathlib.Path(tmp) / "checkpoints"
    start = time.perf_counter()
    with host_memory.Peak() as save:
      _save(variant, directory, state, bound_gb)
    out.update(save_s=round(time.perf_counter() - start, 2),
               extra_gb=gb(save.peak[0] - save.before[0]),
               extra_over_state=round((save.peak[0] - save.before[0]) / nbytes, 3),
               kept_gb=gb(save.after[0] - save.before[0]),
               system_extra_gb=gb(save.peak[1] - save.before[1]),
               system_kept_gb=gb(save.after[1] - save.before[1]))
    if variant == "checkpointer":
      out.update(_restore(directory, {k: (a.shape, a.dtype, a.sharding) for k, a in state.items()},
                          state, gb))
  return out


def _restore(directory: pathlib.Path, shapes: dict, state: dict, gb) -> dict:
  """Drops `state`, restores it from `directory` as the training loop does; the restore's peak
  beyond the restored state's own bytes."""
  import jax  # pylint: disable=import-outside-toplevel
  from trainer import checkpoint  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  state.clear()
  gc.collect()
  time.sleep(0.3)
  abstract = {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype, _) in shapes.items()}
  shardings = {k: sharding for k, (_, _, sharding) in shapes.items()}
  ckpt = checkpoint.Checkpointer(directory, CheckpointConfig(keep=1))
  start = time.perf_counter()
  with host_memory.Peak() as restore:
    restored = ckpt.restore(1, abstract, shardings)
    jax.block_until_ready(restored.state)
  ckpt.close()
  nbytes = sum(a.size * a.dtype.itemsize for a in abstract.values())
  return {"restore_s": round(time.perf_counter() - start, 2),
          "restore_over_state_gb": gb(restore.peak[0] - restore.before[0] - nbytes),
          "system_restore_over_state_gb": gb(restore.peak[1] - restore.before[1] - nbytes),
          "restore_extra_gb": gb(restore.peak[0] - restore.after[0]),
          "restore_kept_gb": gb(restore.after[0] - restore.before[0]),
          "system_restore_extra_gb": gb(restore.peak[1] - restore.after[1]),
          "system_restore_kept_gb": gb(restore.after[1] - restore.before[1])}


def run_variant(variant: str, kind: str, *, gb: float, bound_gb: float = 0.0,
                env: dict | None = None, stack: int = 1, config: str = "",
                made_by: str = "device_put", block_mib: int = 0) -> dict:
  """`measure` in a fresh process (its peak is its own), with this checkout on the path and
  `env` added to the environment."""
  root = pathlib.Path(__file__).resolve().parent.parent
  env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
             **(env or {}))
  out = subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_memory", "--one",
                        f"--variants={variant}:{kind}", f"--gb={gb}", f"--bound_gb={bound_gb}", f"--stack={stack}",
                        f"--config={config}", f"--made_by={made_by}", f"--block_mib={block_mib}"],
                       cwd=root, env=env, capture_output=True, text=True, check=False)
  lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
  if out.returncode or not lines:
    raise RuntimeError(f"{variant}:{kind} failed (rc {out.returncode}): {out.stderr[-2000:]}")
  return json.loads(lines[-1])


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--gb", type=float, default=1.5, help="state size, GB of float32")
  parser.add_argument("--bound_gb", type=float, default=0.0,
                      help="save_concurrent's bound; the checkpointer's batch if given")
  parser.add_argument("--variants", default=",".join(f"{v}:{k}" for v in VARIANTS
                                                     for k in KINDS),
                      help="comma-separated variant:memory_kind pairs")
  parser.add_argument("--stack", type=int, default=1,
                      help="layers per array (a scanned stack's arrays: one array per matrix)")
  parser.add_argument("--config", default="",
                      help="a config file's train state instead (--gb and --stack unused), "
                           "e.g. configs/llm_1b.py")
  parser.add_argument("--made_by", default="device_put", choices=("device_put", "jit"),
                      help="with --config: fill the state by device_put of NumPy arrays (as a "
                           "restore does) or by a jitted program (as a train step does)")
  parser.add_argument("--block_mib", type=int, default=0,
                      help="a host-memory save's blocks of rows, MiB (0: as shipped, "
                           "trainer/checkpoint_blocks.py:HOST_STATE_BLOCK_BYTES), as many in "
                           "flight as shipped")
  parser.add_argument("--one", action="store_true", help="measure in this process (internal)")
  args = parser.parse_args(argv)
  if args.block_mib < 0:
    parser.error(f"--block_mib={args.block_mib}: MiB of a block, 1 or more (0: as shipped)")
  if args.one and args.block_mib:
    in_flight = checkpoint_blocks.HOST_STATE_WRITE_BYTES // checkpoint_blocks.HOST_STATE_BLOCK_BYTES
    checkpoint_blocks.HOST_STATE_BLOCK_BYTES = args.block_mib * 2**20
    checkpoint_blocks.HOST_STATE_WRITE_BYTES = in_flight * checkpoint_blocks.HOST_STATE_BLOCK_BYTES
  for pair in args.variants.split(","):
    variant, kind = pair.split(":")
    if variant not in VARIANTS or kind not in KINDS:
      parser.error(f"unknown {pair!r}: variants {VARIANTS}, memory kinds {KINDS}")
    result = (measure(variant, kind, args.gb, args.bound_gb, args.stack, args.config,
                      args.made_by) if args.one
              else run_variant(variant, kind, gb=args.gb, bound_gb=args.bound_gb,
                               stack=args.stack, config=args.config, made_by=args.made_by,
                               block_mib=args.block_mib))
    if args.one:  # (a variant run in its own process prints its own)
      result["block_mib"] = checkpoint_blocks.HOST_STATE_BLOCK_BYTES // 2**20
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
