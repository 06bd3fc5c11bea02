"""Does the step fit in device memory? Checked on the compiled step before anything runs.

The train step (and the eval step) are compiled with abstract, sharded inputs, the way
`axtrain plan` compiles them (planner/plan.py); the executable's memory analysis gives the
bytes one device needs: arguments + outputs not aliased to them + temporaries. The compile is
the one the run would make anyway: jit's cache hands the same executable to the first real
step. A step that needs more than the device has is refused in one line that says by how much,
instead of a RESOURCE_EXHAUSTED part-way into the run.

Device memory: what the backend reports (`memory_stats()["bytes_limit"]` on GPU and TPU); on
CPU, the host memory available now (/proc/meminfo MemAvailable) shared by the local devices.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax

from core.registry import ConfigError
from trainer import metrics as metrics_lib

GiB = 1024 ** 3
# What lowers each step's memory, for the refusal.
FIX = {"train step": "lower data.batch_size or data.seq_len, or use remat (model.remat=full)",
       "eval step": "lower eval.batch_size or data.seq_len"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceMemory:
  bytes: int  # per device
  source: str  # where the figure comes from, in words


def _host_available() -> int | None:
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError):
    return None


def device_memory(devices) -> DeviceMemory | None:
  """Memory one device of `devices` (this process's) can give a step; None when unknown."""
  device = devices[0]
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except  (backends without the call)
    stats = None
  if stats and stats.get("bytes_limit"):
    return DeviceMemory(bytes=int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
                        source=f"{device.device_kind} memory free")
  if device.platform == "cpu":
    host = _host_available()
    if host:
      return DeviceMemory(bytes=host // max(len(devices), 1),
                          source="host memory available" + (
                              f", shared by {len(devices)} CPU devices" if len(devices) > 1
                              else ""))
  return None


def compile_step(fn, args, *, exp, what: str):
  """`fn.lower(*args).compile()` under the experiment's mesh and rules; a compiler that runs out
  of device memory (the TPU compiler refuses such programs) is a ConfigError."""
  with exp.context():
    lowered = fn.lower(*args)
    try:
      return lowered.compile()
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      m = re.search(r"HLO temporaries \(([\d.]+)G\)", str(e))  # the TPU compiler's words
      need = f"needs {m[1]} GiB of temporaries" if m else "does not fit"
      raise ConfigError(f"the {what} {need}: the compiler ran out of device memory; "
                        f"{FIX[what]}") from None


def check(stats: dict, *, what: str, memory: DeviceMemory | None) -> None:
  """ConfigError when a compiled step's `stats` (metrics.compiled_stats) exceed `memory`."""
  need = stats.get("total_bytes")
  if need is None or memory is None or need <= memory.bytes:
    return
  raise ConfigError(f"the {what} needs {need / GiB:,.1f} GiB per device, the device has "
                    f"{memory.bytes / GiB:,.1f} GiB ({memory.source}); {FIX[what]}")


def check_train(exp, *, train_batch: dict, eval_batch: dict) -> dict:
  """Compiles the train and eval steps of `exp` for global batches shaped like `train_batch`
  and `eval_batch` (one process's rows of each); refuses (ConfigError) a step that does not
  fit. Returns the train step's compiled_stats."""
  memory = device_memory(exp.mesh.local_devices)
  state = exp.abstract_state_inputs()
  train = metrics_lib.compiled_stats(compile_step(
      exp.step_fn, (state, exp.abstract_batch(train_batch, rows=exp.source.batch_size)),
      exp=exp, what="train step"))
  check(train, what="train step", memory=memory)
  check_eval(exp, eval_batch, memory=memory)
  return train


def check_eval(exp, eval_batch: dict, *, memory: DeviceMemory | None = None) -> None:
  """Compiles the eval step for eval.batch_size rows shaped like `eval_batch`; refuses one that
  does not fit."""
  memory = memory or device_memory(exp.mesh.local_devices)
  args = (exp.abstract_state_inputs().params,
          exp.abstract_batch(eval_batch, rows=exp.run.eval.batch_size))
  stats = metrics_lib.compiled_stats(compile_step(exp.eval_fn, args, exp=exp, what="eval step"))
  check(stats, what="eval step", memory=memory)
