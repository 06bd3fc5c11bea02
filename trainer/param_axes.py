"""What a parameter is, read from its logical axis names (never from its rank).

Every parameter of the layer library carries logical axis names (flax
`nn.with_logical_partitioning`); the optimizer decides weight decay and Muon from them:

  stack axes   `layers` (nn.scan's stack) and `experts` index copies of one parameter;
               they are set aside, so a scanned and an unrolled stack decide alike. They
               lead a parameter's axes; a statistic over a parameter (a norm, an RMS) is
               taken per copy (stack_depth, trainer/optimizer.py:per_layer).
  spaces       the remaining axes, grouped into the vector spaces they index. Each axis is
               its own space, except those in SPACE_OF: `heads`, `kv_heads`, `head_dim` (and
               a fused q/k/v kernel's `qkv`) together index the attention space, `mlp` and a
               fused gate/up kernel's `gate_up` the MLP's. An unnamed axis (None) is a space
               of its own.
  weight       a parameter whose axes span at least two spaces: it maps one space to another
               (q `embed -> heads x head_dim`, wo `mlp -> embed`, router `embed -> None`).
               Norm scales (`norm`) and biases (`embed`, `mlp`, `heads x head_dim`) span one.
  embedding    a weight that is a lookup table: `embed` last, every other axis in LOOKUP_AXES
               (token table `vocab x embed`, learned positions `None x embed`). The LM head
               `embed x vocab` is a projection, not a table.

A new layer needs no edit here as long as its parameters follow the flax kernel layout
(input axes, then output axes) and name their axes; an axis that splits one space over
several axes (as heads x head_dim do) goes into SPACE_OF.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax

STACK_AXES = frozenset({"layers", "experts"})
SPACE_OF = {"heads": "attention", "kv_heads": "attention", "head_dim": "attention",
            "qkv": "attention", "gate_up": "mlp"}
LOOKUP_AXES = ("vocab", None)


@dataclasses.dataclass(frozen=True)
class ParamAxes:
  """The logical axis names of one parameter (a pytree leaf, unlike a tuple)."""
  names: tuple[str | None, ...]

  def spaces(self) -> list[tuple[int, ...]]:
    """Positions of the non-stack axes, grouped by the space they index, in order."""
    groups: dict[Any, list[int]] = {}
    for i, name in enumerate(self.names):
      if name in STACK_AXES:
        continue
      key = ("unnamed", i) if name is None else SPACE_OF.get(name, name)
      groups.setdefault(key, []).append(i)
    return [tuple(g) for g in groups.values()]

  def stack_depth(self) -> int:
    """How many leading axes are stack axes: the copies that a statistic over the parameter
    (a norm, an RMS) keeps apart (trainer/optimizer.py:per_layer). ValueError where a stack
    axis follows another axis."""
    depth = 0
    while depth < len(self.names) and self.names[depth] in STACK_AXES:
      depth += 1
    if any(name in STACK_AXES for name in self.names[depth:]):
      raise ValueError(f"a parameter with axes {self.names} has a stack axis "
                       f"({', '.join(sorted(STACK_AXES))}) after another axis; stack axes lead")
    return depth

  @property
  def is_weight(self) -> bool:
    return len(self.spaces()) >= 2

  @property
  def is_embedding(self) -> bool:
    inner = [n for n in self.names if n not in STACK_AXES]
    return self.is_weight and inner[-1] == "embed" and all(n in LOOKUP_AXES for n in inner[:-1])

  @property
  def uses_muon(self) -> bool:
    """Muon orthogonalizes hidden weights; embeddings and the vocab projection stay on Adam."""
    return self.is_weight and not self.is_embedding and "vocab" not in self.names

  def muon_axes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(reduction axes, output axes): the first space is the input, the rest the output."""
    first, *rest = self.spaces()
    return first, tuple(i for group in rest for i in group)


def logical_axes(params) -> Any:
  """Boxed (nn.Partitioned) parameters -> the same tree, unboxed, of ParamAxes leaves."""
  def names(path, leaf):
    if not isinstance(leaf, nn.Partitioned):
      raise ValueError(f"parameter {jax.tree_util.keystr(path)} has no logical axis names; "
                       f"declare them with nn.with_logical_partitioning")
    return ParamAxes(tuple(leaf.names))
  return jax.tree_util.tree_map_with_path(
      names, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def decay_mask(axes, *, decay_embeddings: bool) -> Any:
  """True where weight decay applies: weights, embeddings only if `decay_embeddings`."""
  return jax.tree.map(lambda a: a.is_weight and (decay_embeddings or not a.is_embedding), axes)
