"""How long a setting's train step takes to load back from JAX's compilation cache: the part of
a warm start (a resume, a second run) that the cache does not save (issue 45's "compile once").

    python -m benchmarks.cache_load --config=configs/llm_1b.py --mesh=tpu-v5e-1 [--config.a=b ...]

Compiles the train step (built as `axtrain plan` builds it for the mesh entry, its rules applied)
with JAX's compilation cache on, in `--cache` (default: a temporary folder), then reads the entry
back in a fresh process, as a resumed run does, and times the file read, the decompression and
the deserialization (the executable's load), with the process's CPU seconds over the load. One
JSON line: the compiled HLO's instructions (and its text's lines), the executable's megabytes,
those times. A setting that the cache left out (JAX keeps a program only past a compile time:
set to 0 here) says so.

The load needs the mesh's platform on this machine; elsewhere the compile runs on the entry's
compile-only devices and the line has no load (a compile-only client loads nothing). On one TPU
v5e (2026-12-07) the load was one thread's CPU at about 0.3 ms a line of the HLO's text (0.35 ms
an instruction), whatever the bytes: docs/fault_tolerance.md has the table.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
from absl import flags

from benchmarks import trace_step
from core.registry import ConfigError
from planner import hlo_ops
from trainer import compile_cache, compile_prefetch, meshes

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = "jit_train_step"  # JAX's module name, which begins the cache key


def compile_train(config: str, mesh: str, overrides: tuple[str, ...], cache: pathlib.Path) -> dict:
  """Compiles the train step into `cache`; its HLO instructions and the entry JAX looked up (key,
  compile options, devices), as trainer/compile_prefetch.py notes it."""
  exp, steps = trace_step.build(config, mesh, overrides)  # a mistake is refused before any folder
  _cache_on(cache)
  compile_prefetch.install()
  compile_prefetch.start(None, "")  # a clean slate of what this process looked up
  name, args = steps["train"]
  started = time.perf_counter()
  with exp.context():
    compiled = getattr(exp, name).lower(*args).compile()
  text = "\n".join(m.to_string() for m in compiled.runtime_executable().hlo_modules())
  computations, _, _ = hlo_ops.parse(text)
  row = {"compile_s": round(time.perf_counter() - started, 2),
         "hlo_instructions": sum(map(len, computations.values())),
         "hlo_lines": text.count("\n")}
  compile_prefetch.remember(cache, "cache_load")
  index = json.loads((cache / compile_prefetch.FOLDER / "cache_load.json").read_text())
  entry = next((e for e in index["programs"] if e["key"].startswith(f"{TRAIN}-")), None)
  return {**row, "entry": entry}


def load(cache: pathlib.Path, entry: dict) -> dict:
  """Reads `entry` back from `cache` and deserializes it onto this process's devices, timed."""
  from jax._src import compilation_cache as cc  # pylint: disable=import-outside-toplevel
  from jax._src.lib import xla_client  # pylint: disable=import-outside-toplevel
  _cache_on(cache)
  devices = {d.id: d for d in jax.devices()}
  backend = next(iter(devices.values())).client
  store = cc._get_cache(backend)  # pylint: disable=protected-access
  cpu0, t0 = os.times(), time.perf_counter()
  blob = store.get(entry["key"]) if store is not None else None
  if blob is None:
    return {"load": "the cache holds no such entry"}
  t1 = time.perf_counter()
  serialized, _ = cc.extract_executable_and_time(cc.decompress_executable(blob))
  t2 = time.perf_counter()
  options = xla_client.CompileOptions.ParseFromString(base64.b64decode(entry["options"]))
  backend.deserialize_executable(
      serialized, xla_client.DeviceList(tuple(devices[i] for i in entry["devices"])), options)
  t3, cpu1 = time.perf_counter(), os.times()
  return {"read_s": round(t1 - t0, 3), "decompress_s": round(t2 - t1, 3),
          "load_s": round(t3 - t2, 3), "executable_mb": round(len(serialized) / 1e6, 2),
          "stored_mb": round(len(blob) / 1e6, 2),
          "process_cpu_s": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 3)}


def _cache_on(cache: pathlib.Path) -> None:
  """JAX's cache in `cache`, every program kept; JAX decided at its first compile (the
  experiment's build compiles) whether a cache is used: asked again."""
  # pylint: disable-next=import-outside-toplevel
  from jax.experimental.compilation_cache import compilation_cache
  compile_cache.enable(str(cache))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  compilation_cache.reset_cache()


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  p = argparse.ArgumentParser(prog="python -m benchmarks.cache_load", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="a config file (as axtrain's --config)")
  p.add_argument("--mesh", default="cpu", help="a mesh entry (trainer/meshes.py)")
  p.add_argument("--cache", default="", help="the compilation cache's folder (default: a "
                                             "temporary one)")
  p.add_argument("--load_entry", default="", help=argparse.SUPPRESS)  # the fresh process's part
  args, rest = p.parse_known_args(argv)
  stray = [a for a in rest if not a.startswith("--config.")]
  if stray:
    p.error(f"unrecognized arguments: {' '.join(stray)}")
  if args.load_entry:
    print(json.dumps(load(pathlib.Path(args.cache), json.loads(args.load_entry))), flush=True)
    return 0
  with tempfile.TemporaryDirectory(prefix="axtrain-cache-load-") as scratch:
    cache = pathlib.Path(args.cache or scratch)
    try:
      row = compile_train(args.config, args.mesh, tuple(rest), cache)
    except (flags.Error, ConfigError) as e:  # a user's mistake (a bad value too): one line
      p.error(str(e))
    entry = row.pop("entry")
    row = {"config": args.config, "mesh": args.mesh, "overrides": rest, **row}
    if entry is None:
      row["load"] = "the cache kept no train step"
    elif jax.default_backend() != meshes.lookup(args.mesh).hardware.platform:
      row["load"] = f"not on this machine (no {args.mesh} devices)"
    else:
      row.update(_load_fresh(args.config, cache, entry))
  print(json.dumps(row), flush=True)
  return 0


def _load_fresh(config: str, cache: pathlib.Path, entry: dict) -> dict:
  """`load` in a new process (nothing of the compile loaded there)."""
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.cache_load", f"--config={config}", f"--cache={cache}",
       f"--load_entry={json.dumps(entry)}"], cwd=ROOT, capture_output=True, text=True,
      check=False)
  if done.returncode != 0:
    return {"load": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
  return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
  sys.exit(main())
