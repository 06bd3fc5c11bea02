"""Collectives in compiled HLO: the bytes each device sends per step, by kind, loops unrolled.

`axtrain plan` (trainer/plan.py) reads them from the compiled train step; its roofline estimate
divides them by the entry's link (and host) bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
import re

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?\S+ = (?P<out>.+?) (?P<op>[a-z][\w-]*)\((?P<rest>.*)$")
_SHAPE = re.compile(r"\b(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_CALLS = re.compile(r"\b(body|calls|branch_computations)=\{?%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def _shape_bytes(text: str) -> list[int]:
  out = []
  for m in _SHAPE.finditer(text):
    if m["dtype"] in _DTYPE_BYTES:
      dims = [int(d) for d in m["dims"].split(",") if d]
      out.append(_DTYPE_BYTES[m["dtype"]] * math.prod(dims))
  return out


def _group_size(rest: str, num_devices: int) -> int:
  """Devices in one replica group: mesh[...]{axes}, [groups,size]<=[...] or {{a,b,..},..}."""
  if m := re.search(r"replica_groups=mesh\[(?P<axes>[^\]]*)\]\s*\{(?P<used>[^}]*)\}", rest):
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", m["axes"]))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m["used"]))
  if m := re.search(r"replica_groups=\[\d+,(\d+)\]", rest):
    return int(m[1])
  if m := re.search(r"replica_groups=\{\{([\d,]*)\}", rest):
    return len(m[1].split(","))
  if m := re.search(r"source_target_pairs=", rest):
    return 2
  return num_devices


@dataclasses.dataclass(frozen=True, kw_only=True)
class Collectives:
  """Bytes each device sends per step (ring algorithms), by collective kind, loops unrolled."""
  bytes_by_kind: dict
  count: int  # collective instructions executed per step
  cross_host_bytes: float = 0.0  # of the total, sent by groups larger than one host

  @property
  def total_bytes(self) -> float:
    return sum(self.bytes_by_kind.values())


def collectives(hlo_text: str, num_devices: int, *, per_host: int | None = None) -> Collectives:
  """Scans compiled HLO: each collective's per-device traffic times its loop trip counts.

  With n devices in a group: all-gather and all-to-all send (n-1)/n of the full result,
  reduce-scatter (n-1)/n of the full input, all-reduce 2 (n-1)/n of the buffer,
  collective-permute the buffer. A group of more than `per_host` devices counts as crossing
  hosts (the mesh puts the fast axes inside a host).
  """
  comps, current, entry = {}, None, None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
      comps[current] = []
      if line.startswith("ENTRY"):
        entry = current
    elif current is not None and line.strip() and line.strip() != "}":
      comps[current].append(line)
  times: dict[str, float] = {}

  def trip_count(line) -> int:
    """known_trip_count if annotated, else N of the condition's `i < constant(N)`."""
    if m := _TRIP.search(line):
      return int(m[1])
    cond = re.search(r"condition=%?([\w.\-]+)", line)
    body = "\n".join(comps.get(cond[1], ())) if cond else ""
    constants = re.findall(r"constant\((\d+)\)", body)
    return int(constants[0]) if len(constants) == 1 and "direction=LT" in body else 1

  def visit(name, n):
    times[name] = times.get(name, 0) + n
    for line in comps.get(name, ()):
      for kind, callee in _CALLS.findall(line):
        if callee in comps and callee != name:
          visit(callee, n * (trip_count(line) if kind == "body" else 1))

  if entry is None:
    return Collectives(bytes_by_kind={}, count=0)
  visit(entry, 1)
  by_kind, count, cross = {}, 0, 0.0
  for name, n in times.items():
    # TPU reduce-scatters are fusions named all-reduce-scatter: an all-reduce, then a slice.
    scatter = name.startswith("all-reduce-scatter")
    for line in comps[name]:
      m = _INSTR.match(line)
      if not m or m["op"].removesuffix("-start") not in _COLLECTIVES:
        continue
      op = "reduce-scatter" if scatter else m["op"].removesuffix("-start")
      sizes = _shape_bytes(m["out"])
      if not sizes:
        continue
      # `-start` ops return (operand, result, ...): the result is the largest; plain ops
      # over a tuple move every element.
      size = max(sizes) if m["op"].endswith("-start") else sum(sizes)
      g = _group_size(m["rest"], num_devices)
      if op == "reduce-scatter" and not scatter:
        size *= g  # the input: g times the result
      share = (g - 1) / g if g > 1 else 0.0
      sent = size * (1 if op == "collective-permute" else 2 * share if op == "all-reduce"
                     else share)
      by_kind[op] = by_kind.get(op, 0.0) + sent * n
      count += n
      if per_host and g > per_host:
        cross += sent * n
  return Collectives(bytes_by_kind=by_kind, count=int(count), cross_host_bytes=cross)
