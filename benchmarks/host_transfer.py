"""Host <-> device bandwidth through JAX memory kinds: what host offload's transfers cost.

On the lent TPU chip (../shared/chip/README.md; needs only JAX):

    python3 -m benchmarks.host_transfer --out=$OUT          # writes $OUT/host_transfer.json

Times, for arrays of --mib MiB (float32), the ways a step with host offload moves state
(trainer/offload.py): device_put to pinned_host and back (eager), and inside one jitted program
host -> device, device -> host, and both directions at once (an update streams parameters and
optimizer state in while it writes the previous group's results out). Each figure is the median
of --repeats timed runs after one warm-up; bandwidth is bytes moved / seconds, GB/s (1e9).
planner/calibration.py keeps the one-chip figures as its `host_transfer` row.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec


def _median_s(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


class _Holder:
  buffers = None


def _donated(fn, host, dev):
  """fn(host buffers, dev) with the host buffers donated; the next call donates its output."""
  _Holder.buffers = fn(_Holder.buffers or [jax.device_put(x, x.sharding) for x in host], dev)
  return _Holder.buffers


def measure(*, mib: int, repeats: int, pieces: int = 4) -> dict:
  """GB/s of each transfer pattern for `pieces` arrays of mib / pieces MiB each."""
  device = jax.local_devices()[0]
  mesh = jax.sharding.Mesh([device], ("x",))
  on_device = NamedSharding(mesh, PartitionSpec(), memory_kind="device")
  on_host = on_device.with_memory_kind("pinned_host")
  n = mib * 2 ** 20 // 4 // pieces
  dev = [jax.device_put(jnp.full((n,), i, jnp.float32), on_device) for i in range(pieces)]
  host = [jax.device_put(x, on_host) for x in dev]
  total = 4 * n * pieces

  to_host = jax.jit(lambda xs: [x + 1 for x in xs], out_shardings=[on_host] * pieces)
  to_device = jax.jit(lambda xs: [jax.device_put(x, jax.memory.Space.Device) + 1 for x in xs],
                      out_shardings=[on_device] * pieces)
  both = jax.jit(lambda hs, ds: ([jax.device_put(x, jax.memory.Space.Device) + 1 for x in hs],
                                 [x + 1 for x in ds]),
                 out_shardings=([on_device] * pieces, [on_host] * pieces))
  figures = {
      "eager_device_to_host": _median_s(lambda: [jax.device_put(x, on_host) for x in dev],
                                        repeats=repeats),
      "eager_host_to_device": _median_s(lambda: [jax.device_put(x, on_device) for x in host],
                                        repeats=repeats),
      "jit_device_to_host": _median_s(to_host, dev, repeats=repeats),
      "jit_host_to_device": _median_s(to_device, host, repeats=repeats),
  }
  out = {name: {"seconds": s, "gb_per_s": total / s / 1e9} for name, s in figures.items()}
  seconds = _median_s(both, host, dev, repeats=repeats)
  out["jit_both_directions"] = {"seconds": seconds, "gb_per_s": 2 * total / seconds / 1e9}
  # Into host buffers the program was given (donated): the output aliases them, as a train
  # step's offloaded state does (its host buffers are written in place every step).
  into = jax.jit(lambda hs, ds: [d + 1 for d in ds], donate_argnums=0,
                 out_shardings=[on_host] * pieces)
  seconds = _median_s(lambda: _donated(into, host, dev), repeats=repeats)
  out["jit_device_to_donated_host"] = {"seconds": seconds, "gb_per_s": total / seconds / 1e9}
  return {"device": device.device_kind, "platform": device.platform, "mib": mib,
          "pieces": pieces, "repeats": repeats, "jax": jax.__version__, "figures": out}


def by_piece_size(*, mib: int, repeats: int, pieces: tuple[int, ...] = (4, 16, 64, 256)) -> dict:
  """Device -> host GB/s by piece count for the same total: into pinned_host (eager and inside
  one jitted program), into unpinned_host (eager), and to NumPy (jax.device_get). Is the slow
  pinned_host write a matter of piece size, of the memory kind, or of the path?"""
  device = jax.local_devices()[0]
  mesh = jax.sharding.Mesh([device], ("x",))
  on_device = NamedSharding(mesh, PartitionSpec(), memory_kind="device")
  pinned, unpinned = (on_device.with_memory_kind(k) for k in ("pinned_host", "unpinned_host"))
  out = {}
  for count in pieces:
    n = mib * 2 ** 20 // 4 // count
    dev = [jax.device_put(jnp.full((n,), i, jnp.float32), on_device) for i in range(count)]
    to_host = jax.jit(lambda xs: [x + 1 for x in xs], out_shardings=[pinned] * count)
    ways = {"eager_pinned": lambda: [jax.device_put(x, pinned) for x in dev],
            "jit_pinned": lambda: to_host(dev),
            "eager_unpinned": lambda: [jax.device_put(x, unpinned) for x in dev],
            # (fresh arrays: jax keeps an array's NumPy copy once made)
            "device_get": lambda: jax.device_get([jnp.copy(x) for x in dev])}
    for name, fn in ways.items():
      try:
        seconds = _median_s(fn, repeats=repeats)
        out[f"{name}/{count}"] = {"seconds": seconds, "gb_per_s": 4 * n * count / seconds / 1e9}
      except Exception as e:  # pylint: disable=broad-except
        out[f"{name}/{count}"] = {"error": str(e).splitlines()[0][:200]}
    del dev
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", type=pathlib.Path, default=None, help="folder for the JSON")
  parser.add_argument("--mib", type=int, default=1024, help="MiB moved per direction")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--by_piece_size", action="store_true",
                      help="also device -> host by piece count (by_piece_size)")
  args = parser.parse_args(argv)
  result = measure(mib=args.mib, repeats=args.repeats)
  if args.by_piece_size:
    result["by_piece_size"] = by_piece_size(mib=args.mib, repeats=args.repeats)
  text = json.dumps(result, indent=1)
  print(text)
  if args.out is not None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_transfer.json").write_text(text + "\n")


if __name__ == "__main__":
  main()
