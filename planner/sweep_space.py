"""What `axtrain plan --sweep` tries: settings that keep the run's math (its global batch, its
loss), each a Candidate (mesh axes and config values by dotted path).

Two searches. The **layout** sweep (an entry of several devices) tries mesh axes, remat policies
and gradient accumulation (`candidates`). The **memory** sweep (one device, or an entry where no
layout fits by the analytic model) tries, for each layout, the knobs that trade speed for memory
(`knob_values`): gradient accumulation, remat policies, `trainer.loss_chunk_size`, the attention
implementations that the platform runs natively without whole [queries, keys] logits
(LEAN_ATTENTION) and the other `model.scan_layers`, and on TPU and GPU
`trainer.state_memory=host` (the train state in host memory: trainer/offload.py); then the eval
step's `eval.microbatch_rows` for the best. Knobs that change the training recipe (RECIPE:
bfloat16 optimizer state, Adafactor) only with `recipe=True` (`--sweep_recipe`), labelled so.

The layouts of multi-host GPU and Trainium entries keep tensor parallelism (`model`) inside a
host; `data` spans hosts first, then `fsdp` (trainer/sharding.py:device_grid), so that
data=HOSTS, fsdp=DEVICES_PER_HOST is hybrid sharding (HSDP: FSDP inside a host, data parallel
across hosts) and a larger fsdp spans hosts. Accumulation runs from one microbatch up to one
sequence per batch shard: fewer, larger microbatches gather the FSDP-sharded weights fewer times.
"""

from __future__ import annotations

import dataclasses
import itertools

from core.registry import ConfigError
from modules import attn_pallas_hd64, attn_registry, attn_splash
from planner import memory_model
from trainer import experiment as experiment_lib, flops as flops_lib, sharding
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
# Where devices hold arrays in host memory (OFFLOAD_PLATFORMS), the memory sweep also saves
# activations there instead of recomputing them (modules/decoder.py): the plan times their
# trips over the host link (planner/plan.py:offloaded_activations).
REMAT_OFFLOAD = ("offload_dots_with_no_batch_dims", "offload_attn_out")
# The named policies, most kept first (modules/decoder.py): a later one never needs more memory.
REMAT_ORDER = ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "save_attn_out",
               "save_qkv_proj", "full")
# The attention implementations that hold no whole [queries, keys] logits and run natively on
# each platform, each tried where the model's attention can take it: on TPU the Pallas kernels,
# pallas_hd64 (head_dim 64 only; 1.6x splash's speed on the chip, docs/chip.md) and splash
# (Pallas interpret mode elsewhere: slow); chunked is XLA everywhere. Ranked by how little they
# hold (0: xla, dot_product; the Pallas kernels none).
LEAN_ATTENTION = {"tpu": ("pallas_hd64", "splash")}
ATTENTION_ORDER = {"chunked": 1, "splash": 2, "pallas_hd64": 2}
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
  run's sequence length (its options declared, splash's blocks dividing the length,
  pallas_hd64's head_dim 64 and pairs of heads) and then holds less of the [queries, keys]
  logits (chunked: query_chunk_size divides the length)."""
  node = replace_path(run, path, implementation)
  attention = get_path(node, path.rsplit(".", 1)[0])
  try:
    attn_registry.choose(attention, segments=True)
    if implementation == "splash":
      attn_splash.block_sizes(run.data.seq_len, attention.splash_block_size)
    if implementation == "pallas_hd64":
      dim = get_path(run, "model.dim")
      if dim is None and not attention.head_dim:  # no width to take the heads' from
        return False
      heads, kv_heads, head_dim = attention.heads(dim)
      attn_pallas_hd64.layout(attention, batch=1, length=run.data.seq_len, heads=heads,
                              kv_heads=kv_heads, head_dim=head_dim, segments=True,
                              interpret=True)
  except ConfigError:
    return False
  return memory_model.scores_share(node, run.data.seq_len)[1] < 1  # chunked: when it chunks


def knob_values(run: RunConfig, *, platform: str, shards: int, eval_step: bool = False,
                recipe: bool = False) -> dict[str, list]:
  """The values each knob of the memory sweep takes, the run's own first. Train step:
  accumulation (microbatches per step: `accum_knob` says how a candidate sets them), remat
  policy (on OFFLOAD_PLATFORMS also those that save activations in host memory), loss chunk,
  attention (and, with `recipe`, the optimizer state's dtype); eval step: eval.microbatch_rows (0, the whole batch, then ever fewer rows per pass), loss chunk,
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
      values[REMAT] += list(REMAT_OFFLOAD)
      values[STATE_MEMORY] = own(STATE_MEMORY) + ["host"]
  values[CHUNK] = own(CHUNK) + [0] + [seq // k for k in CHUNK_SPLITS if seq % k == 0]
  path = attention_path(run)
  if path:
    values[path] = own(path) + [lean for lean in LEAN_ATTENTION.get(platform, ("chunked",))
                                if _attention_runs(run, path, lean)]
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


def effective_chunk(cand: Candidate, run: RunConfig) -> int:
  """The loss chunk `cand` runs with: its loss_chunk_size, or the whole sequence."""
  return cand.get(CHUNK, run) or run.data.seq_len
