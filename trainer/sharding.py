"""Device mesh and shardings: logical axis names on arrays -> mesh axes, by the entry's rules."""

from __future__ import annotations

import dataclasses
import math
import types

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from core.registry import ConfigError
from trainer.config import MeshConfig
from trainer.meshes import AXES, Entry


def resolve_axes(entry: Entry, cfg: MeshConfig, device_count: int) -> dict[str, int]:
  """Axis sizes: the entry's (1 for an axis it does not name), overridden by the config's; one
  -1 fills from the device count."""
  sizes = {axis: 1 for axis in AXES} | dict(entry.axes)
  for axis in AXES:
    value = getattr(cfg, axis)
    if value is not None:
      sizes[axis] = value
  fill = [a for a, n in sizes.items() if n == -1]
  bad = [f"{a}={n}" for a, n in sizes.items() if n == 0 or n < -1]
  if bad or len(fill) > 1:
    raise ConfigError(f"mesh: axis sizes must be positive with at most one -1, got "
                      f"{_show(sizes)}")
  known = math.prod(n for n in sizes.values() if n != -1)
  if fill:
    if device_count % known:
      raise ConfigError(f"mesh: {_show(sizes)} cannot fill {device_count} devices "
                        f"({device_count} is not divisible by {known})")
    sizes[fill[0]] = device_count // known
  if math.prod(sizes.values()) != device_count:
    raise ConfigError(f"mesh: {_show(sizes)} needs {math.prod(sizes.values())} devices but "
                      f"{device_count} are available; set --config.mesh.<axis>=N to match")
  return sizes


def _show(sizes: dict[str, int]) -> str:
  return ",".join(f"{a}={n}" for a, n in sizes.items())


@dataclasses.dataclass(frozen=True)
class Elsewhere:
  """`count` devices of `platform` that this process does not have: those of a job that
  `axtrain launch` is about to start. make_mesh lays them out as an AbstractMesh, on which
  experiment.build makes every shape check a process makes, and nothing compiles."""
  count: int
  platform: str

  def __len__(self) -> int:
    return self.count

  def __getitem__(self, index: int):
    if not -self.count <= index < self.count:
      raise IndexError(index)
    return types.SimpleNamespace(platform=self.platform)


def make_mesh(sizes: dict[str, int], devices=None) -> Mesh | AbstractMesh:
  """A mesh whose outer axes cross the slow links (hosts, TPU slices) and inner ones the fast;
  an axis of AXES missing from `sizes` has size 1; for devices `Elsewhere`, an abstract one.

  Axis types are Auto: shardings come from in/out shardings and the logical
  constraints, and XLA propagates the rest.
  """
  if isinstance(devices, Elsewhere):
    return AbstractMesh(tuple(sizes.get(a, 1) for a in AXES), AXES,
                        axis_types=(AxisType.Auto,) * len(AXES))
  devices = list(jax.devices() if devices is None else devices)
  grid = device_grid(tuple(sizes.get(a, 1) for a in AXES), devices)
  return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def device_grid(shape: tuple[int, ...], devices) -> np.ndarray:
  """Devices arranged as `shape` (axes ordered as AXES: slowest link first).

  TPU slices: the ICI torus order (mesh_utils). Several TPU slices, or several
  processes on other platforms (GPU hosts over the network): each granule (slice
  or process) is one block of the outer axes, so that `data` (then `stage`, `fsdp`, ...)
  spans hosts and the fast axes stay inside one, as in hybrid sharded data parallel.
  """
  # Compile-only TPU topology devices (axtrain plan) have no slice_index: one slice.
  if devices[0].platform == "tpu" and len({getattr(d, "slice_index", 0) for d in devices}) > 1:
    attr = "slice_index"
  elif devices[0].platform != "tpu" and len({d.process_index for d in devices}) > 1:
    attr = "process_index"
  else:
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  granules = len({getattr(d, attr) for d in devices})
  outer = split_outer(shape, granules)
  if outer is None:
    raise ConfigError(f"mesh: axes {dict(zip(AXES, shape))} cannot be laid over {granules} "
                      f"{'slices' if attr == 'slice_index' else 'hosts'} of "
                      f"{len(devices) // granules} devices each: the axes before model (outer "
                      f"first: {', '.join(AXES[:-1])}) must factor into the host count")
  inner = tuple(n // o for n, o in zip(shape, outer))
  return mesh_utils.create_hybrid_device_mesh(inner, outer, devices,
                                              process_is_granule=attr == "process_index",
                                              allow_split_physical_axes=True)


def split_outer(shape: tuple[int, ...], granules: int) -> tuple[int, ...] | None:
  """How many granules each axis spans, outer axes first (`data`, `stage`, `fsdp`, then
  `expert`: its all-to-all then crosses the network); never `model`.

  None when the granules do not factor that way (the model axis would cross hosts).
  """
  outer, left = [], granules
  for axis, n in zip(AXES, shape):
    take = math.gcd(n, left) if axis != "model" else 1
    outer.append(take)
    left //= take
  return tuple(outer) if left == 1 else None


def logical_shardings(abstract_tree, mesh: Mesh, rules):
  """NamedShardings for a tree whose leaves may be flax LogicallyPartitioned boxes."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_tree), mesh, rules)


def check_divisible(abstract_tree, shardings, *, what: str) -> None:
  """Every sharded dimension must divide evenly over its mesh axes (one-line error if not)."""
  leaves = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(abstract_tree))[0]
  shard_leaves = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  for (path, leaf), sharding in zip(leaves, shard_leaves):
    for dim, axes in zip(leaf.shape, sharding.spec):
      if axes is None:
        continue
      axes = (axes,) if isinstance(axes, str) else axes
      n = math.prod(sharding.mesh.shape[a] for a in axes)
      if dim % n:
        name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        raise ConfigError(f"{what} '{name}' has shape {tuple(leaf.shape)}: dimension {dim} is not "
                          f"divisible by mesh axes {'*'.join(axes)}={n}; change the mesh "
                          f"(--config.mesh.*) or the model size")


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """[batch, length] arrays: batch over the data-parallel axes."""
  spec = nn.logical_to_mesh_axes(("batch", None), rules)
  return NamedSharding(mesh, PartitionSpec(*spec))


def num_shards(named: NamedSharding, *, dim: int) -> int:
  axes = named.spec[dim] if dim < len(named.spec) else None
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  return math.prod(named.mesh.shape[a] for a in axes)


def describe_axes(named: NamedSharding, *, dim: int) -> str:
  """`data=2 x fsdp=4` for the mesh axes that dimension `dim` is split over."""
  axes = named.spec[dim] if dim < len(named.spec) else None
  axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
  return " x ".join(f"{a}={named.mesh.shape[a]}" for a in axes) or "not split"
