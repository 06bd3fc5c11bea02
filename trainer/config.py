"""The root of a run config: its sections, typed and checked at the boundary.

    model       the module tree (modules.MODELS)
    optimizer   optax transform + schedule (trainer.optimizer.OPTIMIZERS)
    data        the training source (trainer.data.DATA)
    trainer     loop settings (TrainerConfig)
    eval        held-out evaluation (EvalConfig)
    mesh        device mesh axes and per-mesh rules (MeshConfig)
    checkpoint  saving and restoring (CheckpointConfig)
    init        where initial parameters come from (InitConfig)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import typing
from typing import Any, ClassVar, Literal

import ml_collections

from core import choices, paths
from core.registry import ConfigError, child, child_registry, parse_dataclass, suggest
from trainer.mesh_match import check_rule
from trainer.ranges import NON_NEGATIVE, Interval, check_ranges, float32


MAX_STEP = 2 ** 31 - 1  # the train state counts steps in int32


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
  max_steps: int  # optimizer steps to train for; raise it on a finished run to extend that run
  log_every: int = 10  # steps between metrics records (and host syncs)
  seed: int = 0  # parameter init and data order
  grad_accum_steps: int = 1  # microbatches per step (lax.scan), same result as one big batch
  # Rows each device computes at once: > 0 sets grad_accum_steps to data.batch_size / (batch
  # shards x microbatch_rows) on the mesh in use (1 where a device's share is smaller), so one
  # recipe line serves any device count; 0 = grad_accum_steps as set.
  microbatch_rows: int = 0
  compute_dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bfloat16 on accelerators, float32 on CPU
  # Where the float32 master weights and the optimizer state live between updates: "device"
  # (accelerator memory) or "host" (host memory: each step brings the weights to the device in
  # the compute dtype for its microbatches, then updates the state through the device one
  # parameter at a time; docs/offload.md). Placement only: same losses, same checkpoints.
  state_memory: Literal["device", "host"] = "device"
  # Positions per cross-entropy chunk: the LM head and loss run chunk by chunk, never holding
  # float32 [batch, seq, vocab] logits; must divide data.seq_len. 0 = the whole sequence at once.
  loss_chunk_size: int = 0
  # PaLM's z-loss: this coefficient times log(Z)^2 (Z: each counted token's softmax normaliser)
  # added to the training loss, which keeps the output logits from drifting (PaLM, OLMo-2:
  # 1e-4); the `loss` and `eval_loss` metrics stay the cross-entropy. 0 = off.
  z_loss: float = 0.0
  # A step whose loss or gradient is NaN/Inf: False stops the run (exit 1); True leaves the
  # parameters and optimizer state unchanged for that step and counts it (metric nonfinite_skipped).
  skip_nonfinite: bool = False
  hang_timeout_s: float = 1800.0  # seconds without a finished step before all thread stacks are dumped to stderr; 0 = off
  # Peak FLOP/s of one device, the denominator of the `mfu` metric; 0 = the mesh entry's
  # peak bf16 FLOP/s (on CPU: a matmul benchmark run once per machine, cached in ~/.cache/axtrain).
  peak_flops: float = 0.0
  profile_steps: tuple[int, ...] = ()  # (first, last): jax.profiler trace of these steps into <run_dir>/profile/; () = off
  wandb_project: str = ""  # Weights & Biases project to log metrics to (needs `pip install wandb`); "" = off
  # JAX's persistent compilation cache (trainer/compile_cache.py): a resumed or repeated run reads
  # its compiled programs back. "auto": $JAX_COMPILATION_CACHE_DIR, else ~/.cache/axtrain/jax;
  # "off"; or a folder.
  compile_cache: str = "auto"
  RANGES: ClassVar = {"loss_chunk_size": NON_NEGATIVE, "microbatch_rows": NON_NEGATIVE,
                      "hang_timeout_s": NON_NEGATIVE, "peak_flops": NON_NEGATIVE}

  def check(self):
    for name in ("max_steps", "log_every", "grad_accum_steps"):
      if getattr(self, name) <= 0:
        raise ConfigError(f"trainer.{name} must be positive, got {getattr(self, name)}")
      if getattr(self, name) > MAX_STEP:
        raise ConfigError(f"trainer.{name} must be at most {MAX_STEP:,} (steps are counted in "
                          f"int32), got {getattr(self, name):,}")
    if not 0 <= self.seed < 2 ** 63:
      raise ConfigError(f"trainer.seed must be a whole number in [0, 2**63), got {self.seed}")
    check_ranges(self, "trainer")
    if not 0 <= float32(self.z_loss) < math.inf:
      raise ConfigError(f"trainer.z_loss must be a finite number >= 0 (0 = off), got "
                        f"{self.z_loss}" + (", inf in float32 (the precision the steps compute "
                                            "in)" if 0 < self.z_loss < math.inf else ""))
    if self.profile_steps and (len(self.profile_steps) != 2
                               or not 1 <= self.profile_steps[0] <= self.profile_steps[1]
                               <= self.max_steps):
      raise ConfigError(f"trainer.profile_steps={tuple(self.profile_steps)}: give (first, last) "
                        f"with 1 <= first <= last <= trainer.max_steps ({self.max_steps}), "
                        f"or () for no profile")
    if self.wandb_project and importlib.util.find_spec("wandb") is None:
      raise ConfigError(f"trainer.wandb_project={self.wandb_project!r} but wandb is not "
                        f"installed; `pip install wandb` or leave trainer.wandb_project empty")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
  every_steps: int = 0  # steps between evaluations; 0 = only at the end
  batch_size: int = 32  # sequences per eval batch
  num_batches: int = 4  # eval batches per evaluation
  # Rows each device evaluates at once: an eval batch with more rows per device goes through
  # in several passes (strided rows, as trainer.microbatch_rows): the same sums with less
  # memory. 0 = the whole batch at once.
  microbatch_rows: int = 0
  RANGES: ClassVar = {"every_steps": NON_NEGATIVE, "batch_size": Interval(1),
                      "num_batches": Interval(1), "microbatch_rows": NON_NEGATIVE}

  def check(self):
    check_ranges(self, "eval")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
  # Axis sizes; None takes the size from the selected mesh (--mesh), -1 fills from the
  # device count. Explicit values here win over the mesh entry and over `rules`.
  data: int | None = None  # data parallel: batch rows (parameters replicated)
  stage: int | None = None  # pipeline stages: the scanned layer stack split in groups of layers
  fsdp: int | None = None  # fully sharded data parallel: batch rows and parameters (ZeRO-3)
  expert: int | None = None  # expert parallelism: must divide every MoE layer's num_experts
  context: int | None = None  # context parallel: each sequence's positions (and parameters)
  model: int | None = None  # tensor parallel: heads, MLP units, vocabulary
  # ((match, {config.path: value, ...}), ...): the first rule that matches the selected mesh
  # entry applies its overrides (AXLearn's mesh_rules). match: a regex of the entry's whole
  # name, or hardware facts {"platform": "gpu", "devices_per_host": 8, "min_hbm_gb": 80, ...}
  # (trainer/mesh_match.py:MATCH_KEYS), so that a new entry of that hardware takes the rule.
  rules: tuple = ()

  def check(self):
    for i, rule in enumerate(self.rules):
      check_rule(i, rule)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
  every_steps: int = 0  # steps between checkpoints; 0 = only at the end (and on preemption)
  keep: int = 3  # most recent committed checkpoints kept
  keep_every_steps: int = 0  # also keep every checkpoint whose step is a multiple of this; 0 = none
  # Resume from this committed step instead of the latest (newer ones are set aside); 0 = latest.
  # Not part of the run's identity: changing it does not make the run directory "different".
  restore_step: int = 0
  # zstd-compress the arrays' chunks (Orbax's default). False: files the size of the state, and
  # no compressing or decompressing in a save or a restore (on this repo's 2-core CPU a 2.2 GB
  # host-memory state saved in 4.4 s instead of 7.2-7.9 s, and restored in 2.2 s instead of
  # 2.7-3.1 s; random float32 shrinks by 8%; on a v5e host llm_1b's state saved and read back
  # about as fast either way: docs/fault_tolerance.md). Only new saves follow it: a restore
  # reads either.
  compression: bool = True
  RANGES: ClassVar = {"every_steps": NON_NEGATIVE, "keep": Interval(1),
                      "keep_every_steps": NON_NEGATIVE, "restore_step": NON_NEGATIVE}

  def check(self):
    check_ranges(self, "checkpoint")


@dataclasses.dataclass(frozen=True, kw_only=True)
class InitConfig:
  # A run directory (training run or `axtrain convert` output) whose latest checkpoint's
  # parameters start this run; optimizer state and step start fresh. "" = random init.
  # Ignored when the run resumes from its own checkpoint.
  from_run: str = ""

  def check(self):
    pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  model: Any = child("model")
  optimizer: Any = child("optimizer")
  data: Any = child("data")
  trainer: TrainerConfig
  eval: EvalConfig
  mesh: MeshConfig
  checkpoint: CheckpointConfig
  init: InitConfig


_SECTIONS = [f.name for f in dataclasses.fields(RunConfig)]
_AXIS_FIELDS = [f.name for f in dataclasses.fields(MeshConfig) if f.name != "rules"]


def section_node(cls: type, **values) -> ml_collections.ConfigDict:
  """Every field of a plain section, with defaults, for config files to start from."""
  out = {}
  for f in dataclasses.fields(cls):
    if f.name in values:
      out[f.name] = values.pop(f.name)
    elif f.default is not dataclasses.MISSING:
      out[f.name] = f.default
  if values:
    raise ConfigError(f"{cls.__name__} has no field(s) {', '.join(values)}")
  node = ml_collections.ConfigDict(out)
  for name in _AXIS_FIELDS:
    if cls is MeshConfig and node[name] is None:
      node[name] = ml_collections.config_dict.placeholder(int)
  return node


def parse(cfg: ml_collections.ConfigDict | dict) -> RunConfig:
  """Checks every section of a resolved config; raises ConfigError naming the path."""
  root = cfg.to_dict() if isinstance(cfg, ml_collections.ConfigDict) else dict(cfg)
  for key in root:
    if key not in _SECTIONS:
      raise ConfigError(f"unknown config section '{key}'{suggest(key, _SECTIONS)};"
                        f" sections: {', '.join(_SECTIONS)}")
  values = {}
  hints = typing.get_type_hints(RunConfig)
  for f in dataclasses.fields(RunConfig):
    name, reg = f.name, child_registry(f)
    if name not in root:
      raise ConfigError(f"config has no '{name}' section")
    if reg is not None:
      values[name] = reg.parse(root[name], name)
    else:
      values[name] = parse_dataclass(hints[name], root[name], name, what=f"section '{name}'")
      values[name].check()
  return RunConfig(**values)


def switch_kind(cfg: ml_collections.ConfigDict, path: str, kind: str, *,
                dropped: dict | None = None, **values) -> ml_collections.ConfigDict:
  """Replaces the component at `path` of a run config by `kind`'s node, carrying over the
  fields both kinds share (what `--config.<path>.kind=K` does); returns the new node.
  `dropped`: see core.paths.switch_kind."""
  return paths.switch_kind(cfg, path, kind, schema=RunConfig, dropped=dropped, **values)


def field_at(cfg: ml_collections.ConfigDict, path: str) -> dataclasses.Field | None:
  """The config field at dotted `path` of a run config (core.paths.field_at)."""
  return paths.field_at(cfg, path, schema=RunConfig)


def chosen(cfg: ml_collections.ConfigDict | dict) -> dict:
  """What a run config chooses: its kinds, required fields and values other than the
  defaults (core/choices.py); the golden files hold this."""
  return choices.chosen(cfg, RunConfig)


def with_defaults(chosen_values: dict) -> dict:
  """The resolved run config of `chosen_values` (the inverse of `chosen`)."""
  return choices.with_defaults(chosen_values, RunConfig)


def defaults(cfg: ml_collections.ConfigDict | dict) -> dict:
  """Every field of `cfg`'s nodes that has a default, at that default (core.choices.defaults)."""
  return choices.defaults(cfg, RunConfig)
