"""Collectives in compiled HLO: the bytes each device sends per step, by kind, loops unrolled.

`axtrain plan` (planner/plan.py) reads them from the compiled train step; its roofline estimate
divides them by the entry's link (and host) bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?\S+ = (?P<out>.+?) (?P<op>[a-z][\w-]*)\((?P<rest>.*)$")
_SHAPE = re.compile(r"\b(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_CALLS = re.compile(r"\b(body|condition|calls|to_apply|branch_computations)=\{?%?([\w.\-]+)")
_DCN = '_xla_host_transfer_handler_name="xla_megascale_runtime"'
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def shape_bytes(text: str) -> list[int]:
  """Bytes of every array type in `text` (a tuple gives several)."""
  out = []
  for m in _SHAPE.finditer(text):
    if m["dtype"] in _DTYPE_BYTES:
      dims = [int(d) for d in m["dims"].split(",") if d]
      out.append(_DTYPE_BYTES[m["dtype"]] * math.prod(dims))
  return out


def tuple_elements(type_text: str) -> list[str]:
  """The top-level elements of a tuple type `(a, (b, c), d)`; [type_text] if not a tuple."""
  text = type_text.strip()
  if not text.startswith("("):
    return [text]
  out, depth, start = [], 0, 1
  for i, ch in enumerate(text):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
      if depth == 0:
        out.append(text[start:i])
        break
    elif ch == "," and depth == 1:
      out.append(text[start:i])
      start = i + 1
  return [e.strip() for e in out if e.strip()]


def result_bytes(op: str, out: str) -> int:
  """Bytes of a collective's result. An asynchronous `-start` (but all-reduce-start, which
  returns its result) returns (operands, results, context...): the second element, one array
  or a tuple of them when the compiler combined several collectives into one."""
  if op.endswith("-start") and op != "all-reduce-start":
    parts = tuple_elements(out)
    if len(parts) >= 2:
      return sum(shape_bytes(parts[1]))
  return sum(shape_bytes(out))


_MESH_GROUPS = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\]"
                          r"(?:,\s*device_ids=\(\[(?P<dims>[\d,]*)\](?:T\((?P<perm>[\d,]*)\))?\))?"
                          r"\s*\{(?P<used>[^}]*)\}")


def _iota(dims: str, perm: str | None) -> np.ndarray:
  """Device ids of an iota list `[dims]T(perm)`: arange, reshaped, transposed, flattened."""
  shape = [int(x) for x in dims.split(",") if x]
  ids = np.arange(math.prod(shape)).reshape(shape)
  return (ids.transpose([int(x) for x in perm.split(",")]) if perm else ids).reshape(-1)


def _mesh_groups(rest: str) -> np.ndarray | None:
  """[groups, size] device ids of `replica_groups=mesh[axes], device_ids=(iota) {used}` (the
  ids default to 0..n-1 over the mesh); None for other spellings."""
  m = _MESH_GROUPS.search(rest)
  if not m:
    return None
  axes = [(a, int(n)) for a, n in re.findall(r"'(\w+)'=(\d+)", m["axes"])]
  used = [a for a in re.findall(r"'(\w+)'", m["used"])]
  sizes = [n for _, n in axes]
  ids = (_iota(m["dims"], m["perm"]) if m["dims"] else np.arange(math.prod(sizes))).reshape(sizes)
  names = [a for a, _ in axes]
  order = [names.index(a) for a in names if a not in used] + [names.index(a) for a in used]
  return ids.transpose(order).reshape(-1, math.prod(n for a, n in axes if a in used))


def _group_size(rest: str, num_devices: int) -> int:
  """Devices in one replica group: mesh[...]{axes}, [groups,size]<=[...] or {{a,b,..},..}."""
  if (groups := _mesh_groups(rest)) is not None:
    return groups.shape[1]
  if m := re.search(r"replica_groups=\[\d+,(\d+)\]", rest):
    return int(m[1])
  if m := re.search(r"replica_groups=\{\{([\d,]*)\}", rest):
    return len(m[1].split(","))
  if m := re.search(r"source_target_pairs=", rest):
    return 2
  return num_devices


def _first_group(rest: str, num_devices: int) -> list[int] | None:
  """Device ids of the first replica group, where the HLO spells them out (None if not)."""
  if (groups := _mesh_groups(rest)) is not None:
    return groups[0].tolist()
  if m := re.search(r"replica_groups=\{\{([\d,]*)\}", rest):
    return [int(x) for x in m[1].split(",") if x]
  if m := re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest):
    return _iota(m[3], m[4]).reshape(int(m[1]), int(m[2]))[0].tolist()
  if "replica_groups={}" in rest or ("replica_groups" not in rest
                                     and "source_target_pairs" not in rest):
    return list(range(num_devices))  # one group of every device
  return None


def _crosses(rest: str, num_devices: int, group: int, per_host: int) -> bool:
  """Whether a group spans more than one host (or slice): devices are numbered host by host,
  so a group crosses when its ids fall in different blocks of `per_host`."""
  ids = _first_group(rest, num_devices)
  if ids is None:
    return group > per_host
  return len({i // per_host for i in ids}) > 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Collectives:
  """Bytes each device sends per step (ring algorithms), by collective kind, loops unrolled."""
  bytes_by_kind: dict
  count: int  # collective instructions executed per step
  cross_host_bytes: float = 0.0  # of the total, sent by groups larger than one host

  @property
  def total_bytes(self) -> float:
    return sum(self.bytes_by_kind.values())


def computations(hlo_text: str) -> tuple[dict[str, list[str]], str | None]:
  """computation name -> its instruction lines; and the entry computation's name."""
  comps, current, entry = {}, None, None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
      comps[current] = []
      if line.startswith("ENTRY"):
        entry = current
    elif current is not None and line.strip() and line.strip() != "}":
      comps[current].append(line)
  return comps, entry


def trip_count(line: str, comps: dict[str, list[str]], caller: list[str] = ()) -> int:
  """A while loop's trips: known_trip_count if annotated, else those of the condition's
  `i < constant(N)`: (N - start) / step rounded up, with the counter's step read from the body
  (`i + constant(step)`: libtpu's windowed einsum loops count by 2) and its start from the
  tuple the loop is given in `caller` (0 where neither says); 1 if the condition says nothing."""
  if m := _TRIP.search(line):
    return int(m[1])
  cond = re.search(r"condition=%?([\w.\-]+)", line)
  text = "\n".join(comps.get(cond[1], ())) if cond else ""
  constants = re.findall(r"constant\((\d+)\)", text)
  if len(constants) != 1 or "direction=LT" not in text:
    return 1
  index = re.search(r"get-tuple-element\(%?[\w.\-]+\), index=(\d+)", text)
  body = re.search(r"body=%?([\w.\-]+)", line)
  if index is None or body is None:
    return int(constants[0])
  i = int(index[1])
  step = _counter_step(comps.get(body[1], []), i)
  start = _tuple_constant(caller, re.search(r"while\(%?([\w.\-]+)\)", line), i)
  return max(0, -(-(int(constants[0]) - start) // step))


def _defs(lines) -> dict[str, str]:
  """name -> its instruction's text, for the lines of one computation."""
  return {m[1]: line for line in lines
          if (m := re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line))}


def split_operands(rest: str) -> tuple[tuple[str, ...], str]:
  """`a, %b, /*index=2*/%c), attrs...` (what follows an op's opening parenthesis) ->
  (operand names, attributes)."""
  depth = 0
  for i, ch in enumerate(rest):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      if depth == 0:
        return tuple(re.findall(r"%([\w.\-]+)", rest[:i])), rest[i + 1:]
      depth -= 1
  return (), rest


def _operands(text: str, op: str) -> tuple[str, ...]:
  """The operand names of instruction `text`, an `op`."""
  m = re.search(rf"\b{op}\(", text)
  return split_operands(text[m.end():])[0] if m else ()


def _scalar(text: str | None) -> int | None:
  m = re.search(r"\bconstant\((-?\d+)\)", text or "")
  return int(m[1]) if m else None


def _counter_step(body: list[str], index: int) -> int:
  """What the loop body adds to tuple element `index` each trip (1 unless it reads
  `element + constant(k)` with k > 0)."""
  defs = _defs(body)
  root = next((line for line in body if line.lstrip().startswith("ROOT ")), "")
  outs = _operands(root, "tuple")
  if index >= len(outs):
    return 1
  parts = _operands(defs.get(outs[index], ""), "add")
  steps = [_scalar(defs.get(a)) for a in parts]
  reads = [re.search(rf"get-tuple-element\([^)]*\), index={index}\b", defs.get(a, ""))
           for a in parts]
  if len(parts) == 2 and any(reads) and any(k and k > 0 for k in steps):
    return next(k for k in steps if k and k > 0)
  return 1


def _tuple_constant(caller: list[str], operand, index: int) -> int:
  """Element `index` of the tuple a loop is given, where `caller` defines it as a constant."""
  if operand is None:
    return 0
  defs = _defs(caller)
  elements = _operands(defs.get(operand[1], ""), "tuple")
  value = _scalar(defs.get(elements[index])) if index < len(elements) else None
  return value if value is not None else 0


def runs(comps: dict[str, list[str]], entry: str, *, into_fusions: bool = True) -> dict[str, int]:
  """computation -> times it runs per step, from the entry: loop bodies (and conditions) times
  their trip counts, called computations and conditional branches once per call.
  `into_fusions=False` stops at fusions (their insides are one op of the caller)."""
  times: dict[str, int] = {}

  def visit(name: str, n: int):
    times[name] = times.get(name, 0) + n
    for line in comps.get(name, ()):
      m = _INSTR.match(line)
      op = m["op"] if m else ""
      if op == "fusion" and not into_fusions:
        continue
      for kind, callee in _CALLS.findall(line):
        if kind == "to_apply" and op != "call":
          continue  # a reduction's scalar function, not a computation of its own
        if callee in comps and callee != name:
          visit(callee, n * (trip_count(line, comps, comps.get(name, ())) if kind == "body"
                             else 1))

  visit(entry, 1)
  return times


def sent_bytes(op: str, out: str, rest: str, num_devices: int, *, scatter: bool = False) -> float:
  """Bytes one device sends for one collective instruction (0 for any other op); `scatter`:
  a TPU all-reduce inside an all-reduce-scatter fusion (a reduce-scatter)."""
  kind = op.removesuffix("-start")
  if kind not in COLLECTIVES:
    return 0.0
  kind = "reduce-scatter" if scatter else kind
  size = result_bytes(op, out)
  if not size:
    return 0.0
  g = _group_size(rest, num_devices)
  if kind == "reduce-scatter" and not scatter:
    size *= g  # the input: g times the result
  share = (g - 1) / g if g > 1 else 0.0
  return size * (1 if kind == "collective-permute" else 2 * share if kind == "all-reduce"
                 else share)


def collectives(hlo_text: str, num_devices: int, *, per_host: int | None = None) -> Collectives:
  """Scans compiled HLO: each collective's per-device traffic times its loop trip counts.

  With n devices in a group: all-gather and all-to-all send (n-1)/n of the full result,
  reduce-scatter (n-1)/n of the full input, all-reduce 2 (n-1)/n of the buffer,
  collective-permute the buffer. A group whose device ids fall in more than one block of
  `per_host` counts as crossing hosts (or TPU slices): the mesh numbers devices host by host,
  outer axes (e.g. data parallel over hosts) across them. On a multislice TPU entry libtpu
  hands the cross-slice part of a reduction to its data-center network runtime as host
  `send`s: their buffers count as `dcn (between slices)`, all of it crossing.
  """
  comps, entry = computations(hlo_text)
  if entry is None:
    return Collectives(bytes_by_kind={}, count=0)
  times = runs(comps, entry)
  by_kind, count, cross = {}, 0, 0.0
  for name, n in times.items():
    # TPU reduce-scatters are fusions named all-reduce-scatter: an all-reduce, then a slice.
    scatter = name.startswith("all-reduce-scatter")
    for line in comps[name]:
      m = _INSTR.match(line)
      if m and m["op"] == "send" and _DCN in m["rest"]:
        # Multislice: libtpu sends a cross-slice reduction's buffer to the data-center
        # network runtime (a host transfer), not as an all-reduce across the slices.
        sent = sum(shape_bytes(m["out"].split("u32[]")[0]))
        by_kind["dcn (between slices)"] = by_kind.get("dcn (between slices)", 0.0) + sent * n
        count += n
        cross += sent * n
        continue
      if not m or m["op"].removesuffix("-start") not in COLLECTIVES:
        continue
      sent = sent_bytes(m["op"], m["out"], m["rest"], num_devices, scatter=scatter)
      if not sent and not shape_bytes(m["out"]):
        continue
      op = "reduce-scatter" if scatter else m["op"].removesuffix("-start")
      g = _group_size(m["rest"], num_devices)
      by_kind[op] = by_kind.get(op, 0.0) + sent * n
      count += n
      if per_host and _crosses(m["rest"], num_devices, g, per_host):
        cross += sent * n
  return Collectives(bytes_by_kind=by_kind, count=int(count), cross_host_bytes=cross)
