"""Layer patterns: a `block` of kind `group` is a repeating group of named blocks.

A model's layers need not all be the same layer: Gemma 2 alternates local (sliding-window)
and global attention, Gemma 3 runs 5 local layers to 1 global, Llama 4 and DeepSeek mix dense
and MoE layers. A group names its blocks once (`blocks`, {name: block node}) and lists the
group's layers by name (`pattern`); the decoder (modules/decoder.py) repeats the group
`model.num_layers / len(pattern)` times, scanning over the repeats with the whole group as
the scan's body, so the compiled program does not grow with depth. E.g. dense then MoE:

    block = registry("block").node("group", pattern=("dense", "moe"), blocks={
        "dense": <a pre_norm node with an mlp ffn>, "moe": <one with a moe ffn>})

    --config.model.block.blocks.moe.ffn.num_experts=16     # every MoE layer of the group
    --config.model.block.blocks.dense.kind=parallel         # a member switched like any child

Each position of the pattern is a layer of its own (its own parameters, named
`<name>_<position>`: `layers/block/dense_0`, `layers/block/moe_1`), stacked over the repeats
on the `layers` axis as a plain stack's layers are, so sharding rules, pipeline stages (which
split the repeats), optimizer statistics per layer and the FLOP count read them unchanged.
Layer r * len(pattern) + j of the model is repeat r of position j: `per_layer` and
`per_repeat` convert between that order and the stack (Hugging Face maps see one block's
parameters per layer, as for a plain stack).

A depth that is no multiple of the pattern's length is refused, unless `remainder` is `first`:
then R = num_layers // len(pattern) whole repeats are followed by the pattern's first
k = num_layers % len(pattern) layers, as Hugging Face lays out Gemma 3 (every sixth layer
global: 26 layers = 4 x (5 local, 1 global) + 2 local). The repeats stay one scan; the
remainder (`remainder`: a group of the pattern's first k layers, each its own parameters,
`layers_remainder/block/<name>_<position>`) runs once after them, so the compiled program grows
by k layers, not by the depth. Layer i of the model is position i % len(pattern) either way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import flax.linen as nn

from modules.block import BLOCKS
from core.registry import REQUIRED, ConfigError, child_map, members, suggest

_HOW = ("named block nodes, which a config file sets: registry('block').node('group', "
        "pattern=('dense', 'moe'), blocks={'dense': ..., 'moe': ...}); see modules/block_group.py")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockGroupConfig:
  kind: str = "group"
  # The group's layers in order, each a name of `blocks`, e.g. ("sliding",) * 5 + ("full",);
  # model.num_layers must be a multiple of its length (the group's repeats), but see remainder
  pattern: tuple[str, ...] = REQUIRED
  blocks: Any = child_map("block", how=_HOW)  # {name: block node}: the kinds of layer
  # Layers past the last whole repeat (model.num_layers % len(pattern)): none = refused; first =
  # the pattern's first layers, after the repeats (Hugging Face's Gemma 3: 26 = 4 x 6 + 2)
  remainder: Literal["none", "first"] = "none"

  @property
  def depth(self) -> int:
    """Layers per repeat of the group (`depth`); an empty pattern has none, and is refused."""
    if not self.pattern:
      raise ConfigError("block.pattern is empty; name the group's layers in order, e.g. "
                        f"{tuple(members(self.blocks))}")
    return len(self.pattern)

  def check(self, *, dim: int):
    del dim
    named = members(self.blocks)
    self.depth  # pylint: disable=pointless-statement  (refuses an empty pattern)
    for name in self.pattern:
      if name not in named:
        raise ConfigError(f"block.pattern names '{name}', which is not one of block.blocks"
                          f"{suggest(name, named)}: {', '.join(named)}")
    unused = [name for name in named if name not in self.pattern]
    if unused:
      raise ConfigError(f"block.blocks.{unused[0]} is in no layer of block.pattern "
                        f"{self.pattern}; name it there or remove it")
    for name, cfg in named.items():
      if depth(cfg) != 1:
        raise ConfigError(f"block.blocks.{name} is a group itself; a group's blocks are single "
                          f"layers (name their layers in one pattern)")


def depth(cfg: Any) -> int:
  """The layers one block node stands for: a group's pattern length, else 1."""
  return getattr(cfg, "depth", 1)


@BLOCKS.register("group", BlockGroupConfig)
class BlockGroup(nn.Module):
  """The group's layers in the order of its pattern, each a block of its own."""
  cfg: BlockGroupConfig
  dim: int

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL, *, decode: bool = False):
    named = members(self.cfg.blocks)
    for j, name in enumerate(self.cfg.pattern):
      x_BxLxD = BLOCKS.build(named[name], dim=self.dim, name=member_name(name, j))(
          x_BxLxD, positions_BxL, segment_ids_BxL, decode=decode)
    return x_BxLxD


def member_name(name: str, position: int) -> str:
  """The parameter scope of the group's layer at `position`, a `name` block."""
  return f"{name}_{position}"


def remainder(block_cfg: Any, num_layers: int) -> BlockGroupConfig | None:
  """The group of a stack's layers after its whole repeats (the pattern's first
  num_layers % len(pattern), where `remainder` is `first`), None where there are none;
  ConfigError where the depth is no multiple of the pattern and the group takes no remainder."""
  g = depth(block_cfg)
  k = num_layers % g
  if not k:
    return None
  head, repeats = block_cfg.pattern[:k], num_layers // g
  if block_cfg.remainder != "first":
    whole = f"{repeats} whole repeat{'s' if repeats != 1 else ''}"
    fix = (f", or set --config.model.block.remainder=first ({whole}, then {head})"
           if repeats else "")
    raise ConfigError(f"model.num_layers ({num_layers}) must be a multiple of the {g} layers "
                      f"of model.block.pattern {block_cfg.pattern}{fix}")
  if not repeats:
    raise ConfigError(f"model.num_layers ({num_layers}) is fewer than the {g} layers of "
                      f"model.block.pattern {block_cfg.pattern}, whose remainder follows whole "
                      f"repeats; make the pattern the model's {num_layers} layers")
  return dataclasses.replace(block_cfg, pattern=head, remainder="none",
                             blocks=tuple((n, c) for n, c in block_cfg.blocks if n in head))


def layer_names(block_cfg: BlockGroupConfig, num_layers: int) -> list[str]:
  """The block name of each of a group's stack's `num_layers` layers, in order (the repeats,
  then any remainder: layer i is position i % len(pattern))."""
  return [block_cfg.pattern[i % len(block_cfg.pattern)] for i in range(num_layers)]


def layer_blocks(block_cfg: Any, num_layers: int) -> list:
  """The block config of each of a stack's `num_layers` layers, in order."""
  if not isinstance(block_cfg, BlockGroupConfig):
    return [block_cfg] * num_layers
  named = members(block_cfg.blocks)
  return [named[name] for name in layer_names(block_cfg, num_layers)]


def per_layer(repeats: list, block_cfg: Any) -> list:
  """[{'block': ...} per repeat of the stack] -> [{'block': one block's tree} per layer], layer
  r * len(pattern) + j being position j of repeat r; a plain stack's list as it is."""
  if not isinstance(block_cfg, BlockGroupConfig):
    return repeats
  names = [member_name(name, j) for j, name in enumerate(block_cfg.pattern)]
  return [{**tree, "block": tree["block"][n]} for tree in repeats for n in names]


def per_repeat(layers: list, block_cfg: Any) -> list:
  """The inverse of `per_layer`."""
  if not isinstance(block_cfg, BlockGroupConfig):
    return layers
  names = [member_name(name, j) for j, name in enumerate(block_cfg.pattern)]
  g = len(names)
  return [{**layers[r * g], "block": {n: layers[r * g + j]["block"] for j, n in enumerate(names)}}
          for r in range(len(layers) // g)]
