"""Where a training run's start spends its seconds, thread by thread (issue 45's "compile once").

    python -m benchmarks.startup_probe OUT.json -- LAUNCHER ARGS...
    bash .chip/on_chip.sh python3 -m benchmarks.startup_probe $OUT/probe.json -- --config=...

runs `axtrain LAUNCHER ARGS` in this process with probes, and writes OUT.json every 2 s (a run
killed, or a call cut short, still leaves what was seen):

- `buckets`: every 20 ms, each thread's two innermost frames and the innermost frame of this
  repository, counted per 2 s of the run ("12": seconds 12-14 since the process started);
- `gaps`: [seconds, length] of each pause of the sampler over 0.1 s (something held the
  interpreter's lock that long);
- `cache`: each read of JAX's own from the compilation cache, timed: the file read,
  decompression, deserialization (the executable's load), bytes; a miss says so (reads that
  trainer/compile_prefetch.py did ahead are not JAX's and are not here);
- `events`: the phases trainer/startup.py notes, the start and end of the early restore's read
  and of the steps' compile (planner/step_memory.py:check_train), in seconds since the start;
- `startup`: run.json's `startup`, once the run ends.

The figures of docs/fault_tolerance.md's "compile once" (llm_1b on one v5e) were read this way.
"""
import collections
import json
import os
import runpy
import sys
import threading
import time

from trainer import startup as startup_lib

T0 = startup_lib.process_start() or time.time()
state = {"events": [], "cache": [], "buckets": {}, "gaps": [], "samples": 0}
lock = threading.Lock()
out_path = ""  # OUT.json (main)
stop = threading.Event()  # set when the run ends: the sampler ends before the interpreter does


def now():
  return round(time.time() - T0, 2)


def event(name, **kw):
  with lock:
    state["events"].append({"t": now(), "what": name, **kw})


def dump():
  with lock:
    text = json.dumps(state)
  with open(out_path + ".tmp", "w") as f:
    f.write(text)
  os.replace(out_path + ".tmp", out_path)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def leaf(frame):
  """The 2 innermost frames, and the innermost of this repository's, as 'file:function'."""
  parts, ours = [], None
  while frame is not None:
    c = frame.f_code
    if len(parts) < 2:
      parts.append(f"{os.path.basename(c.co_filename)}:{c.co_name}")
    if (ours is None and c.co_filename.startswith(ROOT) and "site-packages" not in c.co_filename
        and not c.co_filename.endswith("startup_probe.py")):
      ours = f"{os.path.relpath(c.co_filename, ROOT)}:{c.co_name}:{frame.f_lineno}"
      break
    frame = frame.f_back
  return " < ".join(parts) + " @ " + str(ours)


def sampler():
  last = time.perf_counter()
  last_dump = time.time()
  me = threading.get_ident()
  while not stop.wait(0.02):
    t = time.perf_counter()
    gap = t - last
    last = t
    names = {th.ident: th.name for th in threading.enumerate()}
    frames = sys._current_frames()
    b = str(int(now() // 2) * 2)
    with lock:
      state["samples"] += 1
      if gap > 0.1:
        state["gaps"].append([now(), round(gap, 3)])
      bucket = state["buckets"].setdefault(b, {})
      for ident, fr in frames.items():
        if ident == me:
          continue
        name = names.get(ident, str(ident))
        counts = bucket.setdefault(name, {})
        k = leaf(fr)
        counts[k] = counts.get(k, 0) + 1
    if time.time() - last_dump > 2:
      dump()
      last_dump = time.time()


def _timed_cache_read():
  """JAX's cache read, the same steps timed one by one (jax/_src/compilation_cache.py)."""
  from jax._src import compilation_cache as cc  # pylint: disable=import-outside-toplevel

  def timed(cache_key, compile_options, backend, executable_devices):
    cache = cc._get_cache(backend)  # pylint: disable=protected-access
    if cache is None:
      return None, None
    t0 = time.perf_counter()
    blob = cache.get(cache_key)
    t1 = time.perf_counter()
    if blob is None:
      with lock:
        state["cache"].append({"t": now(), "miss": True, "read_s": round(t1 - t0, 3)})
      return None, None
    raw = cc.decompress_executable(blob)
    t2 = time.perf_counter()
    serialized, compile_time = cc.extract_executable_and_time(raw)
    exe = backend.deserialize_executable(serialized, executable_devices, compile_options)
    t3 = time.perf_counter()
    with lock:
      state["cache"].append({"t": now(), "read_s": round(t1 - t0, 3),
                             "decompress_s": round(t2 - t1, 3), "deserialize_s": round(t3 - t2, 3),
                             "bytes": len(blob), "raw_bytes": len(raw),
                             "thread": threading.current_thread().name})
    return exe, compile_time

  cc.get_executable_and_time = timed


def _around(owner, name: str, before: str, after: str) -> None:
  """`owner.name` wrapped: events `before` and `after` around each call."""
  original = getattr(owner, name)

  def wrapped(*args, **kwargs):
    event(before)
    try:
      return original(*args, **kwargs)
    finally:
      event(after)

  setattr(owner, name, wrapped)


def patch():
  """The probes: JAX's cache reads timed, the startup's notes and the record, the early read's
  and the steps' compile's start and end."""
  from planner import step_memory  # pylint: disable=import-outside-toplevel
  from trainer import early_restore  # pylint: disable=import-outside-toplevel
  _timed_cache_read()
  orig_note, orig_record = startup_lib.Startup.note, startup_lib.Startup.record

  def note(self, phase, at=None):
    orig_note(self, phase, at)
    event("note", phase=phase, value=self.phases.get(phase))

  def record(self, **kw):
    r = orig_record(self, **kw)
    event("record")
    with lock:
      state["startup"] = r
    dump()
    return r

  startup_lib.Startup.note, startup_lib.Startup.record = note, record
  _around(early_restore.EarlyRestore, "_read", "restore_start", "restore_end")
  _around(step_memory, "check_train", "check_train_start", "check_train_end")


def main(argv: list[str]) -> int:
  global out_path  # pylint: disable=global-statement
  if len(argv) < 2 or "--" not in argv or argv.index("--") != 1:
    print("usage: python -m benchmarks.startup_probe OUT.json -- LAUNCHER ARGS...", file=sys.stderr)
    return 2
  out_path = argv[0]
  patch()
  event("probe_start")
  sampling = threading.Thread(target=sampler, daemon=True, name="probe")
  sampling.start()
  sys.argv = ["axtrain", *argv[2:]]
  code = 0
  try:
    runpy.run_module("launcher", run_name="__main__", alter_sys=True)
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  finally:
    stop.set()
    sampling.join()
    event("exit")
    dump()
  return code


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
