"""One `axtrain` training invocation after its flags parsed: resolve the run, train it, exit code.

The mesh (trainer/meshes.py), the run directory (run_dir.py), its lock
(run_lock.py), signals (preemption.py) and the --print_config text (flat.py)
each live in their own module; this one only puts them in order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import sys
import traceback

import jax
import ml_collections
from absl import flags

from launcher import (config_loading, convert, distributed, flat, folders, platforms,
                      preemption, run_dir as run_dir_lib, run_lock, run_names, starting)
from launcher.errors import EXIT_NO_SPACE, ConfigError, UserError
from modules import attn_registry, quantization
from trainer import checkpoint, checkpoint_files, compile_cache, config as config_lib, disk
from trainer import experiment as experiment_lib
from trainer import flops, loop, mesh_rules, meshes, schedules, sharding
from trainer import startup as startup_lib
from trainer.callbacks import Callback
from trainer.progress import Progress


EXIT_FAILED = 1  # non-finite loss, no usable checkpoint: retrying the same command will not help


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
  """Everything one training invocation resolved before it touches the disk."""
  argv: list[str]
  config_value: str  # the --config argument, FILE[:arg]
  run_dir: run_dir_lib.RunDir
  resolved: dict  # the resolved config as JSON (config.json)
  exp: experiment_lib.Experiment
  mesh: meshes.Entry
  rule: str | None  # the mesh rule that applied (its match in words), if any
  overwrite: bool
  rewrite_config: bool  # config.json damaged: written again from this command's config
  progress: bool
  main_process: bool
  multi_process: bool  # joined jax.distributed: stops are agreed between the processes
  callbacks: tuple  # trainer.callbacks.Callback objects for the loop
  startup: startup_lib.Startup  # when the phases before the first step ended
  notes: tuple = ()  # what to say of the config once the run is accepted (axtrain: note: ...)
  cache_dir: pathlib.Path | None = None  # the compilation cache's folder (None: off)


def run(fv: flags.FlagValues, argv: list[str], *, callbacks=()) -> int:
  """`callbacks`: trainer.callbacks.Callback objects for the training loop (tests inject them)."""
  multi_process = distributed.maybe_initialize(
      fv.coordinator_address, fv.num_processes, fv.process_id, mode=fv.distributed,
      timeout_s=fv.distributed_timeout)
  platforms.check_backend()
  cfg: ml_collections.ConfigDict = fv["config"].value
  items = config_loading.overrides(argv)
  if fv.print_config:
    return _print_config(fv.mesh, cfg, items)
  entry = meshes.select(fv.mesh)
  rule = mesh_rules.apply_rules(cfg, entry, {k for k, _ in items})
  run_cfg = config_lib.parse(cfg)
  meshes.check_present(entry)
  cache_dir = compile_cache.enable(run_cfg.trainer.compile_cache)
  exp = experiment_lib.build(run_cfg, entry)
  startup = startup_lib.Startup()
  startup.note("to_experiment_s")
  platform = exp.mesh.devices.flat[0].platform
  # Said once the run is accepted (_train), not before a refusal of its directory or memory.
  notes = tuple(n for n in (
      schedules.fit_note(run_cfg.optimizer.schedule, total_steps=run_cfg.trainer.max_steps),
      kernel_note(run_cfg.model, platform=platform),
      quantization.emulation_note(run_cfg.model.quantization, platform=platform)) if n)

  config_value = config_loading.config_file_arg(argv)
  rd = run_dir_lib.RunDir(_output_dir(fv, config_value, items, cfg=cfg, mesh=entry.name))
  run_dir_lib.check_writable(rd.path)
  nested = folders.enclosing_run(rd.path)
  if nested is not None:
    raise UserError(folders.nested_message(rd.path, nested))
  check_init_from(run_cfg.init.from_run, exp.abstract_state.params,
                  layout=convert.layout_of(cfg.model.to_dict()))
  checkpoint.check_restore_step(rd.path / "checkpoints", run_cfg.checkpoint.restore_step)
  main_process = jax.process_index() == 0
  this = Run(argv=argv, config_value=config_value, run_dir=rd,
             resolved=json.loads(cfg.to_json_best_effort()), exp=exp, mesh=entry, rule=rule,
             overwrite=fv.overwrite, rewrite_config=fv.rewrite_config, progress=fv.progress,
             main_process=main_process, notes=notes,
             multi_process=multi_process, callbacks=tuple(callbacks), startup=startup,
             cache_dir=cache_dir)
  try:
    if not main_process:
      return _train(this)
    with run_lock.RunLock(rd.path) as lock, preemption.undone_on_stop(lock.forget):
      return _train(this)
  except distributed.PeerLost:
    distributed.exit_alone(EXIT_FAILED)  # after the lock's release
    raise  # not reached


def kernel_note(model, *, platform: str) -> str | None:
  """What to say when attention's kernel is not native to `platform`: a Pallas TPU kernel
  (splash, pallas_hd64: attn_registry.Supports.native) elsewhere runs in Pallas's interpret
  mode (right, but slow: for tests)."""
  name = flops.find_field(model, "implementation")
  native = attn_registry.IMPLEMENTATIONS.get(name).supports.native if name else None
  if native is None or native == platform:
    return None
  return (f"attention.implementation={name} is a {native.upper()} kernel: on {platform} it runs "
          f"in Pallas interpret mode (slow, for tests); xla or chunked attention is fast here")


def _schedule_note(run_cfg) -> None:
  """--print_config's note of a warm-up that does not fit (a run says it in _train)."""
  note = schedules.fit_note(run_cfg.optimizer.schedule, total_steps=run_cfg.trainer.max_steps)
  if note and jax.process_index() == 0:
    print(f"axtrain: note: {note}", file=sys.stderr)


def _print_config(mesh: str, cfg: ml_collections.ConfigDict, items) -> int:
  """--print_config: the config resolved for `mesh` (on any machine: a named entry's rule and
  axes need none of its devices), its parameter count and the rule that applied."""
  entry = meshes.select(mesh) if mesh == "auto" else meshes.lookup(mesh)
  rule = mesh_rules.apply_rules(cfg, entry, {k for k, _ in items})
  run_cfg = config_lib.parse(cfg)
  _schedule_note(run_cfg)
  here = entry.num_devices in (None, jax.device_count()) and (
      entry.hardware.platform == jax.devices()[0].platform)
  if here:  # every check a run makes against the mesh (shapes, batch splits)
    exp = experiment_lib.build(run_cfg, entry)
    num_params, axes = exp.num_params, dict(exp.mesh.shape)
  else:
    num_params = experiment_lib.count_params(run_cfg)
    axes = sharding.resolve_axes(entry, run_cfg.mesh, entry.num_devices)
  sys.stdout.write(flat.print_config_text(cfg, num_params=num_params, mesh=entry.name,
                                          axes=axes, rule=rule))
  if not here:
    sys.stdout.write(f"# {entry.name}'s devices are not here: its shardings are checked when it "
                     f"trains there, or now by `axtrain plan --mesh={entry.name}`\n")
  return 0


def _output_dir(fv: flags.FlagValues, config_value: str, items: list[tuple[str, str]], *,
                cfg: ml_collections.ConfigDict, mesh: str) -> pathlib.Path:
  """--output_dir (with ~ expanded), or the default directory named from the overrides' values."""
  if fv["output_dir"].present:
    if not fv.output_dir.strip():
      raise UserError("--output_dir is empty; give a directory, or leave the flag out for the "
                      "default runs/<config>/<overrides>")
    return pathlib.Path(os.path.expanduser(fv.output_dir))
  return run_names.directory(config_value, items, resolved=cfg, mesh=mesh)


def check_init_from(run_dir: str, abstract_params, *, layout: dict | None = None) -> None:
  """Refuses an init.from_run whose checkpoint this model's parameters cannot read; a converted
  model laid out otherwise than this model (`layout`: launcher/convert.py:layout_of, its layers
  stacked or not, its projections fused or not) is also told the conversion with this model's
  layout."""
  if run_dir and not (pathlib.Path(run_dir) / "checkpoints").is_dir():
    kind = disk.not_a(run_dir, "directory")
    where = f"{run_dir} {kind}" if kind else f"{run_dir}: no checkpoints/ there"
    raise UserError(f"init.from_run={where}; give a run directory of axtrain or of `axtrain "
                    f"convert`")
  if not run_dir:
    return
  try:
    checkpoint.check_params_compatible(run_dir, abstract_params)
  except ConfigError as e:
    source = run_dir_lib.RunDir(pathlib.Path(run_dir))
    theirs = convert.layout_of((source.stored_config() or {}).get("model") or {})
    info = source.info()
    if "converted_from" not in info or layout in (None, theirs):
      raise
    flags_ = "".join(f" --{name}={str(value).lower()}" for name, value in layout.items()
                     if value != theirs[name] or value != convert.LAYOUT[name])
    raise ConfigError(f"{e}, or convert the model again with this model's layout: axtrain "
                      f"convert --from_hf={info['converted_from']}{flags_} "
                      f"--output_dir=NEW_DIR") from None


def _stop_handling(this: Run, finish, progress):
  """The signal handling, the loop's stop request and its callbacks.

  One process: SIGTERM/SIGINT stop it after the step in flight (preemption.py). Several: every
  process must stop after the same step, which JAX's preemption service agrees on; SIGTERM
  goes to it, and a first SIGINT (Ctrl-C in one process's terminal) is passed on to it as a
  SIGTERM of this process (launcher/distributed.py:AgreedStop).
  """
  def second() -> str:
    finish("preempted", signal="second")
    # Read last, after which no save of this process commits: one in flight may commit while
    # run.json is written, and must not between the listing and the exit.
    steps = checkpoint_files.final_committed_steps(this.run_dir.path / "checkpoints")
    return (f"a checkpoint still being written is abandoned; the run resumes from its newest "
            f"committed one, step {steps[-1]}" if steps else
            "no checkpoint was committed yet: the run starts over")
  if not this.multi_process:
    stop = preemption.Preemption(on_second=second)
    return stop, stop.requested, this.callbacks
  agreed = distributed.AgreedStop(say=progress.message)
  stop = preemption.Preemption(on_second=second, signals=(signal.SIGINT,),
                               on_first=lambda _: os.kill(os.getpid(), signal.SIGTERM))
  return stop, agreed.requested, (agreed, *this.callbacks)


def _train(this: Run) -> int:
  """Trains in a locked run directory: fresh, resumed from its last committed checkpoint (on
  any mesh: `relaid` fields may change, with a note), or extended (trainer.max_steps raised)."""
  rd, exp = this.run_dir, this.exp
  state = rd.prepare(this.resolved, overwrite=this.overwrite, rewrite_config=this.rewrite_config)
  if state == "rewrite_config":  # the checkpoints must be this model's, else nothing is written
    checkpoint.check_params_compatible(rd.path, exp.abstract_state.params,
                                       field="--rewrite_config")
  if state == "completed":
    hint = "raise --config.trainer.max_steps to extend it" + (
        "" if rd.unproven() else ", or pass --overwrite to train again")
    print(f"axtrain: {rd.path} already completed; nothing to do ({hint})", file=sys.stderr)
    return 0
  extension = _Extension(rd, exp) if state == "extend" else None
  fresh = state in ("new", "overwrite")
  early, init, (compiled, compiler_lines, compiler_notes) = starting.compile_reading(
      this.exp, this.mesh, run_dir=rd.path, startup=this.startup, fresh=fresh,
      cache_dir=this.cache_dir, resolved=this.resolved)
  for note in this.notes if this.main_process else ():
    print(f"axtrain: note: {note}", file=sys.stderr)
  if this.main_process:
    with preemption.held():  # a signal lets the run directory's files be written whole first
      _start(this, fresh=fresh, extension=extension, compiled=compiled)
      _keep_compiler_log(rd, compiler_lines, compiler_notes)
  _keep_runtime_log(this)
  progress = Progress(exp.run.trainer.max_steps, enabled=this.progress and this.main_process)
  progress.message(f"axtrain: training {this.config_value} in {rd.path}")
  finish = rd.finish if this.main_process else (lambda *a, **k: None)
  stop, stop_requested, callbacks = _stop_handling(this, finish, progress)
  if this.main_process:  # says where an extension continues once the restore has said it
    callbacks = (_ExtensionRecord(rd, exp, extension), *callbacks)
  try:
    with stop.installed(), _then_finishing():
      result = loop.train(exp, run_dir=rd.path, progress=progress,
                          checkpoint_dir=rd.path / "checkpoints", stop_requested=stop_requested,
                          callbacks=callbacks,
                          hardware_peak_flops=this.mesh.hardware.peak_bf16_flops, early=early,
                          initialised=init)
  except (loop.NonFiniteError, checkpoint.CheckpointError) as e:
    return _failed(this, finish, _checkpoint_advice(rd, e))
  except jax.errors.JaxRuntimeError as e:
    if not this.multi_process:
      finish("failed", error=traceback.format_exc(limit=-3))
      raise
    _failed(this, finish, _peer_failure(e))
    raise distributed.PeerLost() from None
  except KeyboardInterrupt:
    finish("interrupted")
    raise
  except Exception as e:  # pylint: disable=broad-except
    full = disk.as_no_space(e)  # a write of the run (metrics, a checkpoint, ...) found no room
    if full is not None:
      return _no_space(this, finish, full)
    finish("failed", error=traceback.format_exc(limit=-3))
    raise
  return _finished(this, result, finish, progress)


def _keep_runtime_log(this: Run) -> None:
  """Each process of a multi-process run keeps what the JAX runtime logs in the run directory's
  runtime/p<N>.log (launcher/distributed.py:runtime_output_to), once process 0 has written the
  run's files (a barrier); process 0 lists every process's in the manifest and says where."""
  if not this.multi_process:
    return
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  ocp.multihost.sync_global_processes("axtrain_run_files_written")
  path = distributed.runtime_log(this.run_dir.path, jax.process_index())
  if this.main_process:
    this.run_dir.manifest.add(*(distributed.runtime_log(this.run_dir.path, i)
                                for i in range(jax.process_count())))
    print(f"axtrain: note: the JAX runtime's own messages (its C++ and absl logging) go to "
          f"{path.parent}/p<N>.log, one per process", file=sys.stderr)
  distributed.runtime_output_to(path)


@contextlib.contextmanager
def _then_finishing():
  """After the loop (inside the signal handling of the loop, so no signal falls between), later
  signals change nothing: run.json and the last line follow, then the exit."""
  try:
    yield
  finally:
    preemption.finishing()


def _start(this: Run, *, fresh: bool, extension: "_Extension | None", compiled: dict) -> None:
  """Process 0: the notes of a resumed run (relaid fields, an extension), then run.json."""
  rd, exp = this.run_dir, this.exp
  if rd.stored_config() is None and not fresh:  # --rewrite_config
    print(f"axtrain: note: {rd.config_json} was missing or not valid JSON: written again from "
          f"this command's config (the newest checkpoint's parameters fit its model; every "
          f"other field is this command's)", file=sys.stderr)
  damage = None if fresh else rd.info_damage()
  if damage:
    print(f"axtrain: note: {rd.run_json} {damage}: written again; lost with it: "
          f"{', '.join(run_dir_lib.LOST)} (restarts are counted from 0 and the first start is "
          f"this one; run.json's `rebuilt` says so); the config, checkpoints and metrics are "
          f"intact", file=sys.stderr)
  if not fresh and rd.manifest.path.exists() and rd.manifest.files() is None:
    print(f"axtrain: note: {rd.manifest.path} is empty or damaged: written again from the files "
          f"the run's layout shows to be axtrain's", file=sys.stderr)
  relaid = [] if fresh or rd.stored_config() is None else rd.relaid_changes(this.resolved)
  if relaid:
    print(f"axtrain: note: {rd.path} continues with {', '.join(relaid)} (where and how its "
          f"steps run and are recorded, not what they compute: the same run)", file=sys.stderr)
  extensions = rd.info().get("extensions", []) + ([extension.record] if extension else [])
  rd.start(this.resolved, argv=this.argv, fresh=fresh,
           extra={"mesh": {"name": this.mesh.name, "axes": dict(exp.mesh.shape),
                           "rule": this.rule},
                  "num_params": exp.num_params, "process_count": jax.process_count(),
                  "restore_step": exp.run.checkpoint.restore_step, "compiled_step": compiled,
                  **({"extensions": extensions} if extensions else {}),
                  **({"rebuilt": {"time": run_dir_lib.now(), "reason": f"run.json {damage}",
                                  "lost": list(run_dir_lib.LOST)}} if damage else {})})


def _keep_compiler_log(rd: run_dir_lib.RunDir, lines: list[str], notes: list[str]) -> None:
  """XLA's own lines of the steps' compile (its C++ logging, raw on the console otherwise) go
  to the run's compiler.log, appended start after start; one note says so, and what they say
  in words where it is known (planner/compiler_output.py:compiler_log)."""
  if not lines:
    return
  path = rd.path / run_dir_lib.COMPILER_LOG
  rd.manifest.add(path)
  with open(path, "a", encoding="utf-8") as f:
    f.write(f"# {run_dir_lib.now()}: compiling the train and eval steps\n" + "\n".join(lines)
            + "\n")
  said = f" ({'; '.join(notes)})" if notes else ""
  print(f"axtrain: note: XLA logged {len(lines)} line{'s' if len(lines) > 1 else ''} while "
        f"compiling the steps{said}; they are in {path}", file=sys.stderr)


def _failed(this: Run, finish, message: str) -> int:
  """Records and prints a failure in one line; EXIT_FAILED."""
  finish("failed", error=message)
  print(f"axtrain: error: {message}", file=sys.stderr, flush=True)
  return EXIT_FAILED


def _no_space(this: Run, finish, full: disk.NoSpace) -> int:
  """A write of the run found its disk full: one line saying where, what it needed and how to go
  on, recorded in run.json where that still fits (else run.json keeps `running`, which the same
  command resumes all the same); EXIT_NO_SPACE."""
  steps = checkpoint_files.committed_steps(this.run_dir.path / "checkpoints")
  then = (f"it resumes from its checkpoint of step {steps[-1]}" if steps
          else "it starts over, no checkpoint was written yet")
  message = (f"{full}; {'raise the quota or delete files' if full.quota else 'free space'} "
             f"there, then run the same command again: {then}")
  try:
    finish("failed", error=message)
  except disk.NoSpace:
    pass
  print(f"axtrain: error: {message}", file=sys.stderr, flush=True)
  return EXIT_NO_SPACE


def _checkpoint_advice(rd: run_dir_lib.RunDir, e: Exception) -> str:
  """A non-finite loss's or checkpoint's message, with how to start over where none reads."""
  message = str(e)
  if isinstance(e, checkpoint.NoUsableCheckpoint):
    unproven = rd.unproven()
    message += ("; pass --overwrite to start the run over" if not unproven else
                f"; choose another --output_dir to start it over ({rd.path} also holds files "
                f"that axtrain did not write: {', '.join(unproven[:3])})")
  return message


def _peer_failure(e: Exception) -> str:
  """The JAX runtime's error in one process of several: how another process's death shows up
  here (a collective whose peer is gone), so one line rather than a traceback."""
  first = " ".join((str(e).splitlines() or [type(e).__name__])[0].split())[:300]
  return (f"process {jax.process_index()} of {jax.process_count()}: the JAX runtime failed "
          f"({first}); in a run of several processes this is how another process's end shows "
          f"up (see its output); the run resumes from its last checkpoint when started again")


def _finished(this: Run, result: loop.Result, finish, progress: Progress) -> int:
  """run.json and the last line of a run that completed or stopped on request; its exit code."""
  rd = this.run_dir
  startup = ({"startup": this.startup.record(state_s=result.state_s,
                                             first_step_s=result.time_to_first_step_s,
                                             first_compile_s=result.first_compile_s,
                                             first_step_at=result.first_step_at)}
             if result.first_step_at else {})
  if result.preempted:
    finish("preempted", last_step=result.last_step, resumed_from_step=result.start_step,
           compiled_step=result.compiled, profiles=result.profiles, **startup)
    print(f"axtrain: preempted after step {result.last_step}; checkpoint saved in "
          f"{rd.path / 'checkpoints'}; re-run the same command to resume "
          f"(exit {preemption.EXIT_PREEMPTED})", file=sys.stderr)
    return preemption.EXIT_PREEMPTED
  last = next((r for r in reversed(result.records) if "loss" in r), {})
  finish("completed", final_loss=last.get("loss"), final_eval_loss=result.final_eval_loss,
         time_to_first_step_s=result.time_to_first_step_s, resumed_from_step=result.start_step,
         compiled_step=result.compiled, profiles=result.profiles, **startup)
  done = f"axtrain: done; final eval_loss {result.final_eval_loss:.4f}; run directory {rd.path}"
  if progress.enabled:
    progress.message(done)
  elif this.main_process:  # --noprogress leaves out the progress lines, not the outcome
    print(done, file=sys.stderr)
  return 0


class _Extension:
  """An extension (trainer.max_steps raised): run.json records it when the run starts, without
  the step it continues from, which only the restore knows (an unreadable newest checkpoint
  moves it back to an older one); `_ExtensionRecord` adds that step and prints the note."""

  def __init__(self, rd: run_dir_lib.RunDir, exp: experiment_lib.Experiment):
    self.stored = config_lib.parse(rd.stored_config())
    self.old, self.new = self.stored.trainer.max_steps, exp.run.trainer.max_steps
    self.record = {"from_max_steps": self.old, "to_max_steps": self.new,
                   "time": run_dir_lib.now()}

  def note(self, rd: run_dir_lib.RunDir, exp: experiment_lib.Experiment, *, at: int) -> str:
    change = schedules.extension_note(self.stored.optimizer.schedule, exp.run.optimizer.schedule,
                                      peak=exp.run.optimizer.learning_rate, old_total=self.old,
                                      new_total=self.new, at_step=at)
    return (f"extending {rd.path} from trainer.max_steps {self.old} to {self.new}, continuing "
            f"from step {at}; {change}")


class _ExtensionRecord(Callback):
  """Process 0, once the initial state is restored: the step an extension continues from and
  the learning rate of its next step, in run.json's last extension that lacks them (this run's,
  or that of an extending run that stopped before its restore), and this run's note."""

  def __init__(self, rd: run_dir_lib.RunDir, exp: experiment_lib.Experiment,
               extension: _Extension | None):
    self.rd, self.exp, self.extension = rd, exp, extension

  def on_train_start(self, loop) -> None:
    info = self.rd.info()
    extensions = info.get("extensions") or []
    if not extensions or not isinstance(extensions[-1], dict) or "at_step" in extensions[-1]:
      return
    rate = self.exp.optimizer.schedule(loop.start)  # step start + 1's, as the step computes it
    extensions[-1].update(at_step=loop.start, learning_rate=float(rate))
    run_dir_lib.write_json(self.rd.run_json, info)
    if self.extension is not None:
      print(f"axtrain: note: {self.extension.note(self.rd, self.exp, at=loop.start)}",
            file=sys.stderr)
