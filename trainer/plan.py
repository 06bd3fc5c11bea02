"""`axtrain plan`: compile a run's train and eval steps for a mesh entry's devices, ahead of time.

    devices  TPU entries: libtpu's compile-only topology (the real TPU compiler, exact bytes);
             other entries: as many CPU devices (exact sharding and argument bytes, the CPU
             compiler's temporaries) plus an analytic memory model.
    compile  jit(train_step).lower(abstract sharded state and batch).compile(): nothing allocated.
    report   per-device memory (compiler and analytic, each labelled), fit against the entry's
             memory, model FLOPs (trainer.flops) next to the compiler's, and a roofline estimate
             of step time, tokens/s and MFU from the entry's peak FLOP/s, HBM and link bandwidth
             and the collectives found in the compiled HLO.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import time

import jax
import numpy as np
from jax.sharding import NamedSharding

from core.registry import ConfigError
from trainer import experiment as experiment_lib, flops as flops_lib
from trainer.config import RunConfig
from trainer.meshes import Entry

GiB = 1024 ** 3
LIBTPU_INSTALL = "pip install 'jax[tpu]==0.10.2' (or `make install`)"


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
  """(devices to compile for, what compiles): libtpu's topology or CPU stand-ins."""
  if entry.num_devices is None:
    raise ConfigError(f"--mesh={entry.name} has no fixed device count; plan a named entry "
                      f"(docs/meshes.md), e.g. tpu-v5e-16 or gpu-h100-8")
  if entry.hardware.platform == "tpu":
    try:
      import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      raise ConfigError(f"--mesh={entry.name}: planning a TPU entry needs libtpu (the TPU "
                        f"compiler); install it with {LIBTPU_INSTALL}") from None
    from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
    try:
      with _quiet_libtpu():
        devices = topologies.get_topology_desc(platform="tpu",
                                               topology_name=entry.topology).devices
    except Exception as e:  # pylint: disable=broad-except  (libtpu raises JaxRuntimeError)
      raise ConfigError(f"--mesh={entry.name}: libtpu cannot make topology "
                        f"'{entry.topology}': {' '.join(str(e).split())[:200]}") from None
    return list(devices), "TPU compiler (libtpu)"
  cpus = jax.devices("cpu")
  if len(cpus) < entry.num_devices:
    raise ConfigError(f"--mesh={entry.name} needs {entry.num_devices} CPU stand-in devices but "
                      f"JAX has {len(cpus)}; run through `axtrain plan` (it sets XLA_FLAGS="
                      f"--xla_force_host_platform_device_count={entry.num_devices})")
  return cpus[:entry.num_devices], f"CPU compiler standing in for {entry.hardware.platform}"


# --- collectives in the compiled HLO ------------------------------------------------------

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?\S+ = (?P<out>.+?) (?P<op>[a-z][\w-]*)\((?P<rest>.*)$")
_SHAPE = re.compile(r"\b(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_CALLS = re.compile(r"\b(body|calls|branch_computations)=\{?%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def _shape_bytes(text: str) -> list[int]:
  out = []
  for m in _SHAPE.finditer(text):
    if m["dtype"] in _DTYPE_BYTES:
      dims = [int(d) for d in m["dims"].split(",") if d]
      out.append(_DTYPE_BYTES[m["dtype"]] * math.prod(dims))
  return out


def _group_size(rest: str, num_devices: int) -> int:
  """Devices in one replica group: mesh[...]{axes}, [groups,size]<=[...] or {{a,b,..},..}."""
  if m := re.search(r"replica_groups=mesh\[(?P<axes>[^\]]*)\]\s*\{(?P<used>[^}]*)\}", rest):
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", m["axes"]))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m["used"]))
  if m := re.search(r"replica_groups=\[\d+,(\d+)\]", rest):
    return int(m[1])
  if m := re.search(r"replica_groups=\{\{([\d,]*)\}", rest):
    return len(m[1].split(","))
  if m := re.search(r"source_target_pairs=", rest):
    return 2
  return num_devices


@dataclasses.dataclass(frozen=True, kw_only=True)
class Collectives:
  """Bytes each device sends per step (ring algorithms), by collective kind, loops unrolled."""
  bytes_by_kind: dict
  count: int  # collective instructions executed per step
  cross_host_bytes: float = 0.0  # of the total, sent by groups larger than one host

  @property
  def total_bytes(self) -> float:
    return sum(self.bytes_by_kind.values())


def collectives(hlo_text: str, num_devices: int, *, per_host: int | None = None) -> Collectives:
  """Scans compiled HLO: each collective's per-device traffic times its loop trip counts.

  With n devices in a group: all-gather and all-to-all send (n-1)/n of the full result,
  reduce-scatter (n-1)/n of the full input, all-reduce 2 (n-1)/n of the buffer,
  collective-permute the buffer. A group of more than `per_host` devices counts as crossing
  hosts (the mesh puts the fast axes inside a host).
  """
  comps, current, entry = {}, None, None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
      comps[current] = []
      if line.startswith("ENTRY"):
        entry = current
    elif current is not None and line.strip() and line.strip() != "}":
      comps[current].append(line)
  times: dict[str, float] = {}

  def trip_count(line) -> int:
    """known_trip_count if annotated, else N of the condition's `i < constant(N)`."""
    if m := _TRIP.search(line):
      return int(m[1])
    cond = re.search(r"condition=%?([\w.\-]+)", line)
    body = "\n".join(comps.get(cond[1], ())) if cond else ""
    constants = re.findall(r"constant\((\d+)\)", body)
    return int(constants[0]) if len(constants) == 1 and "direction=LT" in body else 1

  def visit(name, n):
    times[name] = times.get(name, 0) + n
    for line in comps.get(name, ()):
      for kind, callee in _CALLS.findall(line):
        if callee in comps and callee != name:
          visit(callee, n * (trip_count(line) if kind == "body" else 1))

  if entry is None:
    return Collectives(bytes_by_kind={}, count=0)
  visit(entry, 1)
  by_kind, count, cross = {}, 0, 0.0
  for name, n in times.items():
    # TPU reduce-scatters are fusions named all-reduce-scatter: an all-reduce, then a slice.
    scatter = name.startswith("all-reduce-scatter")
    for line in comps[name]:
      m = _INSTR.match(line)
      if not m or m["op"].removesuffix("-start") not in _COLLECTIVES:
        continue
      op = "reduce-scatter" if scatter else m["op"].removesuffix("-start")
      sizes = _shape_bytes(m["out"])
      if not sizes:
        continue
      # `-start` ops return (operand, result, ...): the result is the largest; plain ops
      # over a tuple move every element.
      size = max(sizes) if m["op"].endswith("-start") else sum(sizes)
      g = _group_size(m["rest"], num_devices)
      if op == "reduce-scatter" and not scatter:
        size *= g  # the input: g times the result
      share = (g - 1) / g if g > 1 else 0.0
      sent = size * (1 if op == "collective-permute" else 2 * share if op == "all-reduce"
                     else share)
      by_kind[op] = by_kind.get(op, 0.0) + sent * n
      count += n
      if per_host and g > per_host:
        cross += sent * n
  return Collectives(bytes_by_kind=by_kind, count=int(count), cross_host_bytes=cross)


# --- analytic memory model ----------------------------------------------------------------

def _sharded_bytes(abstract_tree, shardings) -> int:
  """Bytes one device holds of a tree of ShapeDtypeStructs under its NamedShardings."""
  leaves = jax.tree.leaves(abstract_tree)
  shards = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  return sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
             for a, s in zip(leaves, shards))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shape:
  """Widths read from the parameters' logical axis names (no per-layer code)."""
  layers: int
  dim: int
  mlp: int  # sum of `mlp` widths per layer (experts: per routed token, top_k of them)
  q_width: int  # heads * head_dim
  kv_width: int  # kv_heads * head_dim (k and v each)
  heads: int
  vocab: int


def model_shape(params, *, top_k: int | None) -> Shape:
  """Per-layer widths: sums over every weight of a kind, divided by the layer count."""
  layers = dim = vocab = mlp = q = kv = heads = 0
  for names, shape in flops_lib.named_leaves(params):
    names, shape, n = flops_lib.without_layers(names, shape)
    size = dict(zip(names, shape))
    dim, vocab = max(dim, size.get("embed", 0)), max(vocab, size.get("vocab", 0))
    if names == ("embed", "heads", "head_dim"):  # one query projection per layer
      layers += n
      q += n * size["heads"] * size["head_dim"]
      heads += n * size["heads"]
    elif names == ("embed", "kv_heads", "head_dim"):  # k and v
      kv += n * size["kv_heads"] * size["head_dim"]
    elif names[:1] == ("embed",) and "mlp" in names:  # ffn gate / up projections
      mlp += n * size["mlp"] * (top_k if "experts" in size else 1)
  per = max(layers, 1)
  return Shape(layers=layers, dim=dim, mlp=mlp // per, q_width=q // per,
               kv_width=kv // (2 * per), heads=heads // per, vocab=vocab)


# Per token and layer, bytes kept for the backward pass under each remat policy (c: bytes of
# the compute dtype; heads and mlp widths split over the `model` axis, the residual stream
# not). A rough model (after Korthikanti et al. 2022, without dropout); the TPU compiler's
# figures replace it where they exist.
def _saved_per_token_layer(policy: str, s: Shape, c: int, seq_len: int, model: int) -> float:
  q, kv, mlp, heads = s.q_width / model, s.kv_width / model, s.mlp / model, s.heads / model
  matmul_outputs = c * (q + 2 * kv + s.dim + mlp + s.dim)
  attention_scores = (4 + c) * heads * seq_len  # float32 scores + probabilities
  everything = c * (4 * s.dim + 2 * q + 2 * kv + 2 * mlp) + attention_scores
  return {
      "none": everything,
      "full": c * s.dim,  # the layer's input
      "dots_saveable": c * s.dim + matmul_outputs + c * heads * seq_len,
      "dots_with_no_batch_dims_saveable": c * s.dim + matmul_outputs,
      "save_qkv_proj": c * (s.dim + q + 2 * kv),
      "save_attn_out": c * (s.dim + 2 * q + 2 * kv),
  }.get(policy, c * (s.dim + 2 * q + 2 * kv))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Analytic:
  """Per-device bytes by the analytic model (labelled `model` in the report)."""
  params: int  # exact: sharded parameter bytes
  opt_state: int  # exact: sharded optimizer-state bytes
  grads: int  # float32 gradients (and the accumulator under gradient accumulation)
  activations: int  # saved for the backward pass, plus one layer's working set under remat
  logits: int  # LM-head logits and their float32 loss buffers (one chunk with chunking)

  @property
  def total(self) -> int:
    return self.params + self.opt_state + self.grads + self.activations + self.logits


def analytic_memory(exp: experiment_lib.Experiment, *, compute_bytes: int) -> Analytic:
  run = exp.run
  abstract = nn_unbox(exp.abstract_state)
  params = _sharded_bytes(abstract.params, exp.state_shardings.params)
  opt_state = _sharded_bytes(abstract.opt_state, exp.state_shardings.opt_state)
  accum = run.trainer.grad_accum_steps
  grads = params * (2 if accum > 1 else 1)
  shape = model_shape(exp.abstract_state.params, top_k=flops_lib.find_field(run.model, "top_k"))
  mesh = dict(exp.mesh.shape)
  seq = exp.source.seq_len
  rows = exp.source.batch_size // accum // (mesh["data"] * mesh["fsdp"])
  tokens = max(rows, 1) * seq
  policy = getattr(run.model, "remat", "none")
  saved = _saved_per_token_layer(policy, shape, compute_bytes, seq, mesh["model"]) * shape.layers
  if policy != "none":  # one layer's recompute at a time
    saved += _saved_per_token_layer("none", shape, compute_bytes, seq, mesh["model"])
  activations = int(tokens * saved)
  chunk = run.trainer.loss_chunk_size
  vocab = shape.vocab // (mesh["model"] if shape.vocab % mesh["model"] == 0 else 1)
  logit_tokens = rows * chunk if chunk else tokens
  # bf16 logits and their gradient for every token (unchunked), float32 logits, softmax
  # and gradient for the tokens in flight.
  logits = int(logit_tokens * vocab * (2 * compute_bytes + 12))
  return Analytic(params=params, opt_state=opt_state, grads=grads, activations=activations,
                  logits=logits)


def hbm_traffic(exp: experiment_lib.Experiment, analytic: Analytic, *, compute_bytes: int) -> float:
  """Bytes one device moves to and from HBM per step (a model, labelled so).

  Per microbatch: the gathered weights read once per pass (forward, the recompute under
  remat, backward), saved activations written and read once, the attention scores written
  and read in every pass; per step: the optimizer reads parameters, gradients and state and
  writes parameters and state.
  """
  run = exp.run
  params = exp.abstract_state.params
  top_k = flops_lib.find_field(run.model, "top_k")
  shape = model_shape(params, top_k=top_k)
  mesh = dict(exp.mesh.shape)
  accum = run.trainer.grad_accum_steps
  seq = exp.source.seq_len
  rows = max(exp.source.batch_size // accum // (mesh["data"] * mesh["fsdp"]), 1)
  tokens = rows * seq
  remat = getattr(run.model, "remat", "none")
  passes = 3 if remat == "none" else 4
  weights = flops_lib.count(params, seq_len=seq, top_k=top_k).matmul_params
  per_micro = passes * compute_bytes * weights / mesh["model"]
  per_micro += 2 * analytic.activations
  per_micro += passes * tokens * shape.layers * (4 + compute_bytes) * (
      shape.heads / mesh["model"]) * seq
  optimizer = 2 * (analytic.params + analytic.opt_state) + analytic.grads
  return accum * per_micro + optimizer


def nn_unbox(tree):
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  return nn.meta.unbox(tree)


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
  collectives: Collectives
  refused: str = ""  # the compiler's out-of-memory message when it refused to compile

  @property
  def peak(self) -> int:
    """Live at once: arguments + outputs not aliased to them + temporaries."""
    return self.argument + self.output - self.alias + self.temp


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimate:
  """A roofline: not a measurement. Compute (model FLOPs with remat recompute) at peak
  FLOP/s, HBM traffic (hbm_traffic) at peak bandwidth, the compiled HLO's collective bytes at
  the link bandwidth; `step_s` overlaps all three, `serial_s` adds collectives to the rest."""
  compute_s: float
  hbm_s: float
  collective_s: float
  step_s: float
  serial_s: float
  tokens_per_s: float
  mfu: float  # at step_s
  mfu_serial: float  # at serial_s


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
  config: str
  mesh: str
  devices: int
  axes: dict
  compiler: str  # "TPU compiler (libtpu)" or "CPU compiler standing in for gpu"
  batch: int
  seq_len: int
  grad_accum_steps: int
  remat: str
  loss_chunk_size: int
  num_params: int
  hbm_bytes: int
  margin: float  # fraction of HBM kept free
  analytic: Analytic
  train: Compiled
  eval: Compiled | None
  fit_source: str  # "compiler" or "model"
  needed: int  # bytes per device the verdict is based on
  model_flops: float  # per step, all devices (6N + attention)
  executed_flops: float  # per step per device, with remat recompute (estimate)
  hbm_traffic: float  # bytes per step per device (analytic model)
  estimate: Estimate | None

  @property
  def usable(self) -> int:
    return int(self.hbm_bytes * (1 - self.margin))

  @property
  def fits(self) -> bool:
    return self.needed <= self.usable

  @property
  def headroom(self) -> int:
    """usable - needed: negative is the shortfall."""
    return self.usable - self.needed


def abstract_inputs(exp: experiment_lib.Experiment, batch_size: int):
  """(state, batch) as ShapeDtypeStructs carrying their shardings: nothing allocated."""
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       nn_unbox(exp.abstract_state), exp.state_shardings)
  shape = (batch_size, exp.source.seq_len)
  batch = {"inputs": jax.ShapeDtypeStruct(shape, np.int32, sharding=exp.batch_sharding),
           "targets": jax.ShapeDtypeStruct(shape, np.int32, sharding=exp.batch_sharding),
           "weights": jax.ShapeDtypeStruct(shape, np.float32, sharding=exp.batch_sharding)}
  return state, batch


def _compile(fn, args, *, exp, num_devices: int, per_host: int | None) -> Compiled:
  start = time.perf_counter()
  with exp.context():
    lowered = fn.lower(*args)
    try:
      compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
      # The TPU compiler refuses a program whose temporaries exceed HBM; that is a verdict.
      m = re.search(r"HLO temporaries \(([\d.]+)G\)", str(e))
      if "RESOURCE_EXHAUSTED" not in str(e) or not m:
        raise
      return Compiled(argument=0, output=0, alias=0, temp=int(float(m[1]) * GiB), code=0,
                      flops=0.0, bytes_accessed=0.0, seconds=time.perf_counter() - start,
                      collectives=Collectives(bytes_by_kind={}, count=0),
                      refused=" ".join(str(e).split())[:300])
  seconds = time.perf_counter() - start
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return Compiled(argument=mem.argument_size_in_bytes, output=mem.output_size_in_bytes,
                  alias=mem.alias_size_in_bytes, temp=mem.temp_size_in_bytes,
                  code=mem.generated_code_size_in_bytes, flops=float(cost.get("flops", 0.0)),
                  bytes_accessed=float(cost.get("bytes accessed", 0.0)), seconds=seconds,
                  collectives=collectives(compiled.as_text(), num_devices, per_host=per_host))


# Forward + backward = 3 forward passes; full remat recomputes the forward once more.
_RECOMPUTE = {"none": 1.0, "dots_saveable": 1.0, "dots_with_no_batch_dims_saveable": 1.05}


def estimate(plan_flops: float, executed: float, hbm_bytes: float, compiled: Compiled,
             entry: Entry, *, tokens: int) -> Estimate | None:
  hw = entry.hardware
  if not (hw.peak_bf16_flops and hw.hbm_bandwidth and hw.link_bandwidth):
    return None
  compute_s = executed / hw.peak_bf16_flops
  hbm_s = hbm_bytes / hw.hbm_bandwidth
  c = compiled.collectives
  cross = c.cross_host_bytes if hw.host_bandwidth else 0.0
  collective_s = (c.total_bytes - cross) / hw.link_bandwidth + (
      cross / hw.host_bandwidth if cross else 0.0)
  step_s = max(compute_s, hbm_s, collective_s)
  serial_s = max(compute_s, hbm_s) + collective_s
  devices = entry.num_devices
  return Estimate(compute_s=compute_s, hbm_s=hbm_s, collective_s=collective_s, step_s=step_s,
                  serial_s=serial_s, tokens_per_s=tokens / step_s,
                  mfu=plan_flops / (step_s * hw.peak_bf16_flops * devices),
                  mfu_serial=plan_flops / (serial_s * hw.peak_bf16_flops * devices))


def plan(run: RunConfig, entry: Entry, *, config_name: str, devices=None, margin: float = 0.05,
         with_eval: bool = True) -> Plan:
  """Compiles `run`'s train (and eval) step for `entry`'s devices and reports per device."""
  if devices is None:
    devices, compiler = target_devices(entry)
  else:
    compiler = ("TPU compiler (libtpu)" if devices[0].platform == "tpu"
                else f"CPU compiler standing in for {entry.hardware.platform}")
  exp = experiment_lib.build(run, entry, devices)
  dtype = experiment_lib.compute_dtype(run.trainer.compute_dtype, entry.hardware.platform)
  exp = dataclasses.replace(exp, compute_dtype=dtype)
  n = len(devices)
  state, batch = abstract_inputs(exp, exp.source.batch_size)
  # Hosts of GPU/Trainium entries talk over the network; a TPU slice is one ICI domain.
  per_host = entry.hardware.devices_per_host if entry.topology is None else None
  train = _compile(exp.step_fn, (state, batch), exp=exp, num_devices=n, per_host=per_host)
  evaluated = None
  if with_eval:
    _, eval_batch = abstract_inputs(exp, run.eval.batch_size)
    evaluated = _compile(exp.eval_fn, (state.params, eval_batch), exp=exp, num_devices=n,
                         per_host=per_host)
  analytic = analytic_memory(exp, compute_bytes=np.dtype(dtype).itemsize)
  traffic = hbm_traffic(exp, analytic, compute_bytes=np.dtype(dtype).itemsize)
  tokens = exp.source.batch_size * exp.source.seq_len
  model_flops = flops_lib.model_flops_per_token(run, exp.abstract_state.params) * tokens
  remat = getattr(run.model, "remat", "none")
  executed = model_flops / n * _RECOMPUTE.get(remat, 4 / 3)
  on_tpu = devices[0].platform == "tpu"
  needed = max(train.peak, evaluated.peak if evaluated else 0) if on_tpu else analytic.total
  hbm = entry.hardware.hbm_bytes or 0
  return Plan(config=config_name, mesh=entry.name, devices=n, axes=dict(exp.mesh.shape),
              compiler=compiler, batch=exp.source.batch_size, seq_len=exp.source.seq_len,
              grad_accum_steps=run.trainer.grad_accum_steps, remat=remat,
              loss_chunk_size=run.trainer.loss_chunk_size, num_params=exp.num_params,
              hbm_bytes=hbm, margin=margin, analytic=analytic, train=train, eval=evaluated,
              fit_source="compiler" if on_tpu else "model", needed=needed,
              model_flops=model_flops, executed_flops=executed, hbm_traffic=traffic,
              estimate=estimate(model_flops, executed, traffic, train, entry, tokens=tokens))


# --- the report ---------------------------------------------------------------------------

def _gib(n: float) -> str:
  """Bytes in GiB (MiB, KiB for small figures), three significant digits."""
  for unit, scale in (("GiB", GiB), ("MiB", 1024 ** 2), ("KiB", 1024)):
    if abs(n) >= scale / 10 or unit == "KiB":
      return f"{n / scale:.3g} {unit}"
  return f"{n} B"


def _secs(x: float) -> str:
  return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.3g} ms" if x >= 1e-3 else f"{x * 1e6:.3g} us"


def _num(x: float) -> str:
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.2f}{unit}"
  return f"{x:.0f}"


def text(p: Plan, *, timings: bool = True) -> str:
  """The human report; every figure names its source: [compiler], [model], [exact] or [estimate]."""
  src = "TPU compiler" if p.fit_source == "compiler" else "CPU compiler"
  a, t = p.analytic, p.train
  axes = " ".join(f"{k}={v}" for k, v in p.axes.items())
  lines = [
      f"plan: {p.config} on {p.mesh} ({p.devices} devices, {axes}), compiled by {p.compiler}",
      f"  run: batch {p.batch} x {p.seq_len} tokens, grad_accum_steps {p.grad_accum_steps}, "
      f"remat {p.remat}, loss_chunk_size {p.loss_chunk_size}, {_num(p.num_params)} parameters",
      "  per device                       bytes",
      f"    parameters         [exact]     {_gib(a.params)}",
      f"    optimizer state    [exact]     {_gib(a.opt_state)}",
      f"    gradients          [model]     {_gib(a.grads)}",
      f"    activations        [model]     {_gib(a.activations)}",
      f"    logits + loss      [model]     {_gib(a.logits)}",
      f"    total              [model]     {_gib(a.total)}",
      f"    train arguments    [{src}]  {_gib(t.argument)}",
      f"    train outputs      [{src}]  {_gib(t.output)} (aliased to arguments: "
      f"{_gib(t.alias)})",
      f"    train temporaries  [{src}]  {_gib(t.temp)}",
      f"    train code         [{src}]  {_gib(t.code)}",
      f"    train peak         [{src}]  {_gib(t.peak)}",
  ]
  if t.refused:
    lines.append(f"    the TPU compiler refused: {t.refused}")
  if p.eval is not None:
    lines.append(f"    eval peak          [{src}]  {_gib(p.eval.peak)} (temporaries "
                 f"{_gib(p.eval.temp)})")
  verdict = "fits" if p.fits else "does NOT fit"
  how = (f"{_gib(p.headroom)} to spare" if p.fits else f"short by {_gib(-p.headroom)}")
  basis = "TPU compiler peak" if p.fit_source == "compiler" else "analytic model total"
  lines += [
      f"  memory: {verdict}: needs {_gib(p.needed)} ({basis}) of {_gib(p.usable)} usable "
      f"({_gib(p.hbm_bytes)} HBM less a {p.margin:.0%} margin); {how}",
      f"  FLOPs per step: model {_num(p.model_flops)} (6N + attention, all devices) = "
      f"{_num(p.model_flops / p.devices)} per device; compiler {_num(t.flops)} per device "
      f"(while-loop bodies counted once)",
      f"  collectives per device per step [compiled HLO]: "
      + (", ".join(f"{k} {_gib(v)}" for k, v in sorted(t.collectives.bytes_by_kind.items()))
         or "none")
      + (f"; {_gib(t.collectives.cross_host_bytes)} between hosts"
         if t.collectives.cross_host_bytes else ""),
  ]
  e = p.estimate
  if e is None:
    lines.append("  estimate: none (the entry lists no peak FLOP/s or bandwidths)")
  else:
    lines += [
        f"  ESTIMATE (roofline, not a measurement): step {_secs(e.step_s)} overlapped, "
        f"{_secs(e.serial_s)} serial; compute {_secs(e.compute_s)}, HBM {_secs(e.hbm_s)}, "
        f"collectives {_secs(e.collective_s)}",
        f"    {_num(e.tokens_per_s)} tokens/s, MFU {e.mfu:.2f} overlapped, "
        f"{e.mfu_serial:.2f} serial; HBM traffic [model] {_gib(p.hbm_traffic)} per device",
    ]
  if timings:
    lines.append(f"  compile: train {t.seconds:.0f} s"
                 + (f", eval {p.eval.seconds:.0f} s" if p.eval else ""))
  return "\n".join(lines) + "\n"


def to_json(p: Plan) -> dict:
  out = dataclasses.asdict(p)
  out.update(fits=p.fits, usable=p.usable, headroom=p.headroom,
             analytic_total=p.analytic.total, train_peak=p.train.peak,
             eval_peak=p.eval.peak if p.eval else None)
  return out


# --- sweep --------------------------------------------------------------------------------

REMAT_SWEEP = ("none", "save_attn_out", "full")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
  axes: dict  # data / fsdp / model sizes
  remat: str
  grad_accum_steps: int

  def flags(self) -> str:
    return " ".join([*(f"--config.mesh.{a}={n}" for a, n in self.axes.items()),
                     f"--config.model.remat={self.remat}",
                     f"--config.trainer.grad_accum_steps={self.grad_accum_steps}"])

  def apply(self, run: RunConfig) -> RunConfig:
    mesh = dataclasses.replace(run.mesh, **self.axes)
    model = dataclasses.replace(run.model, remat=self.remat)
    trainer = dataclasses.replace(run.trainer, grad_accum_steps=self.grad_accum_steps)
    return dataclasses.replace(run, mesh=mesh, model=model, trainer=trainer)


def candidates(run: RunConfig, num_devices: int) -> list[Candidate]:
  """Every data x fsdp x model factorisation, remat policy and accumulation that keeps the
  global batch: microbatches divide over the data and fsdp axes."""
  out = []
  divisors = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
  batch = run.data.batch_size
  for model in divisors:
    for fsdp in (d for d in divisors if (num_devices // model) % d == 0):
      data = num_devices // model // fsdp
      for accum in (a for a in (1, 2, 4, 8, 16) if batch % a == 0):
        if (batch // accum) % (data * fsdp):
          continue
        for remat in REMAT_SWEEP:
          out.append(Candidate(axes={"data": data, "fsdp": fsdp, "model": model},
                               remat=remat, grad_accum_steps=accum))
  return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepResult:
  ranked: list  # [(Candidate, Plan)] that fit, fastest estimate first
  rejected: list  # [(Candidate, reason)]
  skipped: int  # candidates left when the time budget ran out


def sweep(run: RunConfig, entry: Entry, *, config_name: str, devices=None,
          budget_s: float = 1800.0, limit: int = 12, margin: float = 0.05,
          progress=None) -> SweepResult:
  """Ranks the candidates that fit by estimated step time.

  The analytic model screens every candidate first (no compile); those it puts within 1.5x
  of the usable memory compile in order of fewest recomputed FLOPs and accumulation steps,
  at most `limit` of them and until `budget_s` seconds have passed.
  """
  if devices is None:
    devices, _ = target_devices(entry)
  usable = (entry.hardware.hbm_bytes or 0) * (1 - margin)
  screened, rejected = [], []
  for cand in candidates(run, len(devices)):
    try:
      exp = experiment_lib.build(cand.apply(run), entry, devices)
    except ConfigError as e:
      rejected.append((cand, str(e)))
      continue
    dtype = experiment_lib.compute_dtype(run.trainer.compute_dtype, entry.hardware.platform)
    total = analytic_memory(exp, compute_bytes=np.dtype(dtype).itemsize).total
    if total > 1.5 * usable:
      rejected.append((cand, f"analytic model: {_gib(total)} per device"))
    else:
      screened.append(cand)
  order = {name: i for i, name in enumerate(REMAT_SWEEP)}
  screened.sort(key=lambda c: (order[c.remat], c.grad_accum_steps, c.axes["model"],
                               -c.axes["fsdp"]))
  start, fitting, compiled = time.perf_counter(), [], 0
  for cand in screened:
    if compiled >= limit or time.perf_counter() - start > budget_s:
      break
    p = plan(cand.apply(run), entry, config_name=config_name, devices=devices, margin=margin,
             with_eval=False)
    compiled += 1
    if progress:
      progress(cand, p)
    if p.fits:
      fitting.append((cand, p))
    else:
      rejected.append((cand, f"short by {_gib(-p.headroom)}"))
  fitting.sort(key=lambda cp: cp[1].estimate.step_s if cp[1].estimate else float("inf"))
  return SweepResult(ranked=fitting, rejected=rejected, skipped=len(screened) - compiled)


def sweep_text(result: SweepResult) -> str:
  lines = [f"sweep: {len(result.ranked)} fitting, {len(result.rejected)} rejected, "
           f"{result.skipped} not compiled (budget)"]
  for i, (cand, p) in enumerate(result.ranked):
    step = _secs(p.estimate.step_s) if p.estimate else "no estimate"
    lines.append(f"  {i + 1}. step {step} (estimate), needs {_gib(p.needed)}: {cand.flags()}")
  if result.ranked:
    lines.append(f"best: {result.ranked[0][0].flags()}")
  return "\n".join(lines) + "\n"
