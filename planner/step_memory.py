"""Does the step fit in device memory? Checked on the compiled step before anything runs.

The train step (and the eval step) are compiled with abstract, sharded inputs, the way
`axtrain plan` compiles them (planner/plan.py); the executable's memory analysis gives the
bytes one device needs: arguments + outputs not aliased to them + temporaries. The compile is
the one the run would make anyway: jit's cache hands the same executable to the first real
step. A step that needs more than the device has is refused in one line, instead of a
RESOURCE_EXHAUSTED part-way into the run: by how much, and what would fit (`fix`): changes
that keep the run's math, not already made, each with the analytic memory model's figure.

Device memory: what the backend reports (`memory_stats()["bytes_limit"]` on GPU and TPU); on
CPU, the host memory available now (/proc/meminfo MemAvailable) shared by the local devices.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Callable

import jax

from core.registry import ConfigError
from planner import plan as plan_lib, plan_report, sweep_screen, sweep_space
from planner.compiler_output import refused_bytes
from trainer import experiment, host_memory, metrics as metrics_lib

GiB = 1024 ** 3
# What the refusal's advice may change, in words; and the last resort, which changes the recipe.
KNOBS = {"train step": "gradient accumulation, remat, loss chunks or attention",
         "eval step": "eval rows per pass, loss chunks or attention"}
LAST_RESORT = {"train step": "lower data.batch_size or data.seq_len",
               "eval step": "lower eval.batch_size or data.seq_len"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceMemory:
  bytes: int  # per device
  source: str  # where the figure comes from, in words


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
    host = host_memory.available()
    if host:
      return DeviceMemory(bytes=host // max(len(devices), 1),
                          source="host memory available" + (
                              f", shared by {len(devices)} CPU devices" if len(devices) > 1
                              else ""))
  return None


def fix(exp, *, what: str, need: int | None, memory: int | None, entry=None) -> str:
  """What to change for a step of `exp` that needs `need` bytes where a device has `memory`:
  the changes that keep the run's math and mesh, not already made, which the compiler finds
  within the device (each compiled: `verified`), at most three with its figure; where none
  compiles within it, those the analytic model puts there, labelled unverified (its figures
  scaled by need / its figure for the step: planner/sweep_screen.py:fixes); else the last
  resort, which changes the recipe. Where the parameters alone exceed the device, none of
  these can fit: it says so, and names a smaller model or more devices. `entry`: the mesh
  entry, to name the sweep."""
  eval_step = what == "eval step"
  params = sweep_screen.state_bytes(exp, eval_step=True)  # the parameters alone (exact)
  if memory and params > memory:  # no layout or recipe of this model and mesh fits
    return (f"its parameters alone take {plan_report.gib(params)} per device (float32), more "
            f"than the device has, so no setting of this run fits: a smaller model "
            f"(model.dim, model.num_layers), or more devices to shard them over (mesh.fsdp)")
  now = sweep_screen.model_bytes(exp, eval_step=eval_step)
  # The model's figures are compared at its own scale: the device's memory times now / need.
  within = memory * now / (need or now) if memory else 0
  options = sweep_screen.fixes(exp, eval_step=eval_step, within=within, entry=entry,
                             limit=VERIFY_LIMIT)
  sweep = (f"; `axtrain plan --sweep --mesh={entry.name}` compiles and ranks them"
           if entry is not None and entry.num_devices else "")
  checked = verified(exp, [cand for cand, _ in options], what=what, memory=memory, entry=entry)
  if checked:
    listed = ", ".join(f"{cand.flags()} (compiled: {plan_report.gib(b)})" for cand, b in checked)
    return f"what fits by the compiler: {listed}{sweep}"
  if options:
    listed = ", ".join(f"{cand.flags()} (model: {plan_report.gib(b)})"
                       for cand, b in options[:FIXES_LISTED])
    return (f"what would fit by the analytic model, unverified (it puts this step at "
            f"{plan_report.gib(now)}, the device at {plan_report.gib(within)} on that scale; "
            f"none of these compiled within the device): {listed}{sweep}")
  recipe = "" if eval_step else "".join(
      f", or optimizer.{path.split('.')[-1]}={value}" for path, value in sweep_space.RECIPE.items()
      if sweep_space.get_path(exp.run, path) not in (None, value))
  sweep = (f"; `axtrain plan --sweep --sweep_recipe --mesh={entry.name}` compiles them"
           if sweep and not eval_step else "")
  return (f"no change of {KNOBS[what]} fits by the analytic model (it puts this step at "
          f"{plan_report.gib(now)}); {LAST_RESORT[what]}{recipe} (these change the training "
          f"recipe){sweep}")


FIXES_LISTED = 3  # options a refusal names
VERIFY_LIMIT = 6  # options the analytic model proposes, compiled in its order until 3 fit


def verified(exp, cands, *, what: str, memory: int | None, entry=None) -> list:
  """[(Candidate, compiled bytes)] of `cands` (changes of `exp`'s run on mesh entry `entry`),
  compiled for `exp`'s devices in order, that need at most `memory` bytes per device: at most
  FIXES_LISTED. None without an entry or a memory figure."""
  if not memory or entry is None:
    return []
  eval_step, out, run = what == "eval step", [], sweep_space.normalized(exp.run)
  for cand in cands:
    try:
      changed = experiment.build(cand.apply(run), entry, list(exp.mesh.devices.flat))
      changed = dataclasses.replace(changed, compute_dtype=exp.compute_dtype)
      rows = changed.run.eval.batch_size if eval_step else changed.source.batch_size
      state, batch = plan_lib.abstract_inputs(changed, rows)
      fn, args = ((changed.eval_fn, (state.params, batch)) if eval_step
                  else (changed.step_fn, (state, batch)))
      with changed.context():
        stats = metrics_lib.compiled_stats(fn.lower(*args).compile())
    except (ConfigError, jax.errors.JaxRuntimeError):  # does not build, or the compiler refused
      continue
    need = stats.get("total_bytes")
    if need is not None and need <= memory:
      out.append((cand, need))
      if len(out) == FIXES_LISTED:
        break
  return out


def compile_step(fn, args, *, exp, what: str, memory: DeviceMemory | None = None, entry=None,
                 lowered=None):
  """`fn.lower(*args).compile()` under the experiment's mesh and rules (`lowered`: that lowering,
  where the caller made it); a compiler that runs out of device memory (the TPU compiler refuses
  such programs) is a ConfigError that says what would fit (`fix`)."""
  with exp.context():
    lowered = lowered if lowered is not None else fn.lower(*args)
    try:
      return lowered.compile()
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      message = str(e)
  # Outside the mesh context: the model reads the boxed parameters, whose unboxing would
  # apply their sharding constraints under it.
  temporaries, available = refused_bytes(message)
  has = available or (memory.bytes if memory else None)
  need = f"needs {plan_report.gib(temporaries)} of temporaries" if temporaries else (
      "does not fit")
  where = f" ({plan_report.gib(has)} available)" if has else ""
  state = sweep_screen.state_bytes(exp, eval_step=what == "eval step")
  advice = fix(exp, what=what, need=temporaries and temporaries + state, memory=has,
               entry=entry)
  raise ConfigError(f"the {what} {need}: the compiler ran out of device memory{where}; "
                    f"{advice}")


def check(stats: dict, *, exp, what: str, memory: DeviceMemory | None, entry=None) -> None:
  """ConfigError when a compiled step's `stats` (metrics.compiled_stats) exceed `memory`; it
  says what would fit (`fix`)."""
  need = stats.get("total_bytes")
  if need is None or memory is None or need <= memory.bytes:
    return
  advice = fix(exp, what=what, need=need, memory=memory.bytes, entry=entry)
  raise ConfigError(f"the {what} needs {plan_report.gib(need)} per device, the device has "
                    f"{plan_report.gib(memory.bytes)} ({memory.source}); {advice}")


def check_train(exp, *, train_batch: dict, eval_batch: dict, entry=None,
                on_lowered: Callable[[], None] | None = None) -> dict:
  """Compiles the train and eval steps of `exp` for global batches shaped like `train_batch`
  and `eval_batch` (one process's rows of each); refuses (ConfigError) a step that does not
  fit. `entry`: the run's mesh entry (the refusal names its sweep). `on_lowered`: called once the
  train step is traced and lowered (the caller starts its own compiles then). Returns the train
  step's compiled_stats."""
  memory = device_memory(exp.mesh.local_devices)
  state = exp.abstract_state_inputs()
  batch = exp.abstract_batch(train_batch, rows=exp.source.batch_size)
  # The train step is traced and lowered first, with no other trace beside it: tracing is
  # Python, and threads tracing or lowering beside it share the interpreter (llm_1b's train step
  # traced in 20.9-23.6 s in runs on a v5e host, beside the eval step's and the init's threads,
  # against 6.7 s alone). Its compile then runs beside the eval step's, in a thread this waits
  # for: llm_1b's steps on one v5e took 65 s to be read back one after the other. A refused
  # train step is reported, not the eval step's, once the eval step's compile has ended (a
  # compile cannot be stopped).
  with exp.context():
    train_lowered = exp.step_fn.lower(state, batch)
  if on_lowered is not None:
    on_lowered()
  with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="axtrain-eval") as pool:
    evaluated = pool.submit(check_eval, exp, eval_batch, memory=memory, entry=entry)
    train = metrics_lib.compiled_stats(compile_step(
        exp.step_fn, (state, batch), exp=exp, what="train step", memory=memory, entry=entry,
        lowered=train_lowered))
    check(train, exp=exp, what="train step", memory=memory, entry=entry)
    evaluated.result()
  return train


def check_eval(exp, eval_batch: dict, *, memory: DeviceMemory | None = None,
               entry=None) -> None:
  """Compiles the eval step for eval.batch_size rows shaped like `eval_batch`; refuses one that
  does not fit."""
  memory = memory or device_memory(exp.mesh.local_devices)
  args = (exp.abstract_state_inputs().params,
          exp.abstract_batch(eval_batch, rows=exp.run.eval.batch_size))
  stats = metrics_lib.compiled_stats(compile_step(exp.eval_fn, args, exp=exp, what="eval step",
                                                  memory=memory, entry=entry))
  check(stats, exp=exp, what="eval step", memory=memory, entry=entry)
