"""`axtrain plan`: compile a run's train and eval steps for a mesh entry's devices, ahead of time.

    devices  TPU entries: libtpu's compile-only topology (the real TPU compiler, exact bytes);
             GPU entries: the jax-cuda12 plugin's compile-only topology (XLA's GPU compiler,
             told what the GPU is by planner/gpu_targets.py); Trainium entries: as many CPU
             devices (exact sharding and argument bytes, the CPU compiler's temporaries) plus
             the analytic memory model (planner/memory_model.py).
    compile  jit(train_step).lower(abstract sharded state and batch).compile(): nothing allocated.
    plan     per-device memory (compiler and analytic), fit against the entry's memory, model
             FLOPs (trainer.flops) next to the compiler's, and a roofline estimate of step time,
             tokens/s and MFU from the entry's peak FLOP/s, HBM and link bandwidth and the
             collectives found in the compiled HLO (planner/hlo_collectives.py).

The report is planner/plan_report.py; the layout sweep, planner/plan_sweep.py; what XLA logs
meanwhile, planner/compiler_output.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Callable

import jax
import numpy as np

from core.registry import ConfigError
from modules import pipeline
from trainer import experiment as experiment_lib, flops as flops_lib, metrics as metrics_lib
from planner import calibration as calibration_lib
from planner import gpu_targets, hlo_collectives, hlo_ops, host_ram, memory_model
from planner.compiler_output import compiler_log, refused_bytes
from trainer.config import RunConfig
from trainer.meshes import Entry

GiB = 1024 ** 3
# libtpu's cost model times each op alone: with windowed einsum a matmul and its all-gather or
# reduce-scatter become one loop it cannot see into. These options turn that off (per compile).
WINDOWED_EINSUM_OFF = {"xla_tpu_enable_windowed_einsum_for_all_gather": False,
                       "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False}
LIBTPU_INSTALL = "pip install 'jax[tpu]==0.10.2' (or `make install`)"
TPU_COMPILER = "TPU compiler (libtpu)"
GPU_COMPILER = "GPU compiler (XLA, jax-cuda12 plugin)"


# --- devices ------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_libtpu():
  """libtpu wants to know the host it runs on; a compile-only topology needs none. Several
  plans may compile at once (no TPU is opened, so libtpu's one-process lock is not needed).
  Set only for the topology call, then restore the environment."""
  values = {"TPU_ACCELERATOR_TYPE": "v5litepod-1", "TPU_WORKER_HOSTNAMES": "localhost",
            "TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  saved = {k: os.environ.get(k) for k in values}
  for k, v in values.items():
    os.environ.setdefault(k, v)
  try:
    yield
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def target_devices(entry: Entry) -> tuple[list, str]:
  """(devices to compile for, what compiles): a compile-only topology or CPU stand-ins."""
  if entry.num_devices is None:
    raise ConfigError(f"--mesh={entry.name} has no fixed device count; plan a named entry "
                      f"(docs/meshes.md), e.g. tpu-v5e-16 or gpu-h100-8")
  if entry.hardware.platform == "tpu":
    return _tpu_devices(entry), TPU_COMPILER
  if entry.hardware.platform == "gpu":
    return _gpu_devices(entry), GPU_COMPILER
  cpus = jax.devices("cpu")
  if len(cpus) < entry.num_devices:
    raise ConfigError(f"--mesh={entry.name} needs {entry.num_devices} CPU stand-in devices but "
                      f"JAX has {len(cpus)}; run through `axtrain plan` (it sets XLA_FLAGS="
                      f"--xla_force_host_platform_device_count={entry.num_devices})")
  return cpus[:entry.num_devices], f"CPU compiler standing in for {entry.hardware.platform}"


def _tpu_devices(entry: Entry) -> list:
  try:
    import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise ConfigError(f"--mesh={entry.name}: planning a TPU entry needs libtpu (the TPU "
                      f"compiler); install it with {LIBTPU_INSTALL}") from None
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    options = dict(entry.topology_options)
    if entry.num_slices > 1:
      options["num_slices"] = entry.num_slices
    with _quiet_libtpu():
      devices = topologies.get_topology_desc(platform="tpu", topology_name=entry.topology,
                                             **options).devices
  except Exception as e:  # pylint: disable=broad-except  (libtpu raises JaxRuntimeError)
    raise ConfigError(f"--mesh={entry.name}: libtpu cannot make topology "
                      f"'{entry.topology}': {' '.join(str(e).split())[:200]}") from None
  return list(devices)


def check_gpu_plugin(entry_name: str) -> None:
  """The jax-cuda12 plugin and its PJRT library, at jaxlib's version (one-line error if not)."""
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  want = metadata.version("jaxlib")
  for package in ("jax-cuda12-plugin", "jax-cuda12-pjrt"):
    try:
      have = metadata.version(package)
    except metadata.PackageNotFoundError:
      raise ConfigError(f"--mesh={entry_name}: planning a GPU entry needs XLA's GPU compiler "
                        f"({package} is not installed); install it with "
                        f"{gpu_targets.PLUGIN_INSTALL}") from None
    if have != want:
      raise ConfigError(f"--mesh={entry_name}: {package} {have} does not match jaxlib {want}; "
                        f"install {package}=={want} ({gpu_targets.PLUGIN_INSTALL})")


def _gpu_devices(entry: Entry) -> list:
  """Compile-only GPUs: the plugin's topology of hosts x GPUs with the entry's target config.
  The plugin checks for CUDA libraries unless JAX's platforms leave CUDA out (`axtrain plan`
  runs with JAX_PLATFORMS=cpu)."""
  text = gpu_targets.target_config(entry)
  check_gpu_plugin(entry.name)
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    devices = topologies.get_topology_desc(platform="cuda", target_config=text,
                                           topology=gpu_targets.topology(entry)).devices
  except NotImplementedError:
    raise ConfigError(f"--mesh={entry.name}: the jax-cuda12 plugin did not load (JAX's "
                      f"platforms are {jax.config.jax_platforms!r}); plan through `axtrain "
                      f"plan`, which sets JAX_PLATFORMS=cpu") from None
  except Exception as e:  # pylint: disable=broad-except  (the plugin raises JaxRuntimeError)
    raise ConfigError(f"--mesh={entry.name}: the GPU compiler cannot make topology "
                      f"'{gpu_targets.topology(entry)}': {' '.join(str(e).split())[:200]}"
                      ) from None
  return list(devices)


# --- the plan -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class Compiled:
  """What one compile reports per device (bytes), and its cost analysis."""
  argument: int
  output: int
  alias: int
  temp: int
  code: int
  flops: float  # the compiler's; while-loop bodies counted once
  bytes_accessed: float
  seconds: float  # compile wall time
  collectives: hlo_collectives.Collectives
  refused: str = ""  # the compiler's out-of-memory message when it refused to compile
  notes: tuple[str, ...] = ()  # what the compiler logged, in words (compiler_log)
  # libtpu's cost model: its per-op roofline of the step (seconds), each ConcatBitcast custom
  # call's -1 s added back; None from other compilers. Comparable between programs when
  # layers are unrolled and windowed einsum is off (trainer/tpu_efficiency.py).
  cost_model_s: float | None = None
  ops: hlo_ops.Report | None = None  # per-op bytes and FLOPs (`axtrain plan --ops`), if asked
  # Matmul FLOPs per step per device counted in the compiled HLO, loop bodies times their
  # trips (planner/hlo_ops.py): the remat policy's recompute and the compiler's own
  # rematerialisation included. GPU compiles only (no windowed-einsum loops to count twice).
  hlo_matmul_flops: float | None = None
  # Host memory per device (trainer.state_memory="host": the state between updates), and the
  # device peak the compiler reports for such a program (trainer/metrics.py:device_bytes).
  host: int = 0
  device_peak: int | None = None
  host_in: int = 0  # of `host`, the arguments (read from host memory each step)
  host_out: int = 0  # ... the outputs (written back)

  @property
  def peak(self) -> int:
    """Live at once in device memory: arguments + outputs not aliased to them + temporaries
    (with host-resident state, the compiler's peak less its host bytes)."""
    if self.device_peak is not None:
      return self.device_peak
    return self.argument + self.output - self.alias + self.temp


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimate:
  """The step time the compiled program should take: not a measurement. Its ops
  (planner/hlo_ops.py) at the rates the device reaches on ops of their kind
  (planner/calibration.py): matmuls (`compute_s`), attention kernels (`kernel_s`: their causal
  FLOPs, which the HLO does not show), memory-bound ops (`hbm_s`), one after another; the
  collectives' bytes at the link bandwidth (`collective_s`). `step_s` overlaps the collectives
  with the rest, `serial_s` adds them. With the state in host memory, both add its transfers
  (`transfer_s`: `to_device` and `to_host` bytes at the calibrated host link rates; the
  microbatches need the weights first, and the update's transfers bound it; writes are not
  counted where the calibration measured them hidden beside the update)."""
  compute_s: float
  kernel_s: float
  hbm_s: float
  collective_s: float
  step_s: float
  serial_s: float
  tokens_per_s: float
  mfu: float  # at step_s
  mfu_serial: float  # at serial_s
  calibration: calibration_lib.Calibration
  transfer_s: float = 0.0
  to_device: float = 0.0  # bytes per step per device read from host memory
  to_host: float = 0.0  # ... written to it
  # Bytes per step per device of activations saved to host memory (model.remat=offload_*) and
  # read back: the compiled program's copies to host memory beyond the state's write-back.
  # Counted in transfer_s at the calibrated rates, device to host at the host-to-device rate
  # where the calibration measured none (the state's write-back hides beside the update; a
  # forward pass's offloaded activations have nothing to hide beside that was measured).
  offloaded: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
  config: str
  mesh: str
  devices: int
  axes: dict
  compiler: str  # TPU_COMPILER, GPU_COMPILER or "CPU compiler standing in for neuron"
  batch: int
  seq_len: int
  data: str  # the data kind
  batch_arrays: dict  # name -> dtype of the batch compiled for: what the data source yields
  grad_accum_steps: int
  remat: str
  loss_chunk_size: int
  num_params: int
  hbm_bytes: int
  margin: float  # fraction of HBM kept free
  analytic: memory_model.Analytic
  train: Compiled
  eval: Compiled | None
  fit_source: str  # "compiler" or "model"
  needed: int  # bytes per device the verdict is based on
  model_flops: float  # per step, all devices (6N + attention)
  executed_flops: float  # per step per device: the compiled HLO's matmuls
  hbm_traffic: float  # bytes per step per device (analytic model)
  estimate: Estimate | None
  # One device's share of a microbatch: rows, positions per row (context parallelism), pipeline
  # stages and microbatches.
  split: memory_model.Split
  # trainer.state_memory="host": one host's RAM in each phase of the run against the host's
  # (planner/host_ram.py); None for a state on the device.
  host: host_ram.HostNeed | None = None

  @property
  def bubble(self) -> float:
    """The pipeline's idle fraction of the step, (S - 1) / (M + S - 1); 0 without stages."""
    return pipeline.bubble(self.split.stages, self.split.microbatches)

  @property
  def source(self) -> str:
    """The label of the compiler's figures: TPU compiler, GPU compiler or CPU compiler."""
    return " ".join(self.compiler.split()[:2])

  @property
  def usable(self) -> int:
    return int(self.hbm_bytes * (1 - self.margin))

  @property
  def host_needed(self) -> int:
    """Host RAM one host needs at its peak (0: the state is on the device)."""
    return self.host.needed if self.host else 0

  @property
  def host_ram(self) -> int:
    return self.host.ram if self.host else 0

  @property
  def host_fits(self) -> bool:
    return self.host is None or self.host.fits

  @property
  def fits(self) -> bool:
    return self.needed <= self.usable and self.host_fits

  @property
  def headroom(self) -> int:
    """usable - needed: negative is the shortfall."""
    return self.usable - self.needed


def abstract_inputs(exp: experiment_lib.Experiment, batch_size: int):
  """(state, batch) as ShapeDtypeStructs carrying their shardings: nothing allocated. The
  batch holds the arrays the run's data source yields (trainer/data/base.py:Source.fields):
  with packed documents, positions and segment ids too."""
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       memory_model.nn_unbox(exp.abstract_state), exp.state_shardings)
  shape = (batch_size, exp.source.seq_len)
  batch = {name: jax.ShapeDtypeStruct(shape, dtype, sharding=exp.batch_sharding)
           for name, dtype in exp.source.fields().items()}
  return state, batch


def _compile(fn, args, *, exp, num_devices: int, per_host: int | None, hardware,
             compiler_options: dict | None = None, what: str = "step",
             say: Callable[[str], None] = lambda _: None) -> Compiled:
  """One compile's figures, with the per-op report (`hardware`'s peaks time its roofline);
  `say` is told when the compile ends and the HLO has been read."""
  start, notes = time.perf_counter(), []
  say(f"compiling the {what}")
  with exp.context(), compiler_log(notes):
    lowered = fn.lower(*args)
    try:
      compiled = lowered.compile(compiler_options=compiler_options or None)
    except jax.errors.JaxRuntimeError as e:
      # The TPU compiler refuses a program whose temporaries exceed HBM; that is a verdict.
      temp = refused_bytes(str(e))[0]
      if "RESOURCE_EXHAUSTED" not in str(e) or temp is None:
        raise
      say(f"the compiler refused the {what} for memory after {time.perf_counter() - start:.0f} s")
      return Compiled(argument=0, output=0, alias=0, temp=temp, code=0,
                      flops=0.0, bytes_accessed=0.0, seconds=time.perf_counter() - start,
                      collectives=hlo_collectives.Collectives(bytes_by_kind={}, count=0),
                      refused=" ".join(str(e).split())[:300], notes=tuple(notes))
  seconds = time.perf_counter() - start
  say(f"compiled the {what} in {seconds:.0f} s; reading its HLO (ops, collectives)")
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  text = compiled.as_text()
  flops, accessed = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  cost_model = None
  if "optimal_seconds" in cost:
    cost_model = float(cost["optimal_seconds"]) + text.count(
        'custom_call_target="ConcatBitcast"')
  hw = hardware
  ops = hlo_ops.ops_report(text, num_devices=num_devices, peak_flops=hw.peak_bf16_flops or 1.0,
                           hbm_bandwidth=hw.hbm_bandwidth or 1.0,
                           link_bandwidth=hw.link_bandwidth or hw.hbm_bandwidth or 1.0,
                           compiler_bytes=accessed, compiler_flops=flops,
                           narrow_peaks={k: hw.peak_flops(k) for k in ("int8", "fp8")})
  hlo_matmul_flops = ops.flops
  host = metrics_lib.host_bytes(mem)
  return Compiled(argument=mem.argument_size_in_bytes, output=mem.output_size_in_bytes,
                  alias=mem.alias_size_in_bytes, temp=mem.temp_size_in_bytes, host=host,
                  host_in=int(getattr(mem, "host_argument_size_in_bytes", 0) or 0),
                  host_out=int(getattr(mem, "host_output_size_in_bytes", 0) or 0),
                  device_peak=metrics_lib.device_bytes(mem) if host else None,
                  code=mem.generated_code_size_in_bytes, flops=flops, bytes_accessed=accessed,
                  seconds=seconds, cost_model_s=cost_model, ops=ops, notes=tuple(notes),
                  collectives=hlo_collectives.collectives(text, num_devices, per_host=per_host),
                  hlo_matmul_flops=hlo_matmul_flops)


# The attention layer's call of its implementation (modules/attention.py:Attention._attend), as
# jax's op metadata names it: the kernel and the ops around it.
ATTENTION_SCOPE = "attention._attend"


def attention_call_flops(exp: experiment_lib.Experiment) -> float:
  """FLOPs of one attention kernel call on one device: QK^T and PV (2 x 2 FLOPs per query,
  key and head_dim) over the (query, key) pairs the mask admits (modules/masks.py:
  Spec.visible_pairs: about half the square under the causal mask, a band of the window's
  width with a sliding window; a layer pattern's mean over its layers), for the device's rows,
  heads and share of the positions."""
  shape = memory_model.model_shape(exp.abstract_state.params,
                                   top_k=flops_lib.find_field(exp.run.model, "top_k"))
  sp = memory_model.split(exp)
  head_dim = shape.q_width // max(shape.heads, 1)
  pairs = flops_lib.over_layers(exp.run.model, lambda spec: spec.visible_pairs(sp.seq_len))
  return 4.0 * sp.rows * (shape.heads / sp.model) * head_dim * pairs * sp.positions / sp.seq_len


def host_transfers(compiled: Compiled, params_bytes: int) -> tuple[float, float]:
  """(bytes read from host memory, bytes written to it) per step per device of a program
  with host-resident state (trainer/offload.py): the parameters once for the microbatches,
  then the whole state for the update, which returns to host memory. None where the state is
  on the device (no argument in host memory), offloaded activations or not."""
  if not compiled.host or not compiled.host_in:
    return 0.0, 0.0
  return float(params_bytes + compiled.host_in), float(compiled.host_out)


def offloaded_activations(compiled: Compiled) -> float:
  """Bytes per step per device of activations the program saves to host memory (and reads
  back once): its copies to host memory (planner/hlo_ops.py, loops times their trips) beyond a
  host-resident state's write-back (`host_out`)."""
  if compiled.ops is None:
    return 0.0
  return max(0.0, compiled.ops.host_bytes("to_host") - compiled.host_out)


def estimate(plan_flops: float, compiled: Compiled, entry: Entry, *, call_flops: float,
             tokens: int, params_bytes: int = 0, attention: str | None = None) -> Estimate | None:
  """The calibrated step time of `compiled` on `entry`'s hardware (see Estimate); `attention`:
  the run's attention implementation (calibration.for_hardware)."""
  hw = entry.hardware
  if not (hw.peak_bf16_flops and hw.hbm_bandwidth and hw.link_bandwidth) or compiled.ops is None:
    return None
  cal = calibration_lib.for_hardware(hw, attention=attention)
  flops_rate = cal.matmul * hw.peak_bf16_flops
  compute_s = kernel_s = hbm_s = 0.0
  for op in compiled.ops.ops:
    if op.category == "matmul":
      rate = cal.matmul_quantized * hw.peak_flops(op.narrow) if op.narrow else flops_rate
      compute_s += max(op.flops / rate, cal.bytes_seconds(op, hw.hbm_bandwidth))
    elif (kernel := cal.kernel_seconds(op, call_flops, hw.peak_bf16_flops)) is not None:
      kernel_s += kernel
    elif op.category != "collective" and op.opcode not in ("copy-start", "slice-start"):
      # (asynchronous copies run beside the other ops; collectives are timed below)
      if cal.attention_wrapper_timed and ATTENTION_SCOPE in op.primitive:
        continue  # timed with the kernel: its figures are the implementation's as a whole
      hbm_s += cal.bytes_seconds(op, hw.hbm_bandwidth)
  c = compiled.collectives
  cross = c.cross_host_bytes if hw.host_bandwidth else 0.0
  collective_s = (c.total_bytes - cross) / hw.link_bandwidth + (
      cross / hw.host_bandwidth if cross else 0.0)
  busy = compute_s + kernel_s + hbm_s
  to_device, to_host = host_transfers(compiled, params_bytes)
  transfer_s = ((to_device / cal.host_to_device if to_device and cal.host_to_device else 0.0)
                + (to_host / cal.device_to_host if to_host and cal.device_to_host else 0.0))
  offloaded = offloaded_activations(compiled)
  if offloaded and cal.host_to_device:
    transfer_s += offloaded / cal.host_to_device + offloaded / (cal.device_to_host
                                                                or cal.host_to_device)
  step_s = max(busy, collective_s) + transfer_s
  serial_s = busy + collective_s + transfer_s
  peak = hw.peak_bf16_flops * entry.num_devices
  return Estimate(compute_s=compute_s, kernel_s=kernel_s, hbm_s=hbm_s,
                  collective_s=collective_s, step_s=step_s, serial_s=serial_s,
                  tokens_per_s=tokens / step_s, mfu=plan_flops / (step_s * peak),
                  mfu_serial=plan_flops / (serial_s * peak), calibration=cal,
                  transfer_s=transfer_s, to_device=to_device, to_host=to_host,
                  offloaded=offloaded)


def plan(run: RunConfig, entry: Entry, *, config_name: str, devices=None, margin: float = 0.05,
         with_eval: bool = True, compiler_options: dict | None = None,
         say: Callable[[str], None] = lambda _: None) -> Plan:
  """Compiles `run`'s train (and eval) step for `entry`'s devices and reports per device.

  `compiler_options`: XLA / libtpu options for these compiles (e.g. WINDOWED_EINSUM_OFF).
  `say`: told what compiles, as it starts and ends (a large model's compile takes minutes)."""
  if devices is None:
    devices, compiler = target_devices(entry)
  else:
    compiler = {"tpu": TPU_COMPILER, "gpu": GPU_COMPILER}.get(
        devices[0].platform, f"CPU compiler standing in for {entry.hardware.platform}")
  exp = experiment_lib.build(run, entry, devices, platform=entry.hardware.platform)
  n = len(devices)
  state, batch = abstract_inputs(exp, exp.source.batch_size)
  # Hosts of GPU/Trainium entries talk over the network; a TPU slice is one ICI domain, and
  # the slices of a multi-slice entry talk over the data-center network.
  if entry.topology is None:
    per_host = entry.hardware.devices_per_host
  else:
    per_host = n // entry.num_slices if entry.num_slices > 1 else None
  where = dict(exp=exp, num_devices=n, per_host=per_host, hardware=entry.hardware,
               compiler_options=compiler_options, say=say)
  say(f"{config_name} on {entry.name}: {n} device(s), {compiler}")
  train = _compile(exp.step_fn, (state, batch), what="train step", **where)
  evaluated = None
  if with_eval:
    _, eval_batch = abstract_inputs(exp, run.eval.batch_size)
    evaluated = _compile(exp.eval_fn, (state.params, eval_batch), what="eval step", **where)
  compute_bytes = np.dtype(exp.compute_dtype).itemsize
  analytic = memory_model.analytic_memory(exp, compute_bytes=compute_bytes)
  traffic = memory_model.hbm_traffic(exp, analytic, compute_bytes=compute_bytes)
  tokens = exp.source.batch_size * exp.source.seq_len
  model_flops = flops_lib.model_flops_per_token(run, exp.abstract_state.params) * tokens
  remat = getattr(run.model, "remat", "none")
  split = memory_model.split(exp)
  # The compiled HLO's matmuls, loops times their trips: remat's recompute and a pipeline's
  # bubble included.
  executed = train.hlo_matmul_flops or 0.0  # none where the compiler refused the program
  exact = devices[0].platform in ("tpu", "gpu")  # the target's own compiler
  needed = max(train.peak, evaluated.peak if evaluated else 0) if exact else analytic.total
  hbm = entry.hardware.hbm_bytes or 0
  host = None
  if train.host or analytic.host:
    host = host_ram.host_need(exp, entry, devices=n, step_host=train.host, code=train.code)
  state = memory_model.state_bytes(exp)
  return Plan(config=config_name, mesh=entry.name, devices=n, axes=dict(exp.mesh.shape),
              compiler=compiler, batch=exp.source.batch_size, seq_len=exp.source.seq_len,
              data=run.data.kind, batch_arrays={k: str(v.dtype) for k, v in batch.items()},
              grad_accum_steps=exp.run.trainer.grad_accum_steps, remat=remat,
              loss_chunk_size=run.trainer.loss_chunk_size, num_params=exp.num_params,
              hbm_bytes=hbm, margin=margin, analytic=analytic, train=train, eval=evaluated,
              fit_source="compiler" if exact else "model", needed=needed,
              model_flops=model_flops, executed_flops=executed, hbm_traffic=traffic,
              estimate=estimate(model_flops, train, entry, call_flops=attention_call_flops(exp),
                                tokens=tokens, params_bytes=state.params,
                                attention=flops_lib.find_field(run.model, "implementation")),
              split=split, host=host)
