"""`axtrain plan --sweep`: settings that keep the run's math (its global batch, its loss),
screened with the analytic memory model, compiled in the order of an analytic step estimate
(planner/plan.py) and ranked, those that fit, by the plan's estimate.

Two searches. The **layout** sweep (an entry of several devices) tries mesh axes, remat policies
and gradient accumulation. The **memory** sweep (one device, or an entry where no layout fits by
the analytic model) tries, for each layout, the knobs that trade speed for memory: gradient
accumulation, remat policies, `trainer.loss_chunk_size`, the attention implementation that the
platform runs natively without whole [queries, keys] logits (LEAN_ATTENTION) and the other
`model.scan_layers`, and on TPU and GPU `trainer.state_memory=host` (the train state in host
memory: trainer/offload.py); then the eval step's `eval.microbatch_rows` for the best. Knobs that
change the training recipe (RECIPE: bfloat16 optimizer state, Adafactor) only with
`recipe=True` (`--sweep_recipe`), labelled so.

The layouts of multi-host GPU and Trainium entries keep tensor parallelism (`model`) inside a
host; `data` spans hosts first, then `fsdp` (trainer/sharding.py:device_grid), so that
data=HOSTS, fsdp=DEVICES_PER_HOST is hybrid sharding (HSDP: FSDP inside a host, data parallel
across hosts) and a larger fsdp spans hosts. Accumulation runs from one microbatch up to one
sequence per batch shard: fewer, larger microbatches gather the FSDP-sharded weights fewer times.

`fixes` is the same search without compiling, for a step that does not fit
(planner/step_memory.py): the changes the analytic model says would fit.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import jax
import numpy as np

from core.registry import ConfigError
from modules import attn_registry, attn_splash
from planner import memory_model, plan as plan_lib, plan_report
from trainer import experiment as experiment_lib, flops as flops_lib, metrics as metrics_lib
from trainer import sharding
from trainer.config import RunConfig
from trainer.meshes import AXES, Entry
from trainer.optimizer import OPTIMIZERS

REMAT, CHUNK, SCAN = "model.remat", "trainer.loss_chunk_size", "model.scan_layers"
ACCUM, ROWS = "trainer.grad_accum_steps", "trainer.microbatch_rows"
EVAL_ROWS, STATE_DTYPE, KIND = "eval.microbatch_rows", "optimizer.state_dtype", "optimizer.kind"
STATE_MEMORY = "trainer.state_memory"
# Platforms whose devices hold arrays in host memory (trainer/offload.py): the memory sweep
# also tries the train state there. (On CPU host memory is the device's: nothing to gain.)
OFFLOAD_PLATFORMS = ("tpu", "gpu")
# Knobs that change the training recipe, swept only when asked, and the value each tries:
# bfloat16 moments; Adafactor (factored second moments, no first moment: T5, PaLM), the
# optimizer with the least state.
RECIPE = {STATE_DTYPE: "bfloat16", KIND: "adafactor"}
# Most recompute last: nothing recomputed, the matmul outputs kept, the q/k/v projections and
# attention output kept, every layer recomputed.
REMAT_SWEEP = ("none", "dots_with_no_batch_dims_saveable", "save_attn_out", "full")
# The named policies, most kept first (modules/decoder.py): a later one never needs more memory.
REMAT_ORDER = ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "save_attn_out",
               "save_qkv_proj", "full")
# The attention implementation that holds no whole [queries, keys] logits and runs natively on
# each platform: splash is a Pallas TPU kernel (Pallas interpret mode elsewhere: slow), chunked
# is XLA everywhere. Ranked by how little they hold (0: xla, dot_product).
LEAN_ATTENTION = {"tpu": "splash"}
ATTENTION_ORDER = {"chunked": 1, "splash": 2}
CHUNK_SPLITS = (2, 4, 8, 16)  # loss_chunk_size: seq_len / these (and 0, the whole sequence)


# --- config paths -------------------------------------------------------------------------

def get_path(run: RunConfig, path: str):
  """The value at a dotted config path of `run`; None where there is none."""
  node = run
  for name in path.split("."):
    if not dataclasses.is_dataclass(node) or not hasattr(node, name):
      return None
    node = getattr(node, name)
  return node


def replace_path(node, path: str, value):
  """`node` (a config dataclass) with the field at dotted `path` set to `value`."""
  head, _, rest = path.partition(".")
  new = replace_path(getattr(node, head), rest, value) if rest else value
  return dataclasses.replace(node, **{head: new})


def switch_optimizer(run: RunConfig, kind: str) -> RunConfig:
  """`run` with `kind`'s optimizer, carrying the fields both kinds share (the learning rate,
  its schedule, clipping, decay, state dtype), as `--config.optimizer.kind=KIND` does."""
  node = OPTIMIZERS.switched(dataclasses.asdict(run.optimizer), kind)
  return dataclasses.replace(run, optimizer=OPTIMIZERS.parse(node, "optimizer"))


def normalized(run: RunConfig) -> RunConfig:
  """`run` with trainer.grad_accum_steps 1 where trainer.microbatch_rows sets it (the two agree
  or the run is refused), so that a candidate may change the rows alone."""
  return replace_path(run, ACCUM, 1) if get_path(run, ROWS) else run


def own_accumulation(run: RunConfig, shards: int) -> int | None:
  """The run's microbatches per step over `shards` batch shards (trainer.microbatch_rows
  resolved); None where its rows do not split the batch there."""
  rows = get_path(run, ROWS)
  if not rows:
    return run.trainer.grad_accum_steps
  try:
    return experiment_lib.microbatches(run.data.batch_size, shards=shards, per_device=rows,
                                       what=ROWS)
  except ConfigError:
    return None


def accum_knob(run: RunConfig, accum: int, shards: int) -> tuple[str, int]:
  """How a candidate asks for `accum` microbatches over `shards` batch shards: rows per device
  where the run sets trainer.microbatch_rows (the device count's recipe), else
  trainer.grad_accum_steps."""
  if get_path(run, ROWS):
    return ROWS, run.data.batch_size // shards // accum
  return ACCUM, accum


def with_run(exp: experiment_lib.Experiment, run: RunConfig) -> experiment_lib.Experiment:
  """`exp` (its mesh, data and shapes) with `run`, microbatches resolved as the build resolves
  them (trainer/experiment.py:resolve_microbatches); ConfigError where they do not split."""
  run, passes = experiment_lib.resolve_microbatches(run, exp.source, exp.batch_sharding)
  return dataclasses.replace(exp, run=run, eval_microbatches=passes)


def attention_path(run: RunConfig, prefix: str = "model") -> str | None:
  """The dotted path of the model's attention `implementation` (one per model), if any."""
  node = get_path(run, prefix)
  if not dataclasses.is_dataclass(node):
    return None
  for f in dataclasses.fields(node):
    if f.name == "implementation":
      return f"{prefix}.implementation"
    found = attention_path(run, f"{prefix}.{f.name}")
    if found:
      return found
  return None


# --- candidates ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
  """A setting the sweep tries: mesh axes (None: the run's) and config values by dotted path
  (the memory sweep lists only those that differ from the run's)."""
  axes: dict | None = None  # data / fsdp / expert / model sizes
  knobs: tuple = ()  # ((config path, value), ...)
  accum: int = 0  # microbatches per step on its mesh (0: as its knobs or the run say)

  @classmethod
  def layout(cls, axes: dict, *, remat: str, grad_accum_steps: int,
             run: RunConfig | None = None) -> Candidate:
    """A setting of the layout sweep: axes, remat policy and accumulation (as `run` sets it:
    `accum_knob`)."""
    shards = axes["data"] * axes["fsdp"] * axes.get("expert", 1)
    accum = accum_knob(run, grad_accum_steps, shards) if run else (ACCUM, grad_accum_steps)
    return cls(axes=axes, knobs=((REMAT, remat), accum), accum=grad_accum_steps)

  def get(self, path: str, run: RunConfig | None = None):
    """This candidate's value at `path`, else `run`'s."""
    return dict(self.knobs).get(path, get_path(run, path) if run is not None else None)

  @property
  def remat(self) -> str | None:
    return self.get(REMAT)

  @property
  def grad_accum_steps(self) -> int | None:
    return self.accum or self.get(ACCUM)

  def with_knob(self, path: str, value) -> Candidate:
    return dataclasses.replace(self, knobs=(*((p, v) for p, v in self.knobs if p != path),
                                            (path, value)))

  def recipe_changes(self) -> list[str]:
    """The knobs of this candidate that change the training recipe."""
    return [p for p, _ in self.knobs if p in RECIPE]

  def flags(self) -> str:
    value = lambda v: str(v).lower() if isinstance(v, bool) else v
    return " ".join([*(f"--config.mesh.{a}={n}" for a, n in (self.axes or {}).items()),
                     *(f"--config.{p}={value(v)}" for p, v in self.knobs)])

  def apply(self, run: RunConfig) -> RunConfig:
    if self.axes:
      run = dataclasses.replace(run, mesh=dataclasses.replace(run.mesh, **self.axes))
    for path, v in self.knobs:
      run = switch_optimizer(run, v) if path == KIND else replace_path(run, path, v)
    return run


def hosts_spanned(axes: dict, entry: Entry) -> int:
  """How many hosts one fsdp group spans (1: HSDP, FSDP inside a host)."""
  if entry.topology is not None or entry.num_hosts <= 1:
    return 1
  outer = sharding.split_outer(tuple(axes.get(a, 1) for a in AXES), entry.num_hosts)
  return outer[AXES.index("fsdp")] if outer else entry.num_hosts


def layouts(run: RunConfig, num_devices: int, entry: Entry | None = None) -> list[dict]:
  """Every data x fsdp x expert x model factorisation of the devices (expert: divisors of the
  MoE layers' num_experts, 1 for a dense model; with several GPU/Trainium hosts: model inside
  one)."""
  out = []
  divisors = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
  multi_host = entry is not None and entry.topology is None and entry.num_hosts > 1
  experts = flops_lib.find_field(run.model, "num_experts") or 1
  for model in divisors:
    if multi_host and entry.hardware.devices_per_host % model:
      continue  # tensor parallel across hosts: its per-layer collectives on the network
    for expert in (d for d in divisors if (num_devices // model) % d == 0 and experts % d == 0):
      for fsdp in (d for d in divisors if (num_devices // model // expert) % d == 0):
        out.append({"data": num_devices // model // expert // fsdp, "fsdp": fsdp,
                    "expert": expert, "model": model})
  return out


def accumulations(batch: int, shards: int) -> list[int]:
  """Power-of-two microbatch counts that keep the global batch: each microbatch divides over
  the batch shards."""
  return [a for a in (2 ** k for k in range(batch.bit_length()))
          if batch % a == 0 and (batch // a) % shards == 0]


def candidates(run: RunConfig, num_devices: int, entry: Entry | None = None,
               *, recipe: bool = False) -> list[Candidate]:
  """The layout sweep: every layout (`layouts`), remat policy of REMAT_SWEEP and power-of-two
  accumulation that keeps the global batch; with `recipe`, each also with bfloat16 optimizer
  state."""
  out, values = [], recipe_values(run, recipe)
  variants = [tuple((p, v) for p, v in zip(values, combo) if v != get_path(run, p))
              for combo in itertools.product(*values.values())]
  for axes in layouts(run, num_devices, entry):
    for accum in accumulations(run.data.batch_size, axes["data"] * axes["fsdp"] * axes["expert"]):
      for remat in REMAT_SWEEP:
        cand = Candidate.layout(axes, remat=remat, grad_accum_steps=accum, run=run)
        out += [dataclasses.replace(cand, knobs=cand.knobs + v) for v in variants]
  return out


def recipe_values(run: RunConfig, recipe: bool) -> dict[str, list]:
  """The recipe knobs' values to try: the run's, and with `recipe` RECIPE's where it differs."""
  return {p: [get_path(run, p)] + ([v] if recipe and get_path(run, p) != v else [])
          for p, v in RECIPE.items() if get_path(run, p) is not None}


def _attention_runs(run: RunConfig, path: str, implementation: str) -> bool:
  """Whether the model's attention can run as `implementation` with packed documents at the
  run's sequence length (its options declared, splash's blocks dividing the length) and then
  holds less of the [queries, keys] logits (chunked: query_chunk_size divides the length)."""
  node = replace_path(run, path, implementation)
  attention = get_path(node, path.rsplit(".", 1)[0])
  try:
    attn_registry.choose(attention, segments=True)
    if implementation == "splash":
      attn_splash.block_sizes(run.data.seq_len, attention.splash_block_size)
  except ConfigError:
    return False
  return memory_model.scores_share(node, run.data.seq_len)[1] < 1  # chunked: when it chunks


def knob_values(run: RunConfig, *, platform: str, shards: int, eval_step: bool = False,
                recipe: bool = False) -> dict[str, list]:
  """The values each knob of the memory sweep takes, the run's own first. Train step:
  accumulation (microbatches per step: `accum_knob` says how a candidate sets them), remat
  policy, loss chunk, attention (and, with `recipe`, the optimizer state's dtype); eval step:
  eval.microbatch_rows (0, the whole batch, then ever fewer rows per pass), loss chunk,
  attention."""
  seq, own, values = run.data.seq_len, lambda p: [get_path(run, p)], {}
  if eval_step:
    share = run.eval.batch_size // shards
    values[EVAL_ROWS] = own(EVAL_ROWS) + [0] + [r for r in range(share - 1, 0, -1)
                                                if share % r == 0]
  else:
    mine = own_accumulation(run, shards)
    values[ACCUM] = ([mine] if mine else []) + accumulations(run.data.batch_size, shards)
    values[REMAT] = own(REMAT) + list(REMAT_SWEEP)
    if platform in OFFLOAD_PLATFORMS:
      values[STATE_MEMORY] = own(STATE_MEMORY) + ["host"]
  values[CHUNK] = own(CHUNK) + [0] + [seq // k for k in CHUNK_SPLITS if seq % k == 0]
  path = attention_path(run)
  lean = LEAN_ATTENTION.get(platform, "chunked")
  if path:
    values[path] = own(path) + ([lean] if _attention_runs(run, path, lean) else [])
  if not eval_step:
    values.update(recipe_values(run, recipe))
  return {p: list(dict.fromkeys(v)) for p, v in values.items() if v and v != [None]}


def knob_candidates(run: RunConfig, values: dict[str, list], *, shards: int,
                    axes: dict | None = None) -> list[Candidate]:
  """Every combination of `values`, each listing only the knobs it changes (accumulation as
  `accum_knob` sets it)."""
  out, mine = [], own_accumulation(run, shards)
  for combo in itertools.product(*values.values()):
    knobs, accum = [], 0
    for path, value in zip(values, combo):
      if path == ACCUM:
        accum = value
        if value != mine:
          knobs.append(accum_knob(run, value, shards))
      elif value != get_path(run, path):
        knobs.append((path, value))
    out.append(Candidate(axes=axes, knobs=tuple(knobs), accum=accum))
  return out


def memory_candidates(run: RunConfig, num_devices: int, entry: Entry, *, platform: str,
                      recipe: bool = False) -> list[Candidate]:
  """The memory sweep: the knobs of `knob_values` for every layout (on one device: no mesh
  flags)."""
  out = []
  for axes in layouts(run, num_devices, entry):
    shards = axes["data"] * axes["fsdp"] * axes["expert"]
    values = knob_values(run, platform=platform, shards=shards, recipe=recipe)
    out += knob_candidates(run, values, shards=shards, axes=axes if num_devices > 1 else None)
  return out


# --- screening ----------------------------------------------------------------------------

def screen_estimate(exp: experiment_lib.Experiment, entry: Entry, *, compute_bytes: int
                    ) -> tuple[float, float]:
  """(overlapped, serial) seconds of a step by an analytic model, without compiling: the order
  in which the sweep compiles (its ranking reads the compiled HLO). Collectives per microbatch:
  each pass (forward, backward) all-gathers the fsdp-sharded matmul weights and the backward
  reduce-scatters their gradient; per layer and pass, tensor parallelism all-reduces the
  activations twice (attention and MLP outputs), a third pass under remat; data parallelism
  all-reduces the gradient shards. Groups that span hosts go at the network bandwidth."""
  hw, run = entry.hardware, exp.run
  if not (hw.peak_bf16_flops and hw.hbm_bandwidth and hw.link_bandwidth):
    return 0.0, 0.0
  mesh = dict(exp.mesh.shape)
  data, fsdp, model = mesh["data"], mesh["fsdp"], mesh["model"]
  n, accum, seq = int(np.prod(list(mesh.values()))), run.trainer.grad_accum_steps, exp.source.seq_len
  params = exp.abstract_state.params
  top_k = flops_lib.find_field(run.model, "top_k")
  shape = memory_model.model_shape(params, top_k=top_k)
  weights = flops_lib.count(params, seq_len=seq, top_k=top_k).matmul_params * compute_bytes
  remat = getattr(run.model, "remat", "none")
  passes = 2 if remat == "none" else 3
  tokens = exp.source.batch_size * seq
  compute = (flops_lib.model_flops_per_token(run, params) * tokens / n
             * plan_lib.RECOMPUTE.get(remat, 4 / 3) / hw.peak_bf16_flops)
  analytic = memory_model.analytic_memory(exp, compute_bytes=compute_bytes)
  hbm = memory_model.hbm_traffic(exp, analytic, compute_bytes=compute_bytes) / hw.hbm_bandwidth
  share = lambda g: (g - 1) / g
  fsdp_bytes = accum * 3 * weights / model * share(fsdp)
  tp_bytes = (2 * passes * shape.layers * 2 * share(model) * tokens / (n // model)
              * shape.dim * compute_bytes)
  dp_bytes = accum * 2 * share(data) * weights / (model * fsdp)
  spans = hosts_spanned(mesh, entry) > 1
  host_bw = hw.host_bandwidth or hw.link_bandwidth
  network = (fsdp_bytes if spans else 0.0) + (dp_bytes if entry.num_hosts > 1 else 0.0)
  links = fsdp_bytes + tp_bytes + dp_bytes - network
  collectives = links / hw.link_bandwidth + network / host_bw
  return max(compute, hbm, collectives), max(compute, hbm) + collectives


def _effective_chunk(cand: Candidate, run: RunConfig) -> int:
  return cand.get(CHUNK, run) or run.data.seq_len


def screen(run: RunConfig, entry: Entry, devices, cands: list[Candidate], *, usable: float
           ) -> tuple[list, list]:
  """([(Candidate, analytic bytes)] in compile order, [(Candidate, reason)] rejected).

  Those the analytic model puts within 1.5x of `usable` compile: those within `usable` first,
  each group fastest first by `screen_estimate`, then (where it ties: a step bound by compute)
  fewest microbatches, fewest changes, the longest loss chunk."""
  dtype = experiment_lib.compute_dtype(run.trainer.compute_dtype, entry.hardware.platform)
  c = np.dtype(dtype).itemsize
  screened, rejected, built = [], [], {}
  for cand in cands:
    recipe = tuple((p, v) for p, v in cand.knobs if p in RECIPE)
    key = (tuple((cand.axes or {}).items()), recipe)
    if key not in built:  # shapes and shardings depend on the mesh and the optimizer only
      base = Candidate(axes=cand.axes, knobs=((ROWS, 0), (ACCUM, 1)) + recipe)
      try:
        built[key] = experiment_lib.build(base.apply(run), entry, devices)
      except ConfigError as e:
        built[key] = str(e)
    if isinstance(built[key], str):
      rejected.append((cand, built[key]))
      continue
    try:
      exp = with_run(built[key], cand.apply(run))
    except ConfigError as e:
      rejected.append((cand, str(e)))
      continue
    total = memory_model.analytic_memory(exp, compute_bytes=c).total
    if total > 1.5 * usable:
      rejected.append((cand, f"analytic model: {plan_report.gib(total)} per device"))
    else:
      order = (total > usable, *screen_estimate(exp, entry, compute_bytes=c),
               exp.run.trainer.grad_accum_steps, len(cand.knobs), -_effective_chunk(cand, run))
      screened.append((order, cand, total))
  screened.sort(key=lambda s: s[0])
  return [(cand, total) for _, cand, total in screened], rejected


def with_scan_twins(run: RunConfig, order: list[Candidate]) -> list[Candidate]:
  """`order`, then each candidate again with the other model.scan_layers (the analytic screen
  does not tell them apart; the compiler's memory and the compiled estimate may): compiled
  last, where budget is left, or next after their twin fits (`twin_next`)."""
  scan = get_path(run, SCAN)
  if scan is None:
    return order
  stages = run.mesh.stage not in (None, 1)
  twins = [] if stages and scan else [c.with_knob(SCAN, not scan) for c in order]
  return order + twins


# --- what a compiled result implies -------------------------------------------------------

def _lean(cand: Candidate, run: RunConfig, path: str | None) -> tuple | None:
  """How far each knob of `cand` goes toward less memory: (accumulation, remat rank, chunks per
  sequence, attention rank, bfloat16 state, state in host memory); None for a remat policy
  outside REMAT_ORDER."""
  remat = cand.get(REMAT, run)
  if remat not in REMAT_ORDER:
    return None
  seq = run.data.seq_len
  return (cand.grad_accum_steps or cand.get(ACCUM, run), REMAT_ORDER.index(remat),
          seq // _effective_chunk(cand, run),
          ATTENTION_ORDER.get(cand.get(path, run) if path else None, 0),
          int(cand.get(STATE_DTYPE, run) == "bfloat16"),
          int(cand.get(STATE_MEMORY, run) == "host"))


def implied(cand: Candidate, *, missed: list, fitted: list, run: RunConfig) -> str:
  """Why `cand` need not compile ("" when it must): a compiled setting of the same layout,
  model.scan_layers and optimizer that did not fit holds at least as little memory on every
  knob; or one that fit, with the same attention too, holds no less on any (more accumulation,
  recompute or loss chunks only slow a step down). Assumes that each knob's leaner value never
  needs more memory."""
  path = attention_path(run)
  lean = _lean(cand, run, path)
  if lean is None:
    return ""
  same = lambda o, *ps: o.axes == cand.axes and all(o.get(p, run) == cand.get(p, run)
                                                     for p in ps if p)
  for other in missed:
    o = _lean(other, run, path)
    if o is not None and same(other, SCAN, KIND) and all(a <= b for a, b in zip(lean, o)):
      return f"no leaner than {other.flags() or 'the config as given'}, which does not fit"
  for other in fitted:
    o = _lean(other, run, path)
    if o is not None and same(other, path, SCAN, STATE_DTYPE, KIND) and all(
        a >= b for a, b in zip(lean, o)):
      return f"no faster than {other.flags() or 'the config as given'}, which fits"
  return ""


# --- compiling ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalFit:
  """The eval step of the best setting: the fewest passes (eval.microbatch_rows) that fit."""
  rows: int  # eval.microbatch_rows: rows per device and pass (0: the whole batch at once)
  passes: int  # device passes per eval batch
  needed: int | None  # bytes per device: the compiler's peak or the analytic model's
  # (`source`); None where the compiler refused the step for memory
  fits: bool
  source: str  # "TPU compiler", "GPU compiler" or "model"
  compiles: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepResult:
  ranked: list  # [(Candidate, Plan)] that fit, fastest estimate first
  rejected: list  # [(Candidate, reason)]
  skipped: int  # candidates left when the time budget or the compile limit ran out
  mode: str = "layout"  # "layout" or "memory: <why>"
  implied: list = dataclasses.field(default_factory=list)  # [(Candidate, why)] not compiled
  eval: EvalFit | None = None  # the best setting's eval step (None: not checked)
  best: Candidate | None = None  # ranked[0]'s, with the eval rows its eval step needs


def _compile_plan(cand: Candidate, run: RunConfig, entry: Entry, devices, *, config_name: str,
                  margin: float):
  """The candidate's plan (train step), or the reason it cannot compile."""
  try:
    return plan_lib.plan(cand.apply(run), entry, config_name=config_name, devices=devices,
                         margin=margin, with_eval=False)
  except ConfigError as e:
    return str(e)
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return "the compiler ran out of device memory"


def twin_next(queue: list[Candidate], cand: Candidate, run: RunConfig) -> list[Candidate]:
  """`queue` with the scan_layers twin of `cand` (which fits) first: the compiled estimate can
  rank them apart (a scanned stack stacks and slices per-layer buffers; unrolled layers do
  not)."""
  scan = cand.get(SCAN, run)
  twin = cand.with_knob(SCAN, not scan) if scan is not None else None
  return [twin] + [c for c in queue if c != twin] if twin in queue else queue


def compile_in_order(order: list[Candidate], run: RunConfig, entry: Entry, devices, *,
                     config_name: str, budget_s: float, limit: int, margin: float,
                     progress=None) -> tuple[list, list, list, int]:
  """(fitting [(Candidate, Plan)], rejected, implied, skipped): compiles `order` until `limit`
  compiles or `budget_s` seconds, leaving out what earlier compiles imply (`implied`), the
  twin of each that fits next (`twin_next`)."""
  start, fitting, rejected, missed, left_out, compiled = time.perf_counter(), [], [], [], [], 0
  queue = list(order)
  while queue:
    if compiled >= limit or time.perf_counter() - start > budget_s:
      return fitting, rejected, left_out, len(queue)
    cand = queue.pop(0)
    why = implied(cand, missed=missed, fitted=[c for c, _ in fitting], run=run)
    if why:
      left_out.append((cand, why))
      continue
    p = _compile_plan(cand, run, entry, devices, config_name=config_name, margin=margin)
    compiled += 1
    if isinstance(p, str):
      rejected.append((cand, p))
      missed.append(cand)
      continue
    if progress:
      progress(cand, p)
    if p.fits:
      fitting.append((cand, p))
      queue = twin_next(queue, cand, run)
    else:
      rejected.append((cand, f"short by {plan_report.gib(-p.headroom)}"))
      missed.append(cand)
  return fitting, rejected, left_out, 0


def _eval_peak(exp: experiment_lib.Experiment) -> int | None:
  """The compiled eval step's bytes per device; None when the compiler refuses it for memory."""
  state, batch = plan_lib.abstract_inputs(exp, exp.run.eval.batch_size)
  with exp.context():
    try:
      compiled = exp.eval_fn.lower(state.params, batch).compile()
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      return None
  return metrics_lib.compiled_stats(compiled).get("total_bytes")


def eval_fit(run: RunConfig, entry: Entry, devices, *, usable: float) -> EvalFit:
  """The fewest passes (eval.microbatch_rows) whose eval step fits `usable` bytes: the analytic
  model picks where to start, the compiler decides (TPU and GPU entries; elsewhere the model
  does)."""
  exp = experiment_lib.build(run, entry, devices)
  share = run.eval.batch_size // sharding.num_shards(exp.batch_sharding, dim=0)
  options = [0] + [r for r in range(share - 1, 0, -1) if share % r == 0]  # fewest passes first
  at = [with_run(exp, replace_path(run, EVAL_ROWS, r)) for r in options]
  c = np.dtype(exp.compute_dtype).itemsize
  model = [memory_model.eval_memory(e, compute_bytes=c) for e in at]
  i = next((k for k, b in enumerate(model) if b <= usable), len(options) - 1)
  platform = devices[0].platform
  result = lambda k, needed, fits, source, compiles: EvalFit(
      rows=options[k], passes=at[k].eval_microbatches, needed=needed, fits=fits, source=source,
      compiles=compiles)
  if platform not in ("tpu", "gpu"):
    return result(i, model[i], model[i] <= usable, "model", 0)
  peaks = {}
  peak = lambda k: peaks[k] if k in peaks else peaks.setdefault(k, _eval_peak(at[k]))
  fits = lambda k: peak(k) is not None and peak(k) <= usable
  if fits(i):  # fewer passes while they fit
    while i > 0 and fits(i - 1):
      i -= 1
  else:  # more until they fit
    while i + 1 < len(options) and not fits(i):
      i += 1
  return result(i, peak(i), fits(i), f"{platform.upper()} compiler", len(peaks))


# --- the sweep ----------------------------------------------------------------------------

def search(run: RunConfig, entry: Entry, devices, *, usable: float, recipe: bool = False
           ) -> tuple[str, list[Candidate], list]:
  """(mode, compile order, rejected): the layout sweep where some layout fits by the analytic
  model, else (and on one device) the memory sweep, its scan_layers twins last."""
  n = len(devices)
  if n > 1:
    screened, rejected = screen(run, entry, devices, candidates(run, n, entry, recipe=recipe),
                                usable=usable)
    if any(total <= usable for _, total in screened):
      return "layout", [c for c, _ in screened], rejected
    why = "no layout fits by the analytic model"
  else:
    why = "one device"
  cands = memory_candidates(run, n, entry, platform=entry.hardware.platform, recipe=recipe)
  screened, rejected = screen(run, entry, devices, cands, usable=usable)
  return f"memory: {why}", with_scan_twins(run, [c for c, _ in screened]), rejected


def sweep(run: RunConfig, entry: Entry, *, config_name: str, devices=None,
          budget_s: float = 1800.0, limit: int = 12, margin: float = 0.05, progress=None,
          with_eval: bool = True, recipe: bool = False) -> SweepResult:
  """Ranks the settings that fit by the plan's estimate (overlapped, then serial, then fewest
  changes): `search` orders them, at most `limit` compile within `budget_s` seconds (what
  earlier compiles imply is left out), and with `with_eval` the best gets the fewest
  eval passes that its eval step fits in (`eval_fit`; after the budget)."""
  if devices is None:
    devices, _ = plan_lib.target_devices(entry)
  run = normalized(run)
  usable = (entry.hardware.hbm_bytes or 0) * (1 - margin)
  mode, order, rejected = search(run, entry, devices, usable=usable, recipe=recipe)
  fitting, failed, left_out, skipped = compile_in_order(
      order, run, entry, devices, config_name=config_name, budget_s=budget_s, limit=limit,
      margin=margin, progress=progress)
  inf = float("inf")
  fitting.sort(key=lambda cp: ((cp[1].estimate.step_s, cp[1].estimate.serial_s)
                               if cp[1].estimate else (inf, inf)) + (len(cp[0].knobs),))
  evaluated = best = None
  if fitting:
    best = fitting[0][0]
    if with_eval:
      evaluated = eval_fit(best.apply(run), entry, devices, usable=usable)
      if evaluated.rows != run.eval.microbatch_rows:
        best = best.with_knob(EVAL_ROWS, evaluated.rows)
  return SweepResult(ranked=fitting, rejected=rejected + failed, skipped=skipped, mode=mode,
                     implied=left_out, eval=evaluated, best=best)


def model_bytes(exp: experiment_lib.Experiment, *, eval_step: bool) -> int:
  """The analytic model's bytes per device for `exp`'s train step (or eval step)."""
  c = np.dtype(exp.compute_dtype).itemsize
  if eval_step:
    return memory_model.eval_memory(exp, compute_bytes=c)
  return memory_model.analytic_memory(exp, compute_bytes=c).total


def state_bytes(exp: experiment_lib.Experiment, *, eval_step: bool) -> int:
  """Bytes per device of what the step takes as arguments (exact): parameters, and for the
  train step the optimizer state."""
  a = memory_model.analytic_memory(exp, compute_bytes=np.dtype(exp.compute_dtype).itemsize)
  return a.params + (0 if eval_step else a.opt_state)


def fixes(exp: experiment_lib.Experiment, *, eval_step: bool, within: float,
          entry: Entry | None = None, limit: int = 3) -> list[tuple[Candidate, int]]:
  """For a step of `exp` that does not fit: [(Candidate, model bytes)], the changes that keep
  the run's math and mesh which the analytic model (`model_bytes`) puts within `within` bytes;
  fewest changes first, then the fastest by `screen_estimate` (the eval step, or an entry
  without figures: the most memory used); at most `limit`. Instant: nothing compiles."""
  run, shards = normalized(exp.run), sharding.num_shards(exp.batch_sharding, dim=0)
  values = knob_values(run, platform=exp.mesh.devices.flat[0].platform, eval_step=eval_step,
                       shards=shards)
  c = np.dtype(exp.compute_dtype).itemsize
  found = []
  for cand in knob_candidates(run, values, shards=shards):
    changed = cand.apply(run)
    try:
      experiment_lib.check_parallel(changed, exp.source, exp.mesh, exp.rules)
      e = with_run(exp, changed)
    except ConfigError:
      continue
    total = model_bytes(e, eval_step=eval_step)
    if cand.knobs and total <= within:
      speed = (screen_estimate(e, entry, compute_bytes=c)[0]
               if entry is not None and not eval_step else 0.0)
      found.append(((len(cand.knobs), speed or -total), cand, total))
  found.sort(key=lambda f: f[0])
  return [(cand, total) for _, cand, total in found[:limit]]


def label(cand: Candidate) -> str:
  """The candidate's flags, and what it changes of the training recipe."""
  recipe = cand.recipe_changes()
  return (cand.flags() or "the config as given") + (
      f" [changes the training recipe: {', '.join(recipe)}]" if recipe else "")


def sweep_text(result: SweepResult) -> str:
  lines = [f"sweep ({result.mode}): {len(result.ranked)} fitting, {len(result.rejected)} "
           f"rejected, {len(result.implied)} left out (implied by compiled ones), "
           f"{result.skipped} not compiled (budget)"]
  for i, (cand, p) in enumerate(result.ranked):
    e = p.estimate
    step = (f"step {plan_report.secs(e.step_s)} overlapped, {plan_report.secs(e.serial_s)} "
            f"serial, MFU {e.mfu:.2f} / {e.mfu_serial:.2f}" if e else "no estimate")
    lines.append(f"  {i + 1}. {step} (estimate), needs {plan_report.gib(p.needed)}: "
                 f"{label(cand)}")
  ev = result.eval
  if ev is not None:
    needs = (f"needs {plan_report.gib(ev.needed)} [{ev.source}]" if ev.needed is not None
             else f"the {ev.source} ran out of memory")
    lines.append(f"  eval step of 1.: {'fits' if ev.fits else 'does NOT fit'} with "
                 f"eval.microbatch_rows={ev.rows} ({ev.passes} passes): {needs} ({ev.compiles} "
                 f"compiles)")
  if result.best is not None:
    lines.append(f"best: {label(result.best)}")
  return "\n".join(lines) + "\n"
