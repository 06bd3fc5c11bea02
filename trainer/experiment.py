"""The fixed recipe that turns a parsed run config into a sharded, jitted step.

    eval_shape(init) -> logical shardings -> jit(init, out_shardings)
                     -> jit(train_step, in/out shardings, donate state)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import modules  # noqa: F401  (registers the layer library)
import trainer.data  # noqa: F401  (registers the data sources)
from modules.decoder import MODELS
from core.registry import ConfigError
from modules import attn_registry, quantization
from trainer import flops as flops_lib, offload, sharding
from trainer.config import RunConfig
from trainer.data.base import DATA, Source
from trainer.meshes import Entry
from trainer.optimizer import OPTIMIZERS, Optimizer
from trainer.param_axes import logical_axes
from trainer.step import TrainState, eval_step, init_params, init_state, train_step


# JAX's names for the programs (their compilation cache keys start with them): a resumed run
# does not load the initialisation's ahead, a second run loads it first and the steps' after it,
# in the order the start asks for them (trainer/compile_prefetch.py, trainer/early_init.py)
INIT_PROGRAM = "jit_initial_state"
STEP_PROGRAMS = ("jit_train_step", "jit_eval_step")


def compute_dtype(name: str, platform: str):
  if name == "auto":
    return jnp.float32 if platform == "cpu" else jnp.bfloat16
  return jnp.dtype(name)


@dataclasses.dataclass
class Experiment:
  run: RunConfig
  model: nn.Module
  optimizer: Optimizer
  source: Source
  mesh: Mesh
  rules: tuple
  abstract_state: Any  # TrainState of ShapeDtypeStructs (boxed with logical names)
  state_shardings: Any  # TrainState of NamedShardings
  batch_sharding: NamedSharding
  compute_dtype: Any
  eval_microbatches: int = 1  # device passes per eval batch (eval.microbatch_rows on this mesh)
  axes: Any = None  # the parameters' logical axes (trainer/param_axes.py): host offload's update

  @property
  def num_params(self) -> int:
    # Not nn.meta.unbox: under context() that would apply the boxes' sharding constraints.
    leaves = jax.tree.leaves(self.abstract_state.params,
                             is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
    return sum(math.prod(getattr(x, "value", x).shape) for x in leaves)

  @contextlib.contextmanager
  def context(self):
    """Mesh + logical rules, needed while tracing (activation constraints).

    jax.set_mesh (not `with mesh:`) defines the abstract mesh that flax's
    with_logical_constraint needs; without it every activation constraint is a no-op.
    """
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield self

  @functools.cached_property
  def init_fn(self):
    fn = functools.partial(init_state, model=self.model, optimizer=self.optimizer,
                           seq_len=self.source.seq_len)
    def initial_state(key):  # the program's name (INIT_PROGRAM): compile_prefetch.py
      return nn.meta.unbox(fn(key))
    return jax.jit(initial_state, out_shardings=self.state_shardings)

  @functools.cached_property
  def step_fn(self):
    fn = functools.partial(train_step, model=self.model, optimizer=self.optimizer,
                           compute_dtype=self.compute_dtype,
                           grad_accum_steps=self.run.trainer.grad_accum_steps,
                           skip_nonfinite=self.run.trainer.skip_nonfinite,
                           loss_chunk_size=self.run.trainer.loss_chunk_size,
                           z_loss=self.run.trainer.z_loss, axes=self.axes)
    replicated = NamedSharding(self.mesh, PartitionSpec())
    return jax.jit(fn, in_shardings=(self.state_shardings, self.batch_sharding),
                   out_shardings=(self.state_shardings, replicated), donate_argnums=0)

  @functools.cached_property
  def eval_fn(self):
    fn = functools.partial(eval_step, model=self.model, compute_dtype=self.compute_dtype,
                           loss_chunk_size=self.run.trainer.loss_chunk_size,
                           microbatches=self.eval_microbatches)
    return jax.jit(fn, in_shardings=(self.state_shardings.params, self.batch_sharding))

  def init(self) -> TrainState:
    # No logical rules here: the activation constraints would apply to init's dummy
    # batch of one; the parameters land in their shardings through out_shardings.
    return self.init_fn(jax.random.key(self.run.trainer.seed))

  def abstract_state_inputs(self) -> TrainState:
    """The state as ShapeDtypeStructs carrying their shardings: what the step is compiled for."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        nn.meta.unbox(self.abstract_state), self.state_shardings)

  def abstract_batch(self, local: dict, *, rows: int) -> dict:
    """A global batch of `rows` rows shaped like `local` (one process's rows), abstract."""
    return {k: jax.ShapeDtypeStruct((rows, *v.shape[1:]), v.dtype, sharding=self.batch_sharding)
            for k, v in local.items()}

  def global_batch(self, local: dict) -> dict:
    """Process-local numpy slices -> global arrays sharded over the batch axes."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local.items()}


def mesh_size(mesh: Mesh, rules, logical: str, *, but: str | None = None) -> tuple[str, int]:
  """(`mesh.axis=n x ...`, n): the mesh axes a logical axis maps to by `rules`, and their
  product; `but`: without the axes that logical axis maps to."""
  def axes_of(name):
    axes = nn.logical_to_mesh_axes((name,), rules)[0]
    return (axes,) if isinstance(axes, str) else tuple(axes or ())
  drop = axes_of(but) if but else ()
  axes = [a for a in axes_of(logical) if a not in drop]
  return (" x ".join(f"mesh.{a}={mesh.shape[a]}" for a in axes),
          math.prod(mesh.shape[a] for a in axes))


def check_parallel(run: RunConfig, source: Source, mesh: Mesh, rules):
  """Context parallelism (sequence positions over `act_length`'s axes) and pipeline stages
  (the layer stack over `layers`' axes) must split the sequence, layers and batch evenly."""
  seq, model = source.seq_len, run.model
  name, shards = mesh_size(mesh, rules, "act_length")
  if shards > 1:
    if seq % (2 * shards):
      raise ConfigError(f"{name} splits each sequence into 2 x {shards} chunks (the "
                        f"load-balanced layout, docs/parallelism.md): data.seq_len {seq} must be "
                        f"a multiple of {2 * shards}")
    try:
      for attention in dict.fromkeys(flops_lib.layer_attentions(model)):  # each kind of layer
        attn_registry.check_context(attention, length=seq, count=shards)
    except ConfigError as e:
      raise ConfigError(f"{name}: {e}") from None
  name, stages = mesh_size(mesh, rules, "layers")
  if stages > 1:
    layers = getattr(model, "num_layers", None)
    repeats = getattr(model, "repeats", layers)
    if not getattr(model, "scan_layers", False):
      raise ConfigError(f"{name} splits the scanned layer stack into pipeline stages, but "
                        f"model.scan_layers is False; set --config.model.scan_layers=true or "
                        f"mesh.stage=1")
    if repeats % stages:  # a block group's repeats stay whole (modules/block_group.py)
      of = layers if repeats == layers else f"{repeats} (its block group's repeats)"
      raise ConfigError(f"{name} must divide model.num_layers={layers} into equal pipeline "
                        f"stages; pick a divisor of {of}")
    micro = getattr(model, "pipeline_microbatches", 0) or stages
    # Inside the stages a microbatch's rows split over the batch axes other than the stages'.
    _, batch_shards = mesh_size(mesh, rules, "act_batch", but="layers")
    for what, batch in (("data.batch_size / trainer.grad_accum_steps",
                         source.batch_size // run.trainer.grad_accum_steps),
                        ("eval.batch_size", run.eval.batch_size)):
      if batch % micro or (batch // micro) % batch_shards:
        raise ConfigError(f"the pipeline cuts each batch of {batch} rows ({what}) into {micro} "
                          f"microbatches (model.pipeline_microbatches; 0 = stages), each "
                          f"divisible by the {batch_shards} batch shards of the mesh; change "
                          f"the batch size or model.pipeline_microbatches")


def unbox_empty(tree: Any) -> Any:
  """`tree` with every box that holds no array replaced by its contents.

  An optimizer whose parts own different parameters (muon: its Newton-Schulz part the
  matrices, its Adam part the rest) keeps, in each part's state, optax's `MaskedNode` (or
  None) in place of the parameters another part owns. optax builds that state by mapping over
  the boxed parameters, so such a hole arrives boxed with the parameter's axis names: a box
  without an array, which would still get a sharding, and then the shardings would have a leaf
  where the unboxed state has none (every leaf-by-leaf walk of the two would go astray).
  Unboxed, a hole is an empty subtree in both.
  """
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  return jax.tree.map(lambda x: x.unbox() if is_box(x) and not jax.tree.leaves(x.unbox()) else x,
                      tree, is_leaf=is_box)


def microbatches(rows: int, *, shards: int, per_device: int, what: str) -> int:
  """Microbatches of `per_device` rows on each of `shards` batch shards in a batch of `rows`
  rows (1 where a device's share is no larger); ConfigError unless they split evenly."""
  share = rows // shards
  if per_device <= 0 or share <= per_device:
    return 1
  if share % per_device:
    raise ConfigError(f"{what}={per_device}: a batch of {rows} rows over {shards} batch shards "
                      f"is {share} rows per device, not a multiple of {per_device}")
  return share // per_device


def resolve_microbatches(run: RunConfig, source: Source, batch_sharding) -> tuple[RunConfig, int]:
  """`run` with trainer.grad_accum_steps as trainer.microbatch_rows sets it on this mesh (its
  batch shards), and the eval batch's passes; both checked to split the batches evenly."""
  shards = sharding.num_shards(batch_sharding, dim=0)
  over = sharding.describe_axes(batch_sharding, dim=0)
  t, batch = run.trainer, source.batch_size
  if batch % shards:
    raise ConfigError(f"data.batch_size {batch} is not divisible by the {shards} batch shards of "
                      f"the mesh ({over}); change the batch size or --config.mesh.*")
  if t.microbatch_rows:
    accum = microbatches(batch, shards=shards, per_device=t.microbatch_rows,
                         what="trainer.microbatch_rows")
    if t.grad_accum_steps not in (1, accum):
      raise ConfigError(f"trainer.microbatch_rows={t.microbatch_rows} makes grad_accum_steps "
                        f"{accum} on this mesh, but trainer.grad_accum_steps is "
                        f"{t.grad_accum_steps}; set one of them (the other 0 / 1)")
    run = dataclasses.replace(run, trainer=dataclasses.replace(t, grad_accum_steps=accum))
  accum = run.trainer.grad_accum_steps
  if batch % accum or (batch // accum) % shards:
    raise ConfigError(f"data.batch_size {batch} must split into trainer.grad_accum_steps="
                      f"{accum} microbatches, each divisible by the {shards} batch shards of the "
                      f"mesh ({over}); change the batch size, grad_accum_steps or --config.mesh.*")
  chunk = run.trainer.loss_chunk_size
  if chunk and source.seq_len % chunk:
    raise ConfigError(f"trainer.loss_chunk_size {chunk} must divide data.seq_len "
                      f"{source.seq_len}; pick a divisor or 0 (no chunking)")
  if run.eval.batch_size % shards:
    raise ConfigError(f"eval.batch_size {run.eval.batch_size} is not divisible by the {shards} "
                      f"batch shards of the mesh ({over}); change eval.batch_size or "
                      f"--config.mesh.*")
  return run, microbatches(run.eval.batch_size, shards=shards, per_device=run.eval.microbatch_rows,
                           what="eval.microbatch_rows")


def count_params(run: RunConfig) -> int:
  """Parameters of `run`'s model, from abstract shapes (no devices, no mesh)."""
  model = MODELS.build(run.model)
  params = jax.eval_shape(functools.partial(init_params, model=model, seq_len=run.data.seq_len),
                          jax.random.key(0))
  leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  return sum(math.prod(getattr(x, "value", x).shape) for x in leaves)


def build(run: RunConfig, entry: Entry, devices=None, *,
          platform: str | None = None) -> Experiment:
  """Builds everything and checks shapes against the mesh; nothing is allocated or compiled.
  `platform`: whose compute dtype the steps take ("auto": float32 on cpu), the devices' own
  unless given (a plan's CPU devices standing in for an entry's chips)."""
  devices = jax.devices() if devices is None else devices
  quantization.check_hardware(run.model.quantization, entry.hardware, mesh=entry.name)
  model = MODELS.build(run.model)
  source = DATA.build(run.data, vocab_size=run.model.vocab_size, seed=run.trainer.seed)
  params = jax.eval_shape(functools.partial(init_params, model=model, seq_len=source.seq_len),
                          jax.random.key(0))
  axes = logical_axes(params)
  optimizer = OPTIMIZERS.build(run.optimizer, total_steps=run.trainer.max_steps, axes=axes)
  if source.vocab_size > run.model.vocab_size:
    raise ConfigError(f"data emits token ids up to {source.vocab_size - 1} but model.vocab_size "
                      f"is {run.model.vocab_size}; raise model.vocab_size")
  mesh = sharding.make_mesh(sharding.resolve_axes(entry, run.mesh, len(devices)), devices)
  rules = entry.rules
  check_parallel(run, source, mesh, rules)
  abstract = unbox_empty(jax.eval_shape(functools.partial(
      init_state, model=model, optimizer=optimizer, seq_len=source.seq_len), jax.random.key(0)))
  state_shardings = sharding.logical_shardings(abstract, mesh, rules)
  sharding.check_divisible(abstract, state_shardings, what="parameter")
  if run.trainer.state_memory == "host" and not offload.supports_host(devices[0]):
    raise ConfigError(f"trainer.state_memory=host: {devices[0].device_kind} devices have no "
                      f"host memory kind ({offload.HOST_MEMORY}) in this JAX; use 'device'")
  state_shardings = offload.place(state_shardings, run.trainer.state_memory)
  batch_sharding = sharding.batch_sharding(mesh, rules)
  run, eval_microbatches = resolve_microbatches(run, source, batch_sharding)
  return Experiment(run=run, model=model, optimizer=optimizer, source=source, mesh=mesh,
                    rules=rules, abstract_state=abstract, state_shardings=state_shardings,
                    batch_sharding=batch_sharding, eval_microbatches=eval_microbatches, axes=axes,
                    compute_dtype=compute_dtype(run.trainer.compute_dtype,
                                                platform or devices[0].platform))
