"""Host offload: the float32 master weights and the optimizer state in host memory.

With trainer.state_memory="host" the train state's parameters and optimizer state are placed
in the host's memory (JAX memory kind `pinned_host`, the sharding of each array unchanged), and
the step (trainer/step.py:train_step, the same pure function) moves them through the device:

    step start    each parameter comes to the device and is cast to the compute dtype: the
                  microbatches run on these weights, their gradients summed in float32
    update        the gradients are clipped by their global norm, then one parameter at a time,
                  smallest first, its master weight and optimizer state come to the device, the
                  optimizer updates them there (the same optimizer, built for that parameter's
                  axes: Optimizer.for_axes) and they go back to host memory (the step donates
                  the state: the new state takes the old one's host buffers)

so the device holds the compute-dtype weights, the float32 gradient sum and a piece of the state
at a time, instead of all the state (MaxText's optimizer and parameter host offload, DeepSpeed's
ZeRO-Offload). A parameter over SMALL_BYTES moves in pieces, each fetched only after the piece
before it is done (_Chain); smaller ones, and the parameters of an optimizer that is not
elementwise (Adafactor, Muon: whole), move when the compiler schedules them. The math is the
train step's without offload: the same gradients, clipping and update, so losses agree and
checkpoints move between offloaded and not-offloaded runs (offload is placement, like the mesh).
On a mesh of one device, pieces of parameters of the same axes share one traced update
(_PieceUpdates), so a model of many alike layers traces its update once per shape. The update
itself runs on the device: XLA's host compute (`compute_on("device_host")`) brought every
operand back to the device (the llm_1b step's temporaries grew to 23 GiB on v5e).

Saved activations can go to host memory too: model.remat's `offload_*` policies
(modules/decoder.py). docs/offload.md has the figures.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

HOST_MEMORY = "pinned_host"  # the memory kind of host-resident state (jit programs need pinned)
STATE_MEMORY = ("device", "host")  # trainer.state_memory


def supports_host(device) -> bool:
  """Whether `device` can hold arrays in host memory (JAX memory kinds)."""
  try:
    return any(m.kind == HOST_MEMORY for m in device.addressable_memories())
  except Exception:  # pylint: disable=broad-except  (compile-only devices may not say)
    return True


def place(state_shardings, state_memory: str):
  """The train state's shardings with params and opt_state in `state_memory` ("host": their
  memory kind pinned_host; the step counter stays on the device)."""
  if state_memory == "device":
    return state_shardings
  host = lambda s: s.with_memory_kind(HOST_MEMORY)
  return state_shardings.replace(params=jax.tree.map(host, state_shardings.params),
                                 opt_state=jax.tree.map(host, state_shardings.opt_state))


def on_host(x) -> bool:
  """Whether array or tracer `x` lives in host memory."""
  return jax.typeof(x).memory_space == jax.memory.Space.Host


def to_device(tree):
  """`tree` with its host-resident leaves moved to the device (others as they are)."""
  return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Device) if on_host(x) else x,
                      tree)


def to_host(tree):
  return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Host), tree)


def any_on_host(tree) -> bool:
  return any(on_host(x) for x in jax.tree.leaves(tree))


# A parameter over SMALL_BYTES comes to the device in pieces of rows of at most PIECE_BYTES (one,
# whole, up to WHOLE_BYTES), each fetched after the piece before it is done (_Chain).
PIECE_BYTES = 64 * 2 ** 20
SMALL_BYTES = 2 ** 20
WHOLE_BYTES = 16 * 2 ** 20


class _Chain:
  """Orders host-to-device transfers: each piece is sliced out of host memory at an index that
  depends on the piece before it (`start`, or 0 if that piece held a number above inf), so the
  compiler cannot fetch it earlier. Without such a dependency XLA's scheduler starts every host
  transfer while the microbatches run (the llm_1b step then held all of AdamW's state in HBM)."""

  def __init__(self):
    self.after = jnp.bool_(False)

  def done(self, x) -> None:
    """Device array `x` must exist before the next piece is fetched."""
    first = jax.lax.reshape(x, (x.size,))[0]
    # Nothing exceeds inf, NaN neither: False, which the compiler cannot know before `x`.
    self.after = first.astype(jnp.float32) > jnp.inf

  def fetch(self, x, rows: tuple[int, int], axis: int):
    """Rows [start, start + size) along `axis` of host array `x`, on the device (the index is
    `start`, or 0 after a piece that held a number above inf: never)."""
    return _fetch(x, self.after, *rows, axis)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _fetch(x, after, start: int, size: int, axis: int):
  """_Chain.fetch's slice, traced once per shape and piece (alike in every layer)."""
  index = [np.int32(0)] * x.ndim
  index[axis] = jax.lax.select(after, np.int32(0), np.int32(start))
  sizes = list(x.shape)
  sizes[axis] = size
  return to_device(jax.lax.dynamic_slice(x, index, sizes))


LANES, SUBLANES = 128, 8  # the TPU's tile of a float32 array's two innermost axes


def _cut_axis(shape) -> tuple[int, int] | None:
  """(axis, rows multiple) to cut a host array of `shape` along, by how the TPU compiler lays
  it out (as seen in its compiled layouts of llm_1b, 125m and tiny): the lane (innermost)
  axis is the last where that is a multiple of 128, else the longest multiple of 128, else the
  longest ([2048, 8, 64] and [512, 192] are laid out {0,2,1} and {0,1}); the sublane axis the
  last of the others. An outer axis is cut in any rows, the sublane axis in multiples of 8;
  the lane axis never (the chip halts: 'Async slices in the lane dimension must start on chunk
  boundaries'). tests/test_offload.py checks the compiled program for lane cuts."""
  nd = len(shape)
  if nd < 2:
    return None
  if shape[-1] % LANES == 0:
    lane = nd - 1
  else:  # a multiple of 128 first, then the longest: [192, 6, 32] is laid out {0,2,1} too
    lane = max(range(nd), key=lambda i: (shape[i] % LANES == 0, shape[i], i))
  sublane = nd - 1 if lane != nd - 1 else nd - 2
  outer = [i for i in range(nd) if i not in (lane, sublane)]
  return (outer[0], 1) if outer else (sublane, SUBLANES)


def _piece_axis(x, names) -> tuple[int, int] | None:
  """(axis, rows multiple) to cut `x` along (_cut_axis), if the mesh does not split that axis
  and it holds two multiples of rows; None (whole, fetched when the compiler schedules it) for a
  small parameter or otherwise."""
  if x.size * x.dtype.itemsize <= SMALL_BYTES:
    return None
  cut = _cut_axis(x.shape)
  if cut is None or x.shape[cut[0]] < 2 * cut[1]:
    return None
  mesh = jax.sharding.get_abstract_mesh()
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes)) if mesh.axis_names else {}
  mesh_axes = nn.logical_to_mesh_axes(tuple(names))[cut[0]] if names else None
  mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes or ())
  return cut if all(sizes.get(a, 1) == 1 for a in mesh_axes) else None


def _pieces(x, cut: tuple[int, int]) -> list[tuple[int, int]]:
  """(start, size) along the cut's axis: one piece, the whole parameter, for one of at most
  WHOLE_BYTES; else two or more pieces of at most PIECE_BYTES (or of the rows multiple, where
  one row is larger), each a multiple of it but the last. Every piece is instructions of the
  compiled step, and a cache entry loads at about 0.35 ms an instruction on a v5e host
  (docs/fault_tolerance.md): llm_1b's attention matrices whole took its train step from 72.5k
  instructions to 57.7k, and its compiled peak from 13.6 to 14.6 GiB; every matrix of up to 64
  MiB whole, to 46.3k instructions and 15.4 GiB, which does not fit the chip."""
  axis, multiple = cut
  n = x.shape[axis]
  row = x.size * x.dtype.itemsize // n
  if x.size * x.dtype.itemsize <= WHOLE_BYTES:
    return [(0, n)]
  rows = min(n // 2, PIECE_BYTES // max(row, 1)) // multiple * multiple
  rows = max(rows, multiple)
  return [(start, min(rows, n - start)) for start in range(0, n, rows)]


def _names(axes, path):
  return None if axes is None else getattr(_get(axes, path), "names", None)


def compute_weights(params, dtype, axes=None):
  """The host-resident `params` on the device in the compute dtype (floats cast, others as
  they are), smallest first, a larger one in pieces one after another (_Chain)."""
  target = lambda d: dtype if jnp.issubdtype(d, jnp.floating) else d
  chain, out = _Chain(), {}
  for path, x in _by_size(params):
    cut = _piece_axis(x, _names(axes, path))
    if cut is None:
      out[path] = to_device(x).astype(target(x.dtype))
      continue
    parts = []
    for rows in _pieces(x, cut):
      parts.append(chain.fetch(x, rows, cut[0]).astype(target(x.dtype)))
      chain.done(parts[-1])
    out[path] = jnp.concatenate(parts, axis=cut[0])
  return _rebuild(params, out)


def global_norm_scale(grads, max_norm: float):
  """The factor that clips `grads` to global L2 norm `max_norm` (trainer/optimizer.py)."""
  norm = optax.tree.norm(grads)
  return jnp.where(norm < max_norm, 1.0, max_norm / norm)


def streamed_update(optimizer, axes, grads, params, opt_state, *, keep_old=None):
  """(new params, new opt_state, {"params": sum of squared new params, "updates": of the
  updates}) of `optimizer` (trainer/optimizer.py:Optimizer) for device-resident `grads` and
  host-resident `params` and `opt_state`, one parameter at a time, smallest first, an
  elementwise optimizer's larger parameters in pieces (_Chain); the new state goes back to
  host memory.

  `axes`: the parameters' logical axes (trainer/param_axes.py), from which each parameter's
  optimizer is built. `keep_old`: (new, old) -> kept, applied to every updated array (the
  train step's skip of a non-finite step); None keeps the new."""
  if optimizer.clip_norm is not None:
    scale = global_norm_scale(grads, optimizer.clip_norm)
    clip_state, state = opt_state[:1], tuple(opt_state[1:])
  else:
    scale, clip_state, state = None, (), opt_state
  state_leaves = dict(jax.tree_util.tree_flatten_with_path(state)[0])
  new_state, new_params, chain = dict(state_leaves), {}, _Chain()
  squares = {"params": jnp.float32(0), "updates": jnp.float32(0)}
  updates, shapes = _PieceUpdates(optimizer, keep_old), _shapes(params)
  for path, p in _by_size(params):
    template = jax.eval_shape(optimizer.for_axes(_prune(axes, path)).after_clip.init,
                              _prune(shapes, path))
    t_paths = jax.tree_util.tree_flatten_with_path(template)[0]
    s = [state_leaves[k] for k, _ in t_paths]
    g = _get(grads, path)
    if scale is not None:
      g = g * scale.astype(g.dtype)

    cut = _piece_axis(p, _names(axes, path)) if optimizer.elementwise else None
    axis = None if cut is None else cut[0]
    pieces = [None] if cut is None else _pieces(p, cut)
    new = []  # per piece: [new parameter, *new state]
    for rows in pieces:
      p_out, s_out, u = _update_piece(updates.of(_get(axes, path)), chain, rows, axis, p, s, g)
      squares = {"params": squares["params"] + _square_sum(p_out),
                 "updates": squares["updates"] + _square_sum(u)}
      new.append([p_out, *s_out])
    # The pieces join on the device and go back to host memory whole: the TPU compiler does
    # not write a piece into a host array along every axis ("lane slice updating").
    joined = [_join(x, axis, p.shape) for x in zip(*new)]
    new_params[path] = to_host(joined[0])
    for (k, _), x in zip(t_paths, joined[1:]):
      new_state[k] = to_host(x)
  s_paths, s_def = jax.tree_util.tree_flatten_with_path(state)
  state = jax.tree.unflatten(s_def, [new_state[k] for k, _ in s_paths])
  opt_state = (*clip_state, *state) if optimizer.clip_norm is not None else state
  return _rebuild(params, new_params), opt_state, squares


class _PieceUpdates:
  """One parameter piece's update by `optimizer` built for a parameter of given axes: a function
  of (gradient, state leaves, parameter), one per distinct axes (ParamAxes compare by value).
  On a mesh of one device it is jitted, so that pieces alike (every layer's q, k, v... of an
  unrolled model, the pieces of one parameter) are traced once per shape, not once each:
  llm_1b's step on one chip updates 273 pieces, whose update took a third of its trace; inside
  the step's program the calls are inlined, the same computations (and llm_1b's program the
  same to the byte) as when each piece was traced apart. On a mesh of several devices the
  partitioner keeps the call's boundary (llm_7b's step on tpu-v5e-8 read 0.26% more bytes and
  took 2 MB more code), so there each piece is traced apart, as before."""

  def __init__(self, optimizer, keep_old):
    self._optimizer, self._keep_old, self._by_axes = optimizer, keep_old, {}
    mesh = jax.sharding.get_abstract_mesh()
    self._jit = math.prod(mesh.axis_sizes) == 1 if mesh.axis_names else True

  def of(self, leaf_axes):
    if leaf_axes not in self._by_axes:
      part = self._optimizer.for_axes({"x": leaf_axes}).after_clip
      keep_old = self._keep_old

      def update(g, s, p):
        t_def = jax.tree.structure(jax.eval_shape(part.init, {"x": p}))
        updates, s_out = part.update({"x": g}, jax.tree.unflatten(t_def, s), {"x": p})
        u = updates["x"]
        p_out, s_out = optax.apply_updates(p, u), jax.tree.leaves(s_out)
        if keep_old is not None:
          p_out = keep_old(p_out, p)
          s_out = [keep_old(a, b) for a, b in zip(s_out, s)]
        return p_out, s_out, u

      self._by_axes[leaf_axes] = jax.jit(update) if self._jit else update
    return self._by_axes[leaf_axes]


def _update_piece(update, chain, rows, axis, p, s, g):
  """(new parameter piece, new state pieces, update) of `rows` along `axis` (None: the whole
  parameter) of parameter `p`, its state leaves `s` (host arrays; those not shaped like `p`
  whole) and gradient `g` (device), by `update` (_PieceUpdates.of)."""
  def take(x):  # this piece of a parameter-shaped array (others whole), on the device
    if rows is None or x.shape != p.shape:
      return to_device(x)
    if not on_host(x):
      return jax.lax.dynamic_slice_in_dim(x, rows[0], rows[1], axis)
    return chain.fetch(x, rows, axis)

  p_out, s_out, u = update(take(g), [take(x) for x in s], take(p))
  chain.done(p_out)
  return p_out, s_out, u


def _join(pieces, axis, shape):
  """Pieces of a parameter-shaped array joined along `axis`; an array of another shape (a step
  count, the same in every piece) from the last piece."""
  if len(pieces) == 1 or pieces[-1].ndim != len(shape):
    return pieces[-1]
  return jnp.concatenate(pieces, axis=axis)


def _square_sum(x):
  return jnp.sum(jnp.square(x.astype(jnp.float32)))


# --- trees of parameters (nested dicts) ---------------------------------------------------

def _by_size(tree) -> list[tuple[tuple, Any]]:
  """(key path, leaf) of `tree`, smallest leaf first (ties in tree order)."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return sorted(flat, key=lambda kv: kv[1].size * kv[1].dtype.itemsize)


def _rebuild(tree, by_path: dict):
  paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
  return jax.tree.unflatten(treedef, [by_path[k] for k, _ in paths])


def _shapes(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _get(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


def _prune(tree, path, *, leaf=None):
  """The nested dicts of `tree` down to `path` alone, its leaf replaced by `leaf` if given."""
  key = path[0].key
  if len(path) == 1:
    return {key: tree[key] if leaf is None else leaf}
  return {key: _prune(tree[key], path[1:], leaf=leaf)}
