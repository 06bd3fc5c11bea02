"""The analytic memory model: per-device bytes and HBM traffic of a train step, without compiling.

Parameter and optimizer-state bytes are exact (abstract shapes under their shardings); gradients,
activations (by remat policy) and logits are a model read from the parameters' logical axis
names. `axtrain plan` (planner/plan.py) bases the fit on it where no compiler of the target
runs (Trainium entries) and shows it next to the TPU and GPU compilers' figures;
`axtrain plan --sweep` screens candidates with it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
from jax.sharding import NamedSharding

from modules import attn_registry
from trainer import checkpoint_blocks as blocks, checkpoint_bounded, experiment as experiment_lib
from trainer import flops as flops_lib, offload
from trainer import sharding


def _sharded_bytes(abstract_tree, shardings) -> int:
  """Bytes one device holds of a tree of ShapeDtypeStructs under its NamedShardings."""
  leaves = jax.tree.leaves(abstract_tree)
  shards = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  return sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
             for a, s in zip(leaves, shards))


def _batch_shards(exp) -> int:
  """Devices the batch is split over: the mesh axes the rules give `batch` (data, fsdp, expert)."""
  return sharding.num_shards(exp.batch_sharding, dim=0)


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
    query, keys_values = flops_lib.projection_widths(names, shape)
    if query:  # one query projection per layer (alone or fused with k and v)
      layers += n
      q += n * query
      heads += n * query // size["head_dim"]
    kv += n * keys_values  # k and v
    if names[:1] == ("embed",) and "mlp" in names:  # ffn gate / up projections (or both fused)
      mlp += n * size["mlp"] * size.get("gate_up", 1) * (top_k if "experts" in size else 1)
  per = max(layers, 1)
  return Shape(layers=layers, dim=dim, mlp=mlp // per, q_width=q // per,
               kv_width=kv // (2 * per), heads=heads // per, vocab=vocab)


# Per token and layer, bytes kept for the backward pass under each remat policy (c: bytes of
# the compute dtype; heads and mlp widths split over the `model` axis, the residual stream
# not). A rough model (after Korthikanti et al. 2022, without dropout); the TPU compiler's
# figures replace it where they exist. `scores`: the share of the [queries, keys] attention
# logits held (scores_share).
def _saved_per_token_layer(policy: str, s: Shape, c: int, seq_len: int, model: int,
                           scores: float = 1.0) -> float:
  q, kv, mlp, heads = s.q_width / model, s.kv_width / model, s.mlp / model, s.heads / model
  matmul_outputs = c * (q + 2 * kv + s.dim + mlp + s.dim)
  attention_scores = (4 + c) * heads * seq_len * scores  # float32 scores + probabilities
  everything = c * (4 * s.dim + 2 * q + 2 * kv + 2 * mlp) + attention_scores
  return {
      "none": everything,
      "full": c * s.dim,  # the layer's input
      "dots_saveable": c * s.dim + matmul_outputs + c * heads * seq_len * scores,
      "dots_with_no_batch_dims_saveable": c * s.dim + matmul_outputs,
      "save_qkv_proj": c * (s.dim + q + 2 * kv),
      "save_attn_out": c * (s.dim + 2 * q + 2 * kv),
      # The rest goes to host memory: on the device the layer's input, as under full remat.
      "offload_dots_with_no_batch_dims": c * s.dim,
      "offload_attn_out": c * s.dim,
  }.get(policy, c * (s.dim + 2 * q + 2 * kv))


def scores_share(run, length: int) -> tuple[float, float, float]:
  """Shares of the whole [queries, keys] attention logits that the model's attention
  implementation (modules/attn_registry.py) holds, for `length` queries per row: (kept for the
  backward pass, held during one layer's pass, moved to and from HBM). `xla` and `dot_product`
  write them all; `chunked` keeps none (each block of query_chunk_size queries is recomputed)
  and holds one block; a Pallas kernel (`splash`, `pallas_hd64`: one that declares the platform
  it is compiled for, attn_registry.Supports.native) keeps them in on-chip memory."""
  attention = flops_lib.find_field(run.model, "attention")
  implementation = getattr(attention, "implementation", "xla")
  if attn_registry.IMPLEMENTATIONS.get(implementation).supports.native is not None:
    return 0.0, 0.0, 0.0
  chunk = getattr(attention, "query_chunk_size", 0)
  if implementation == "chunked" and 0 < chunk < length and length % chunk == 0:
    return 0.0, chunk / length, 1.0
  return 1.0, 1.0, 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Split:
  """How one device's share of a microbatch comes out of the mesh (per gradient-accumulation
  microbatch): its rows, positions per row (context parallelism), layers (pipeline stages)."""
  rows: int  # sequences whose positions this device holds in the layers (per microbatch)
  head_rows: int  # the same in the LM head and loss (pipeline stages split the batch there)
  positions: int  # positions of each row on this device: seq_len / context shards
  seq_len: int
  stages: int  # pipeline stages (1: none)
  layers: int  # decoder layers, all stages together
  microbatches: int  # pipeline microbatches per accumulation microbatch (1: no pipeline)
  model: int  # tensor-parallel shards

  @property
  def tokens(self) -> int:
    return self.rows * self.positions

  @property
  def ticks_per_microbatch(self) -> float:
    """A stage's passes over its layers per pipeline microbatch, the bubble included:
    (M + S - 1) / M; 1 without stages."""
    return (self.microbatches + self.stages - 1) / self.microbatches


def split(exp: experiment_lib.Experiment) -> Split:
  run = exp.run
  mesh = dict(exp.mesh.shape)
  accum = run.trainer.grad_accum_steps
  _, batch_shards = experiment_lib.mesh_size(exp.mesh, exp.rules, "act_batch")
  _, layer_shards = experiment_lib.mesh_size(exp.mesh, exp.rules, "act_batch", but="layers")
  _, context = experiment_lib.mesh_size(exp.mesh, exp.rules, "act_length")
  _, stages = experiment_lib.mesh_size(exp.mesh, exp.rules, "layers")
  micro = (getattr(run.model, "pipeline_microbatches", 0) or stages) if stages > 1 else 1
  rows = max(exp.source.batch_size // accum // layer_shards, 1)
  head_rows = max(exp.source.batch_size // accum // batch_shards, 1)
  return Split(rows=rows, head_rows=head_rows, positions=exp.source.seq_len // context,
               seq_len=exp.source.seq_len,
               stages=stages, layers=getattr(run.model, "num_layers", 0), microbatches=micro,
               model=mesh.get("model", 1))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Analytic:
  """Per-device bytes by the analytic model (labelled `model` in the report)."""
  params: int  # exact: sharded parameter bytes
  opt_state: int  # exact: sharded optimizer-state bytes
  grads: int  # float32 gradients (and the accumulator under gradient accumulation)
  activations: int  # saved for the backward pass, plus one layer's working set under remat
  logits: int  # LM-head logits and their float32 loss buffers (one chunk with chunking)
  # trainer.state_memory="host" (trainer/offload.py): the float32 parameters and the optimizer
  # state live in host memory (`host`, exact); on the device, `params` is their compute-dtype
  # copy and `opt_state` one piece in flight.
  host: int = 0

  @property
  def total(self) -> int:
    """Device bytes."""
    return self.params + self.opt_state + self.grads + self.activations + self.logits


@dataclasses.dataclass(frozen=True, kw_only=True)
class StateBytes:
  """The train state's float32 parameters and optimizer state, bytes per device (exact)."""
  params: int
  opt_state: int

  @property
  def total(self) -> int:
    return self.params + self.opt_state


def state_bytes(exp: experiment_lib.Experiment) -> StateBytes:
  abstract = nn_unbox(exp.abstract_state)
  return StateBytes(params=_sharded_bytes(abstract.params, exp.state_shardings.params),
                    opt_state=_sharded_bytes(abstract.opt_state, exp.state_shardings.opt_state))


def _param_shards(exp: experiment_lib.Experiment):
  """(global bytes, one device's shard bytes) of each parameter (its optimizer state's are
  alike)."""
  abstract = nn_unbox(exp.abstract_state)
  for a, sh in zip(jax.tree.leaves(abstract.params), jax.tree.leaves(
      exp.state_shardings.params, is_leaf=lambda x: isinstance(x, NamedSharding))):
    item = a.dtype.itemsize
    yield math.prod(a.shape) * item, math.prod(sh.shard_shape(a.shape)) * item


def _largest_param_shard(exp: experiment_lib.Experiment) -> int:
  """Bytes of one device's shard of the largest parameter."""
  return max((shard for _, shard in _param_shards(exp)), default=0)


def checkpoint_batches(exp: experiment_lib.Experiment, devices_per_host: int,
                       platform: str) -> tuple[int, int]:
  """(save, restore): host bytes of a state in host memory that a checkpoint save holds in host
  RAM at once on one host, and that a restore reads at once; never more than the host's state
  (trainer/checkpoint_bounded.py, trainer/checkpoint_blocks.py). A shard replicated on the host
  is written and read once.
  - A save copies arrays in batches of HOST_STATE_SAVE_GB (an array larger than that alone, all
    its shards on the host), but writes an array whose shards are larger than
    HOST_STATE_BLOCK_BYTES a block of rows at a time, all of a save's such arrays sharing a few
    blocks (`blocks_at_once`); on a host whose device memory cannot hold a copy of the shard,
    the save copies it whole instead, which this does not count (between steps it can).
  - A restore holds reads of fewer than HOST_STATE_READ_BYTES at once, all its arrays together,
    or one larger shard read whole alone; off CPU a shard larger than
    HOST_STATE_READ_BLOCK_BYTES is read a block of rows at a time under that budget (a smaller
    one whole, under it too)."""
  save = int(checkpoint_bounded.HOST_STATE_SAVE_GB * 1e9)
  restore = blocks.HOST_STATE_READ_BYTES
  block = 0
  abstract = nn_unbox(exp.abstract_state)
  for a, sh in zip(jax.tree.leaves(abstract.params), jax.tree.leaves(
      exp.state_shardings.params, is_leaf=lambda x: isinstance(x, NamedSharding))):
    item, shape = a.dtype.itemsize, tuple(sh.shard_shape(a.shape))
    shard = math.prod(shape) * item
    row = shard // shape[0] if shape else shard
    on_host = min(math.prod(a.shape) * item, shard * devices_per_host)
    rows = blocks.block_rows(shape, item, blocks.HOST_STATE_BLOCK_BYTES)
    if rows:
      block = max(block, rows * row)
    else:
      save = max(save, on_host)
    if (platform in blocks.HOST_VIEW_PLATFORMS
        or not blocks.block_rows(shape, item, blocks.HOST_STATE_READ_BLOCK_BYTES)):
      restore = max(restore, shard)
  save = max(save, block * blocks.blocks_at_once())
  state = state_bytes(exp).total * devices_per_host
  return min(state, save), min(state, restore)


def analytic_memory(exp: experiment_lib.Experiment, *, compute_bytes: int) -> Analytic:
  run = exp.run
  abstract = nn_unbox(exp.abstract_state)
  params = _sharded_bytes(abstract.params, exp.state_shardings.params)
  opt_state = _sharded_bytes(abstract.opt_state, exp.state_shardings.opt_state)
  accum = run.trainer.grad_accum_steps
  host = 0
  if run.trainer.state_memory == "host":
    # On the device: the compute-dtype weights, the float32 gradient sum beside each
    # microbatch's compute-dtype gradients, and the state of one piece of one parameter at a
    # time (trainer/offload.py), in and out.
    host = params + opt_state
    largest = _largest_param_shard(exp)
    piece = min(largest, offload.PIECE_BYTES) * (1 + opt_state // max(params, 1)) * 2
    grads = params + (params * compute_bytes // 4 if accum > 1 else 0)
    params, opt_state = params * compute_bytes // 4, piece
  else:
    grads = params * (2 if accum > 1 else 1)
  shape = model_shape(exp.abstract_state.params, top_k=flops_lib.find_field(run.model, "top_k"))
  sp = split(exp)
  seq, tokens, model = sp.seq_len, sp.tokens, sp.model
  policy = getattr(run.model, "remat", "none")
  kept, held, _ = scores_share(run, sp.positions)
  # A stage saves its own layers for every tick of the pipeline: (M + S - 1) / M microbatches'
  # worth; attention scores span the whole sequence (keys gathered under context parallelism).
  saved = (_saved_per_token_layer(policy, shape, compute_bytes, seq, model, kept) * shape.layers
           / sp.stages * sp.ticks_per_microbatch)
  if policy != "none":  # one layer's recompute at a time
    saved += (_saved_per_token_layer("none", shape, compute_bytes, seq, model, held)
              / sp.microbatches)
  if sp.stages > 1:  # the pipeline's inputs and outputs of every microbatch
    saved += 2 * compute_bytes * shape.dim
  activations = int(tokens * saved)
  chunk = run.trainer.loss_chunk_size
  vocab = shape.vocab // (model if shape.vocab % model == 0 else 1)
  logit_tokens = sp.head_rows * (chunk * sp.positions // seq if chunk else sp.positions)
  # bf16 logits and their gradient for every token (unchunked), float32 logits, softmax
  # and gradient for the tokens in flight.
  logits = int(logit_tokens * vocab * (2 * compute_bytes + 12))
  return Analytic(params=params, opt_state=opt_state, grads=grads, activations=activations,
                  logits=logits, host=host)


def hbm_traffic(exp: experiment_lib.Experiment, analytic: Analytic, *, compute_bytes: int) -> float:
  """Bytes one device moves to and from HBM per step (a model, labelled so).

  Per microbatch: the gathered weights read once per pass (forward, the recompute under
  remat, backward), saved activations written and read once, the attention scores written
  and read in every pass (not by a kernel: scores_share); per step: the optimizer reads parameters, gradients and state and
  writes parameters and state.
  """
  run = exp.run
  params = exp.abstract_state.params
  top_k = flops_lib.find_field(run.model, "top_k")
  shape = model_shape(params, top_k=top_k)
  accum = run.trainer.grad_accum_steps
  sp = split(exp)
  seq, tokens = sp.seq_len, sp.tokens
  remat = getattr(run.model, "remat", "none")
  passes = 3 if remat == "none" else 4
  weights = flops_lib.count(params, seq_len=seq, top_k=top_k).matmul_params
  # A stage reads its own layers' weights in every tick of every pipeline microbatch.
  per_micro = passes * compute_bytes * weights / sp.model / sp.stages * (
      sp.microbatches + sp.stages - 1)
  per_micro += 2 * analytic.activations
  per_micro += passes * tokens * shape.layers / sp.stages * sp.ticks_per_microbatch * (
      4 + compute_bytes) * (shape.heads / sp.model) * seq * scores_share(run, sp.positions)[2]
  optimizer = 2 * (analytic.params + analytic.opt_state) + analytic.grads
  return accum * per_micro + optimizer


def eval_memory(exp: experiment_lib.Experiment, *, compute_bytes: int) -> int:
  """The eval step's bytes per device by the same model: the parameters, one layer's working
  set and the logits (compute dtype and float32, and the float32 log-softmax) of the tokens of
  one pass on the device (exp.eval_microbatches passes per eval batch: eval.microbatch_rows)."""
  run = exp.run
  params = _sharded_bytes(nn_unbox(exp.abstract_state).params, exp.state_shardings.params)
  shape = model_shape(exp.abstract_state.params, top_k=flops_lib.find_field(run.model, "top_k"))
  sp = split(exp)
  _, batch_shards = experiment_lib.mesh_size(exp.mesh, exp.rules, "act_batch")
  rows = max(run.eval.batch_size // batch_shards // exp.eval_microbatches, 1)
  layer = _saved_per_token_layer("none", shape, compute_bytes, sp.seq_len, sp.model,
                                 scores_share(run, sp.positions)[1])
  chunk = run.trainer.loss_chunk_size
  positions = chunk * sp.positions // sp.seq_len if chunk else sp.positions
  vocab = shape.vocab // (sp.model if shape.vocab % sp.model == 0 else 1)
  return int(params + rows * sp.positions * layer + rows * positions * vocab * (compute_bytes + 8))


def nn_unbox(tree):
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  return nn.meta.unbox(tree)
