"""A setting's compiled programs read back from the compilation cache while its steps are traced.

JAX's persistent compilation cache (trainer/compile_cache.py) is keyed by the lowered program, so
a run must trace and lower a step before it can look the step up; the read-back then loads the
executable. For llm_1b on one TPU v5e the train step traced in 15-22 s and its 140 MB executable
took 21-27 s more to load (deserialize), one after the other: most of a resumed run's 67 s to its
first step (docs/fault_tolerance.md, 2026-12-07).

A run that compiled (or read) its programs notes their cache keys, per setting, in the cache
folder (`remember`: `<cache>/axtrain-prefetch/<setting>.json`, one entry per program, the
newest, with the compile options and devices that JAX loaded it for). The next start of the same
setting (a resume, a second run) `start`s loading those entries in a thread, one after another
in the order the start needs them, as its compile begins (launcher/starting.py), beside the
trace. When JAX then looks a program up, it asks `_read` (installed over JAX's
`compilation_cache.get_executable_and_time`), which hands over the executable loaded ahead if it
is the one asked for: the same key (JAX's own, computed from the program just lowered), compile
options and devices; else JAX reads the entry itself as before. A guess that misses (the code or
the setting changed) costs a read in a thread and never changes what runs. What was not taken is
let go (`finish`). A second run's initialisation, loaded first, runs while the steps' programs
load (trainer/early_init.py): `loading` and `taken` say whether it can.

`setting` is a digest of the resolved config, the mesh entry, the process's place and JAX's
version; the index is only a guess, so it need not be exact.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import os
import pathlib
import threading
import time

import jax

FOLDER = "axtrain-prefetch"  # in the cache folder
# One load at a time, in the order the start needs them (`start`'s `first`): on one v5e the loads
# did not overlap (llm_1b's train, eval and init loads side by side ended after 31 s, the sum of
# their 21, 3 and 6 s alone), so side by side they only made the first-needed one late. One at a
# time, the train step's still took 26-35 s beside its trace and a restore (2026-12-07, 6045da3).
LOADERS = 1

_lock = threading.Lock()
_state = {"original": None, "pool": None}
_ahead: dict[str, concurrent.futures.Future] = {}  # key -> Future[(executable, time, options, ids)]
_asked: dict[str, dict] = {}  # key -> {options, devices}: what JAX looked up in this process
_taken = {"programs": 0, "waited_s": 0.0}
_taken_programs: set[str] = set()  # the programs whose executable loaded ahead JAX took
_loading: set[str] = set()  # the programs `start` began loading


def _cache_module():
  from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel
  return compilation_cache


def install() -> bool:
  """Puts `_read` in front of JAX's cache read (once); False where this JAX has no such function."""
  with _lock:
    if _state["original"] is not None:
      return True
    try:
      cc = _cache_module()
      original = cc.get_executable_and_time
    except (ImportError, AttributeError):
      return False
    _state["original"] = original
    cc.get_executable_and_time = _read
  return True


def setting(resolved: dict, mesh: str) -> str:
  """A digest of what the programs are built from: the resolved config, the mesh entry, this
  process's place among the run's, JAX's version."""
  text = json.dumps({"config": resolved, "mesh": mesh, "jax": jax.__version__,
                     "process": [jax.process_index(), jax.process_count()]}, sort_keys=True,
                    default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


def _ids(devices) -> list[int]:
  return [d.id for d in devices]


def _options(compile_options) -> bytes:
  return compile_options.SerializeAsString()


def _read(cache_key, compile_options, backend, executable_devices):
  """JAX's get_executable_and_time: the executable loaded ahead for `cache_key`, where it was
  loaded for these options and devices; else JAX's own read."""
  options, ids = _options(compile_options), _ids(executable_devices)
  with _lock:
    _asked[cache_key] = {"options": options, "devices": ids}
    ahead = _ahead.pop(cache_key, None)
  if ahead is not None:
    started = time.perf_counter()
    try:
      loaded = ahead.result()
    except Exception:  # pylint: disable=broad-except  (JAX's own read below says what is wrong)
      loaded = None
    if loaded is not None and loaded[2] == options and loaded[3] == ids:
      with _lock:
        _taken["programs"] += 1
        _taken["waited_s"] += time.perf_counter() - started
        _taken_programs.add(_program(cache_key))
      return loaded[0], loaded[1]
  return _state["original"](cache_key, compile_options, backend, executable_devices)


def _index(cache_dir: pathlib.Path, name: str) -> pathlib.Path:
  return pathlib.Path(cache_dir) / FOLDER / f"{name}.json"


def start(cache_dir: pathlib.Path | None, name: str, *, leave: tuple[str, ...] = (),
          first: tuple[str, ...] = ()) -> int:
  """Starts loading, in a thread, one after another, the entries that the last run of setting
  `name` used (the index in `cache_dir`): those of the programs named in `first` first, in that
  order, then the rest; not those named in `leave` (JAX's module names, which begin its keys: a
  resumed run leaves its initialisation). Returns how many. Nothing where the cache is off,
  there is no index, or it does not read."""
  with _lock:  # a new run in this process: what it looks up is its own
    _asked.clear()
    _taken.update(programs=0, waited_s=0.0)
    _taken_programs.clear()
    _loading.clear()
  if cache_dir is None or not install():
    return 0
  try:
    entries = _ranked(json.loads(_index(cache_dir, name).read_text())["programs"], first)
  except (OSError, ValueError, KeyError, TypeError):
    return 0
  backend = jax.devices()[0].client
  by_id = {d.id: d for d in jax.devices()}
  started = 0
  with _lock:
    for entry in entries:
      try:
        key, ids = str(entry["key"]), [int(i) for i in entry["devices"]]
        options = base64.b64decode(entry["options"])
      except (KeyError, TypeError, ValueError):
        continue
      if (key in _ahead or not all(i in by_id for i in ids)
          or any(key.startswith(f"{program}-") for program in leave)):
        continue
      if _state["pool"] is None:
        _state["pool"] = concurrent.futures.ThreadPoolExecutor(
            LOADERS, thread_name_prefix="axtrain-prefetch")
      devices = [by_id[i] for i in ids]
      _ahead[key] = _state["pool"].submit(_load, key, options, devices, backend)
      _loading.add(_program(key))
      started += 1
  return started


def _ranked(entries: list, first: tuple[str, ...]) -> list:
  """`entries` with those of the programs in `first` first, in that order (TypeError: not a
  list)."""
  def rank(entry) -> int:
    program = _program(str(entry.get("key", ""))) if isinstance(entry, dict) else ""
    return first.index(program) if program in first else len(first)
  return sorted(entries, key=rank)


def _load(key: str, options: bytes, devices: list, backend):
  """(executable, compile time, options, device ids) of cache entry `key`, as JAX's own read
  makes it; None where the entry is gone."""
  from jax._src.lib import xla_client  # pylint: disable=import-outside-toplevel
  cc = _cache_module()
  cache = cc._get_cache(backend)  # pylint: disable=protected-access
  blob = cache.get(key) if cache is not None else None
  if blob is None:
    return None
  serialized, compile_time = cc.extract_executable_and_time(cc.decompress_executable(blob))
  compile_options = xla_client.CompileOptions.ParseFromString(options)
  executable = backend.deserialize_executable(serialized, xla_client.DeviceList(tuple(devices)),
                                              compile_options)
  return executable, compile_time, options, _ids(devices)


def loading(program: str) -> bool:
  """Whether this start began loading an entry of `program` (JAX's module name)."""
  with _lock:
    return program in _loading


def taken(program: str) -> bool:
  """Whether JAX took, in this start, an executable of `program` that was loaded ahead (it did
  not compile it)."""
  with _lock:
    return program in _taken_programs


def _program(key: str) -> str:
  """The program's name in a JAX cache key (`<module name>-<digest>`)."""
  return key.rsplit("-", 1)[0]


def remember(cache_dir: pathlib.Path | None, name: str) -> None:
  """Notes, for setting `name`, the entries JAX looked up in this process so far, for the next
  start to load ahead: the index keeps one entry per program, the newest (a resume, which asks
  for no initialisation, keeps the fresh run's). A folder that cannot be written is let be."""
  if cache_dir is None:
    return
  with _lock:
    asked = dict(_asked)
  if not asked:
    return
  path = _index(cache_dir, name)
  try:
    kept = json.loads(path.read_text())["programs"]
    programs = {_program(str(e["key"])): e for e in kept if isinstance(e, dict) and "key" in e}
  except (OSError, ValueError, KeyError, TypeError):
    programs = {}
  programs.update((_program(key), {"key": key, "options": base64.b64encode(a["options"]).decode(),
                                   "devices": a["devices"]}) for key, a in asked.items())
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"programs": list(programs.values())}))
    os.replace(tmp, path)
  except OSError:
    pass


def finish() -> dict:
  """Lets go of what was loaded ahead and not taken (a load still running ends in its thread);
  returns {programs taken, seconds JAX waited for them, loads not taken}."""
  with _lock:
    unused, pending = len(_ahead), list(_ahead.values())
    _ahead.clear()
    pool, _state["pool"] = _state["pool"], None
    taken = dict(_taken)
  for future in pending:
    future.cancel()
  if pool is not None:
    pool.shutdown(wait=False, cancel_futures=True)
  return {"programs_loaded_ahead": taken["programs"],
          "loaded_ahead_wait_s": round(taken["waited_s"], 2), "loads_not_taken": unused}
