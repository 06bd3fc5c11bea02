"""Analytic model FLOPs of one training token, read from the parameters' logical axis names.

    flops/token = 6 * N_matmul + 12 * sum_layers(heads * head_dim) * keys_per_query

`N_matmul` is the number of parameters a token multiplies through (forward 2,
backward 4 FLOPs each): every weight with an `embed` axis and at least two
axes (layer stacks aside), the LM head included, lookup tables excluded. A
lookup table is `[vocab or unnamed, embed]` (token and learned position
embeddings); with tied embeddings (no `[embed, vocab]` head) the token table is
the head and counts once. Weights with an `experts` axis count `top_k /
num_experts` of their size, since each token visits `top_k` experts (capacity
padding and dropped tokens aside). Weights with a `vocab` axis count the real
vocabulary, not the padded one (modules/decoder.py: vocab_multiple): the pad
columns' FLOPs are overhead, like capacity padding. Biases and norm scales do no
matmul and are not counted.

The attention term is the PaLM convention (Chowdhury et al. 2022, appendix B):
QK^T and AV over the full `seq_len` x `seq_len` square, forward and backward;
causal masking is NOT halved out. With a sliding window each query's keys are
the window's: `keys_per_query` is min(sliding_window, seq_len)
(modules/masks.py:Spec.span), `seq_len` without one; a layer pattern's layers each
count their own (its mean over the layers, weighted by their query widths). Query projections are found
by their axes (`projection_widths`): `embed` first, then `heads`, `head_dim`, or fused with
keys and values `kv_heads`, `qkv`, `head_dim`.

Nothing here names a layer, so a new layer needs no edit as long as its weights
carry logical axis names.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax

from modules import block_group, masks


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlopCount:
  matmul_params: float  # parameters used per token in matmuls (experts scaled by top_k/E)
  attention_width: int  # sum over layers of heads * head_dim (query projections)
  seq_len: int
  keys_per_query: float  # keys each query attends to: seq_len, or min(window, seq_len), the
  # mean over layers of a layer pattern (trainer/flops.py:over_layers)

  @property
  def per_token(self) -> float:
    return 6 * self.matmul_params + 12 * self.attention_width * self.keys_per_query


def named_leaves(params):
  """[(names, shape)] of boxed parameters (flax LogicallyPartitioned / Partitioned)."""
  leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  out = []
  for leaf in leaves:
    if not isinstance(leaf, nn.meta.AxisMetadata):
      raise ValueError("model FLOPs need parameters boxed with logical axis names "
                       "(the abstract state of trainer.experiment, before unboxing)")
    out.append((tuple(leaf.names), tuple(leaf.value.shape)))
  return out


def without_layers(names, shape):
  """(names, shape, stacked layer count) with the `layers` axis taken out."""
  if "layers" in names:
    i = names.index("layers")
    return names[:i] + names[i + 1:], shape[:i] + shape[i + 1:], shape[i]
  return names, shape, 1


def projection_widths(names, shape) -> tuple[int, int]:
  """(query width heads * head_dim, key + value width 2 * kv_heads * head_dim) of an attention
  projection, found by its axes (its layer axis taken out): a query projection `embed, heads,
  head_dim`, a key or value one `embed, kv_heads, head_dim` (half the pair), q/k/v fused
  (attention.fused_qkv) `embed, kv_heads, qkv, head_dim`, whose `qkv` axis holds each kv head's
  query heads, then its key and value; (0, 0) for any other parameter."""
  size = dict(zip(names, shape))
  if names == ("embed", "heads", "head_dim"):
    return size["heads"] * size["head_dim"], 0
  if names == ("embed", "kv_heads", "head_dim"):
    return 0, size["kv_heads"] * size["head_dim"]
  if names == ("embed", "kv_heads", "qkv", "head_dim"):
    per_head = size["kv_heads"] * size["head_dim"]
    return per_head * (size["qkv"] - 2), 2 * per_head
  return 0, 0


def count(params, *, seq_len: int, top_k: int | None = None, vocab_size: int | None = None,
          keys_per_query: float | None = None) -> FlopCount:
  """The FLOP model's inputs from boxed (abstract) parameters; `vocab_size`: the real
  vocabulary when the `vocab` axis is padded (None: the axis as it is); `keys_per_query`: the
  keys each query attends to (None: seq_len)."""
  matmul, width, tables, has_head = 0.0, 0, [], False
  for names, shape in named_leaves(params):
    names, shape, layers = without_layers(names, shape)
    size = math.prod(shape) * layers
    if vocab_size is not None and "vocab" in names:
      size = size * vocab_size / shape[names.index("vocab")]
    if len(names) == 2 and names[1] == "embed" and names[0] in ("vocab", None):
      tables.append((names, size))
      continue
    if "embed" not in names or len(names) < 2:
      continue  # biases, norm scales
    if "vocab" in names:
      has_head = True
    if "experts" in names:
      experts = shape[names.index("experts")]
      if top_k is None:
        raise ValueError("parameters have an 'experts' axis: pass top_k")
      size = size * top_k / experts
    matmul += size
    width += layers * projection_widths(names, shape)[0]
  if not has_head:
    matmul += sum(size for names, size in tables if names[0] == "vocab")
  return FlopCount(matmul_params=matmul, attention_width=width, seq_len=seq_len,
                   keys_per_query=seq_len if keys_per_query is None else keys_per_query)


def find_field(node, name: str):
  """The first value of dataclass field `name` anywhere under `node` (None if absent)."""
  if dataclasses.is_dataclass(node):
    for f in dataclasses.fields(node):
      value = getattr(node, f.name)
      if f.name == name:
        return value
      found = find_field(value, name)
      if found is not None:
        return found
  elif isinstance(node, (tuple, list)):
    for item in node:
      found = find_field(item, name)
      if found is not None:
        return found
  return None


def model_flops_per_token(run, abstract_params) -> float:
  """Training FLOPs (forward + backward) per token of `run` (a trainer.config.RunConfig).

  `abstract_params`: the boxed parameter tree, e.g. `Experiment.abstract_state.params`.
  Multiply by tokens per step (`data.batch_size * data.seq_len`) for FLOPs per step.
  """
  seq_len = run.data.seq_len
  return count(abstract_params, seq_len=seq_len, top_k=find_field(run.model, "top_k"),
               vocab_size=find_field(run.model, "vocab_size"),
               keys_per_query=over_layers(run.model, lambda spec: spec.span(seq_len))).per_token


def layer_attentions(model) -> list:
  """The attention config of each attention layer of a parsed model config, in order: a block
  group's layers each their own (modules/block_group.py)."""
  block = getattr(model, "block", None)
  blocks = [model] if block is None else block_group.layer_blocks(block, model.num_layers)
  return [a for a in (find_field(b, "attention") for b in blocks) if a is not None]


def layer_masks(model) -> list[tuple[masks.Spec, int]]:
  """(mask options, query width heads x head_dim) of each attention layer of a parsed model
  config, in order."""
  dim = getattr(model, "dim", None)
  out = []
  for attention in layer_attentions(model):
    h, _, k = attention.heads(dim) if dim else (1, 1, 1)
    out.append((masks.Spec.of(attention), h * k))
  return out or [(masks.Spec(), 1)]


def over_layers(model, value) -> float:
  """`value(mask options)` averaged over a parsed model config's attention layers, weighted by
  their query width (a sliding-window layer's keys per query against a full layer's)."""
  layers = layer_masks(model)
  return sum(w * value(spec) for spec, w in layers) / sum(w for _, w in layers)
