"""Host RAM that one checkpoint save adds, as a multiple of the saved state's bytes.

    python -m benchmarks.checkpoint_memory                 # ~1.5 GB state, every variant
    python -m benchmarks.checkpoint_memory --gb=0.3 --variants=checkpointer:pinned_host

Each variant runs in its own process: it builds a state of float32 arrays of a decoder's
shapes (`state_shapes`) with memory kind `device` or `pinned_host`, saves it as the training
loop does (save, then wait_until_finished) and prints one JSON line: `extra_over_state`, the
peak of VmRSS (polled every 5 ms) during the save minus VmRSS before it, over the state's bytes.

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
import threading
import time

VARIANTS = ("orbax_default", "save_concurrent", "checkpointer")
KINDS = ("device", "pinned_host")


def state_shapes(gb: float) -> list[tuple[int, ...]]:
  """Per layer: four d x d attention matrices, three d x 4d MLP matrices, two norm scales;
  layers of d=1024 until the float32 arrays take `gb` GB (10**9 bytes), plus an embedding."""
  d = 1024
  layer = [(d, d)] * 4 + [(d, 4 * d)] * 3 + [(d,)] * 2
  shapes = [(8192, d)]
  while sum(4 * _size(s) for s in shapes) < gb * 1e9:
    shapes += layer
  return shapes


def _size(shape) -> int:
  n = 1
  for dim in shape:
    n *= dim
  return n


def _rss() -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("no VmRSS in /proc/self/status")


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


def measure(variant: str, kind: str, gb: float, bound_gb: float) -> dict:
  """One variant in this process: the save's extra peak RSS over the state's bytes."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=kind)
  rng = np.random.default_rng(0)
  state = {f"a{i}": jax.device_put(rng.standard_normal(s, np.float32), sharding)
           for i, s in enumerate(state_shapes(gb))}
  jax.block_until_ready(state)
  nbytes = sum(a.nbytes for a in state.values())
  gc.collect()
  time.sleep(0.3)
  before = _rss()
  peak, done = [before], threading.Event()

  def poll():
    while not done.is_set():
      peak[0] = max(peak[0], _rss())
      time.sleep(0.005)

  poller = threading.Thread(target=poll, daemon=True)
  poller.start()
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    _save(variant, pathlib.Path(tmp) / "checkpoints", state, bound_gb)
    seconds = time.perf_counter() - start
    done.set()
    poller.join()
  return {"variant": variant, "memory_kind": kind, "state_gb": round(nbytes / 1e9, 3),
          "arrays": len(state), "extra_gb": round((peak[0] - before) / 1e9, 3),
          "extra_over_state": round((peak[0] - before) / nbytes, 3),
          "save_s": round(seconds, 2), "platform": jax.default_backend()}


def run_variant(variant: str, kind: str, *, gb: float, bound_gb: float = 0.0) -> dict:
  """`measure` in a fresh process (its peak is its own), with this checkout on the path."""
  root = pathlib.Path(__file__).resolve().parent.parent
  env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  out = subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_memory", "--one",
                        f"--variants={variant}:{kind}", f"--gb={gb}", f"--bound_gb={bound_gb}"],
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
  parser.add_argument("--one", action="store_true", help="measure in this process (internal)")
  args = parser.parse_args(argv)
  for pair in args.variants.split(","):
    variant, kind = pair.split(":")
    if variant not in VARIANTS or kind not in KINDS:
      parser.error(f"unknown {pair!r}: variants {VARIANTS}, memory kinds {KINDS}")
    result = (measure(variant, kind, args.gb, args.bound_gb) if args.one
              else run_variant(variant, kind, gb=args.gb, bound_gb=args.bound_gb))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
