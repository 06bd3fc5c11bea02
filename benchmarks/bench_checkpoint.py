"""Checkpoint benchmark: save throughput vs a plain file write, and the async save stall.

    python -m benchmarks.bench_checkpoint          (benchmarks/run.py calls run())

save_gb_per_s        bytes of a saved TrainState-sized pytree / (save + commit) time
plain_write_gb_per_s the same bytes written sequentially to one file (+ fsync), same disk
stall_s              how long Checkpointer.save blocks the training loop (device->host copy
                     and dispatch; the write itself runs in the background)
step_time_s          median training step of configs/tiny.py on this machine
stall_over_step      stall_s / step_time_s (target: < 1)
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np


def _plain_write(path: pathlib.Path, arrays) -> float:
  t = time.perf_counter()
  with open(path, "wb") as f:
    for a in arrays:
      f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    f.flush()
    os.fsync(f.fileno())
  return time.perf_counter() - t


def throughput(directory: pathlib.Path, *, megabytes: int = 128, leaves: int = 16) -> dict:
  from trainer.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  n = megabytes * 2**20 // 4 // leaves
  tree = {f"w{i}": jax.random.normal(jax.random.key(i), (n,), jnp.float32) for i in range(leaves)}
  jax.block_until_ready(tree)
  nbytes = sum(x.nbytes for x in tree.values())
  ckpt = Checkpointer(directory / "checkpoints", CheckpointConfig(every_steps=1, keep=1))
  times = []
  for step in (1, 2):  # the first save also pays one-time setup
    t = time.perf_counter()
    ckpt.save(step, tree, {"step": step})
    ckpt.wait_until_finished()
    times.append(time.perf_counter() - t)
  ckpt.close()
  host = [np.asarray(x) for x in tree.values()]
  plain = min(_plain_write(directory / f"plain{i}.bin", host) for i in range(2))
  return {"checkpoint_bytes": nbytes, "save_s": times[-1],
          "save_gb_per_s": nbytes / times[-1] / 1e9, "plain_write_s": plain,
          "plain_write_gb_per_s": nbytes / plain / 1e9}


def stall(directory: pathlib.Path, *, steps: int = 10) -> dict:
  """Blocking time of an async save of configs/tiny.py's TrainState vs its step time."""
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib, experiment, meshes  # pylint: disable=import-outside-toplevel
  from trainer.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
  from trainer.config import CheckpointConfig  # pylint: disable=import-outside-toplevel
  device = jax.devices()[0]
  entry = meshes.auto(device.platform, device.device_kind, jax.device_count(), jax.process_count())
  exp = experiment.build(config_lib.parse(tiny.get_config()), entry)
  data = exp.source.train_iterator(process_index=0, process_count=1)
  state = exp.init()
  ckpt = Checkpointer(directory / "stall", CheckpointConfig(every_steps=1, keep=2))
  step_times, stalls, in_flight_steps = [], [], []
  with exp.context():
    for step in range(1, steps + 1):
      batch = exp.global_batch(next(data))
      t = time.perf_counter()
      state, metrics = exp.step_fn(state, batch)
      jax.block_until_ready(metrics)
      dt = time.perf_counter() - t
      if step > 2:
        (in_flight_steps if step % 4 == 1 else step_times).append(dt)
      if step > 2 and step % 4 == 0:
        t = time.perf_counter()
        ckpt.save(step, state, data.get_state())
        stalls.append(time.perf_counter() - t)
  ckpt.close()
  step_time = statistics.median(step_times)
  stall_s = statistics.median(stalls)
  return {"model_params": exp.num_params, "step_time_s": step_time, "stall_s": stall_s,
          "stall_over_step": stall_s / step_time,
          "step_time_during_save_s": statistics.median(in_flight_steps)}


def run() -> dict:
  with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMPDIR")) as tmp:
    out = throughput(pathlib.Path(tmp))
    out.update(stall(pathlib.Path(tmp)))
  return {"checkpoint": out}


if __name__ == "__main__":
  print(json.dumps(run(), indent=2))
