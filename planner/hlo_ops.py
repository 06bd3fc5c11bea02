"""Where a compiled step's time goes: every executed op's bytes and FLOPs, named back to modules.

Reads the compiled (optimised) HLO text. An op is an instruction of a computation that runs as
a unit: the entry, loop bodies and conditions (times their trip counts), conditional branches
and called computations; the insides of a fusion are one op. Per op:

    bytes     what it reads and writes in device memory: its operands' and its result's sizes
              (a fusion's, not its inner instructions'; of an operand it slices or gathers
              from, what it takes). Parameters, constants, tuples, get-tuple-element,
              bitcasts, loop / call wrappers and the `-done` halves of asynchronous pairs move
              nothing of their own.
    alt_bytes the part of `bytes` in buffers the compiler placed in its alternate memory
              space, S(1) in their layouts: on a TPU its on-chip vector memory (VMEM), not
              HBM (planner/calibration.py: `alternate_memory`).
    flops     2 x multiply-adds of every dot or convolution inside (a convolution counts the
              input features and window taps that meet real input, not padding or dilation).
    seconds   a roofline: max(flops / peak FLOP/s, bytes / HBM bandwidth); a collective adds
              what it sends over the links (planner/hlo_collectives.py) at the link bandwidth.
    category  matmul (a dot or convolution inside), collective, copy/convert (copies, layout
              changes, dtype conversions and nothing else), elementwise (any other fusion or
              op), kernel (custom calls such as Pallas kernels).
    module    the module path of the op's metadata (jax's name stack, e.g.
              layers_*/block/attention), its primitive (dot_general, the einsum's spec), and its
              pass: forward, backward (under `transpose(`), or step (optimizer, loss scaling...).

These are the same kind of figures as the compiler's own cost analysis (its "bytes accessed"
and "flops"); `Report.coverage` compares the sums with them. `axtrain plan --ops` prints them.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

from planner import hlo_collectives

_LINE = re.compile(r"^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = (?P<out>.+?) (?P<op>[a-z][\w-]*)\("
                   r"(?P<rest>.*)$")
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
         "conditional", "call", "after-all", "partition-id", "replica-id", "opt-barrier",
         "iota", "add-dependency", "domain"}
_COPIES = {"copy", "copy-start", "slice-start", "convert", "transpose", "bitcast-convert",
           "bitcast", "reshape", "parameter", "tuple", "get-tuple-element", "constant",
           "broadcast", "slice", "concatenate", "pad", "dynamic-slice", "dynamic-update-slice"}
# Custom calls that only annotate: no kernel of their own.
_BOOKKEEPING = {"AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked", "Sharding", "AllocateBuffer",
                "SPMDFullToShardShape", "SPMDShardToFullShape", "ConcatBitcast"}
_WRAPPERS = re.compile(r"jit|jvp|transpose|vmap|pjit|remat|checkpoint|rematted_computation|"
                       r"closed_call|custom_jvp_call|custom_vjp_call|while|body|cond|"
                       r"shard_map|core_call")


@dataclasses.dataclass(frozen=True)
class Instr:
  name: str
  out: str  # result type text, e.g. bf16[8,128]{1,0} or a tuple of them
  op: str
  operands: tuple[str, ...]
  rest: str  # attributes after the operand list


@dataclasses.dataclass(frozen=True, kw_only=True)
class Op:
  """One executed op, its figures summed over the times it runs in a step."""
  name: str
  opcode: str  # fusion, copy, all-gather...
  category: str  # matmul, collective, copy/convert, elementwise, kernel
  module: str  # module path, layer indices as `*` ("" where the metadata names none)
  primitive: str  # the jax primitive (and einsum spec) of the op's metadata
  pass_: str  # forward, backward or step
  count: int  # times it runs per step
  narrow: str  # "int8" / "fp8": its dots multiply quantized operands (model.quantization); ""
  # An asynchronous copy's direction across the host link: "to_host" (its destination is in
  # host memory, memory space S(5)), "to_device" (its source is), else ""
  host: str = ""
  bytes: float
  alt_bytes: float = 0.0  # of `bytes`, those in the alternate memory space S(1)
  flops: float
  sent: float  # bytes it sends to other devices (collectives)
  seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Group:
  """Ops with the same module, primitive, pass and category (e.g. one einsum in every layer)."""
  module: str
  primitive: str
  pass_: str
  category: str
  ops: int
  bytes: float
  flops: float
  seconds: float

  @property
  def label(self) -> str:
    return f"{self.module or '(step)'} {self.primitive} [{self.pass_}]"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Report:
  ops: tuple[Op, ...]
  compiler_bytes: float  # the compiler's "bytes accessed" (0 if it gave none)
  compiler_flops: float

  def groups(self) -> list[Group]:
    acc: dict = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for o in self.ops:
      g = acc[(o.module, o.primitive, o.pass_, o.category)]
      g[0] += o.count
      g[1] += o.bytes
      g[2] += o.flops
      g[3] += o.seconds
    return [Group(module=k[0], primitive=k[1], pass_=k[2], category=k[3], ops=v[0], bytes=v[1],
                  flops=v[2], seconds=v[3]) for k, v in acc.items()]

  def top(self, key: str, n: int = 10) -> list[Group]:
    """The n groups with the most `key` (bytes or seconds)."""
    return sorted(self.groups(), key=lambda g: -getattr(g, key))[:n]

  def totals(self) -> dict[str, dict[str, float]]:
    """category -> {ops, bytes, flops, seconds}, largest bytes first."""
    out: dict = {}
    for o in self.ops:
      t = out.setdefault(o.category, {"ops": 0, "bytes": 0.0, "flops": 0.0, "seconds": 0.0})
      t["ops"] += o.count
      t["bytes"] += o.bytes
      t["flops"] += o.flops
      t["seconds"] += o.seconds
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["bytes"]))

  def host_bytes(self, direction: str) -> float:
    """Bytes per step the program's asynchronous copies move across the host link in
    `direction` ("to_host" / "to_device"): offloaded activations, a host-resident state's
    write-back (an Op's `bytes` counts a copy's read and write: half of it crosses)."""
    return sum(o.bytes / 2 for o in self.ops if o.host == direction)

  @property
  def bytes(self) -> float:
    return sum(o.bytes for o in self.ops)

  @property
  def flops(self) -> float:
    return sum(o.flops for o in self.ops)

  @property
  def seconds(self) -> float:
    """Ops one after another, each at its roofline: a serial estimate of the step."""
    return sum(o.seconds for o in self.ops)

  def coverage(self) -> tuple[float, float]:
    """(our bytes / compiler's bytes accessed, our FLOPs / compiler's FLOPs); 0 where unknown."""
    return (self.bytes / self.compiler_bytes if self.compiler_bytes else 0.0,
            self.flops / self.compiler_flops if self.compiler_flops else 0.0)


def parse(hlo_text: str) -> tuple[dict[str, list[Instr]], dict[str, list[str]], str | None]:
  """computation name -> its instructions (and its lines); the entry computation's name."""
  lines, entry = hlo_collectives.computations(hlo_text)
  comps = {}
  for name, body in lines.items():
    comps[name] = []
    for line in body:
      if m := _LINE.match(line):
        operands, rest = hlo_collectives.split_operands(m["rest"])
        if m["op"] == "parameter":  # its number, for _param_names
          operands = (m["rest"].split(")", 1)[0],)
        comps[name].append(Instr(m["name"], m["out"], m["op"], operands, rest))
  return comps, lines, entry


def _bytes(type_text: str) -> float:
  return float(sum(hlo_collectives.shape_bytes(type_text)))


def _alt_share(type_text: str) -> float:
  """The share of `type_text`'s bytes (a tuple's elements together) laid out in the alternate
  memory space S(1)."""
  total = alt = 0.0
  for m in _SPACES.finditer(type_text):
    b = _bytes(m[0])
    total += b
    alt += b if _ALTERNATE in (m[1] or "") else 0.0
  return alt / total if total else 0.0


def _dims(type_text: str) -> list[int]:
  m = re.search(r"\[([\d,]*)\]", type_text)
  return [int(d) for d in m[1].split(",") if d] if m else []


def _conv_flops(instr: Instr, shapes: dict[str, str]) -> float:
  """2 x output elements x (input features per group x window taps that meet real input)."""
  out = math.prod(_dims(instr.out))
  if instr.op == "dot":
    lhs = _dims(shapes.get(instr.operands[0], ""))
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.rest)
    contract = [int(d) for d in m[1].split(",") if d] if m else []
    return 2.0 * out * math.prod(lhs[d] for d in contract if d < len(lhs))
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instr.rest)
  lhs = _dims(shapes.get(instr.operands[0], ""))
  if not labels or len(lhs) != len(labels[1]):
    return 0.0
  lhs_labels = labels[1]
  features = lhs[lhs_labels.index("f")]
  if m := re.search(r"feature_group_count=(\d+)", instr.rest):
    features //= int(m[1])
  window = re.search(r"window=\{([^}]*)\}", instr.rest)
  if not window or "size=" not in window[1]:
    return 2.0 * out * features
  spec = dict(re.findall(r"(\w+)=([\w\-x]+)", window[1]))
  sizes = [int(v) for v in spec["size"].split("x")]
  n = len(sizes)
  strides = [int(v) for v in spec.get("stride", "x".join("1" * n)).split("x")]
  dilate = [int(v) for v in spec.get("lhs_dilate", "x".join("1" * n)).split("x")]
  pads = [int(v.split("_")[0]) for v in spec["pad"].split("x")] if "pad" in spec else [0] * n
  out_dims, out_labels = _dims(instr.out), labels[3]
  # Per spatial dimension: the real (not padding, not dilation) input positions under each
  # output's window, summed over the outputs; dimensions are independent, so they multiply.
  share = 1.0
  for d in range(n):
    size_in, size_out = lhs[lhs_labels.index(str(d))], out_dims[out_labels.index(str(d))]
    taps, dil, end = 0, dilate[d], (size_in - 1) * dilate[d] + 1
    for o in range(size_out):
      lo = max(o * strides[d] - pads[d], 0)
      hi = min(o * strides[d] - pads[d] + sizes[d], end)
      taps += max((hi - 1) // dil - (lo + dil - 1) // dil + 1, 0) if hi > lo else 0
    share *= taps / size_out
  return 2.0 * out * features * share


def _inner(comps, name: str, seen=None) -> list[tuple[Instr, dict[str, str]]]:
  """Every instruction inside a fused computation (nested fusions included), with the
  computation's name -> type table."""
  seen = seen if seen is not None else set()
  if name in seen or name not in comps:
    return []
  seen.add(name)
  shapes = {i.name: i.out for i in comps[name]}
  out = []
  for i in comps[name]:
    out.append((i, shapes))
    if m := re.search(r"\bcalls=%?([\w.\-]+)", i.rest):
      out += _inner(comps, m[1], seen)
  return out


def _param_names(body: list[Instr]) -> dict[int, str]:
  """parameter number -> its instruction's name, in a (fused) computation."""
  return {int(j.operands[0]): j.name for j in body if j.op == "parameter"}


def _users(body: list[Instr]) -> dict[str, list[Instr]]:
  users: dict[str, list[Instr]] = collections.defaultdict(list)
  for j in body:
    for o in j.operands:
      users[o].append(j)
  return users


def _read(comps, body: list[Instr], users, name: str, size: float, seen: frozenset) -> float:
  """Bytes a fused computation reads of its value `name` (`size` bytes): only the slices that
  (dynamic-)slices and gathers take, nothing of the buffer a dynamic-update-slice writes in
  place, what a nested fusion reads of it; all of it for any other use."""
  total = 0.0
  for u in users.get(name, []):
    if u.op in ("dynamic-slice", "slice", "gather") and u.operands[0] == name:
      total += _bytes(u.out)
    elif u.op == "dynamic-update-slice" and u.operands[0] == name:
      continue
    elif u.op == "bitcast":
      total += _read(comps, body, users, u.name, size, seen)
    elif u.op == "fusion" and (m := re.search(r"\bcalls=%?([\w.\-]+)", u.rest)) and (
        m[1] in comps and m[1] not in seen):
      inner = comps[m[1]]
      params = _param_names(inner)
      inner_users = _users(inner)
      for k, o in enumerate(u.operands):
        if o == name and k in params:
          total += _read(comps, inner, inner_users, params[k], size, seen | {m[1]})
    else:
      return size
  return min(total, size)


def _written(body: list[Instr], name: str) -> float:
  """Bytes a fused computation writes for its result `name`: a dynamic-update-slice (through
  bitcasts and tuples) writes only its update."""
  by_name = {j.name: j for j in body}
  j = by_name.get(name)
  while j is not None and j.op == "bitcast":
    j = by_name.get(j.operands[0])
  if j is None:
    return 0.0
  if j.op == "tuple":
    return sum(_written(body, o) for o in j.operands)
  if j.op == "dynamic-update-slice":
    return _bytes(by_name[j.operands[1]].out) if j.operands[1] in by_name else _bytes(j.out)
  return _bytes(j.out)


def _roots(lines: dict[str, list[str]]) -> dict[str, str]:
  """computation name -> the name of its ROOT instruction."""
  out = {}
  for comp, body in lines.items():
    for line in body:
      if m := re.match(r"^\s*ROOT %?([\w.\-]+) = ", line):
        out[comp] = m[1]
  return out


def _fusion_bytes(comps, roots, called: str, instr: Instr,
                  shapes: dict[str, str]) -> tuple[float, float]:
  """A fusion's memory traffic: what it reads of each operand (_read) and writes (_written);
  (all of it, the part in the alternate memory space)."""
  body = comps.get(called)
  reads = [_bytes(shapes.get(o, "")) for o in instr.operands]
  written = _bytes(instr.out)
  if body:
    params = _param_names(body)
    users = _users(body)
    reads = [_read(comps, body, users, params[k], size, frozenset({called})) if k in params
             else size for k, size in enumerate(reads)]
    written = _written(body, roots.get(called, body[-1].name))
  alt = written * _alt_share(instr.out) + sum(
      r * _alt_share(shapes.get(o, "")) for r, o in zip(reads, instr.operands))
  return sum(reads) + written, alt


def _metadata(instr: Instr, inner) -> str:
  m = re.search(r'op_name="([^"]*)"', instr.rest)
  if m:
    return m[1]
  for i, _ in reversed(inner):  # a fusion without its own: its root's
    if m := re.search(r'op_name="([^"]*)"', i.rest):
      return m[1]
  return ""


def name_stack(op_name: str) -> tuple[str, str, str]:
  """(module path, primitive, pass) from jax's op_name metadata.

  jit(train_step)/transpose(jvp(DecoderLM))/layers_3/block/attention/bld,dhk->blhk/dot_general
  -> ("DecoderLM/layers_*/block/attention", "bld,dhk->blhk dot_general", "backward")
  Transformations around a scope (jvp(...), transpose(...)) are unwrapped to its name; the
  step's own scopes are `loss`, `optimizer` and `metrics` (trainer/step.py).
  """
  parts = [p for p in op_name.split("/") if p]
  pass_ = "backward" if "transpose(" in op_name else (
      "forward" if "jvp(" in op_name else "step")
  if parts and parts[0].startswith("jit("):
    parts = parts[1:]
  module, prim = [], []
  for p in parts:
    inner = p
    while m := re.fullmatch(r"\w+\((.*)\)", inner):
      inner = m[1]  # transpose(jvp(DecoderLM)) -> DecoderLM
    if not inner or re.fullmatch(_WRAPPERS, inner):
      continue
    if prim or "->" in inner or not re.fullmatch(r"[A-Za-z_]\w*", inner):
      prim.append(inner)
    elif not module or module[-1] != inner:  # a rematerialised scope repeats its name
      module.append(inner)
  if module and not prim:
    prim = [module.pop()]  # the last name is the primitive (dot_general, add, ...)
  path = re.sub(r"(?<=_)\d+(?=/|$)", "*", "/".join(module))
  return path, " ".join(prim), pass_


_NARROW = (("int8", re.compile(r"^[su]8\[")), ("fp8", re.compile(r"^f8e\w*\[")))


def narrow_dtype(dots: list[tuple[Instr, dict[str, str]]]) -> str:
  """"int8" or "fp8" where every dot or convolution of an op multiplies two operands of that
  type (the quantized matmuls of model.quantization), else ""."""
  kinds = set()
  for j, shapes in dots:
    types = [shapes.get(o, "") for o in j.operands[:2]]
    kinds.add(next((k for k, pattern in _NARROW if all(pattern.match(t) for t in types)), ""))
  return kinds.pop() if len(kinds) == 1 else ""


def _category(instr: Instr, inner) -> str:
  ops = {i.op for i, _ in inner} | {instr.op}
  targets = re.findall(r'custom_call_target="([^"]+)"', " ".join(i.rest for i, _ in inner)
                       + instr.rest)
  if ops & {"convolution", "dot"}:
    return "matmul"  # a matmul fused with the collective that feeds it stays a matmul
  if any(o.removesuffix("-start") in hlo_collectives.COLLECTIVES for o in ops) or any(
      t.startswith("AsyncCollective") for t in targets):
    return "collective"
  if "custom-call" in ops and any(t not in _BOOKKEEPING for t in targets):
    return "kernel"
  if ops <= _COPIES | {"fusion"}:
    return "copy/convert"
  return "elementwise"


# A layout's memory space: S(5) is host memory (TPU's and GPU's compilers), in a copy-start's
# (destination, source, context) tuple; S(1) the alternate memory that the compiler's memory
# space assignment places buffers in (a TPU's on-chip vector memory)
_SPACES = re.compile(r"\w+\[[\d,]*\](\{[^}]*\})?")
_ALTERNATE = "S(1)"


def _host_direction(out_type: str) -> str:
  """"to_host" / "to_device" for an asynchronous copy whose destination / source (the first /
  second element of its result tuple) is in host memory, else ""."""
  parts = [m[1] or "" for m in _SPACES.finditer(out_type)][:2]
  if len(parts) < 2:
    return ""
  return "to_host" if "S(5)" in parts[0] else "to_device" if "S(5)" in parts[1] else ""


def _traffic(i: Instr, called: str | None, comps, roots, shapes) -> tuple[float, float, str]:
  """(bytes, alt_bytes, host direction) of one op; `called`: a fusion's computation."""
  host = ""
  if i.op in ("copy-start", "slice-start"):
    # (source, destination, context): one read and one write of what is copied.
    size = 2 * min((b for b in hlo_collectives.shape_bytes(i.out) if b > 8), default=0)
    host = _host_direction(i.out)
    ends = [m[1] or "" for m in _SPACES.finditer(i.out)][:2]
    alt = size / 2 * sum(_ALTERNATE in e for e in ends)
  elif called:
    size, alt = _fusion_bytes(comps, roots, called, i, shapes)
  elif i.op in ("dynamic-slice", "slice", "gather"):
    # reads only what it returns (a gather also its indices)
    index = shapes.get(i.operands[1], "") if i.op == "gather" else ""
    size = 2 * _bytes(i.out) + _bytes(index)
    alt = _bytes(i.out) * (_alt_share(i.out) + _alt_share(shapes.get(i.operands[0], ""))) + (
        _bytes(index) * _alt_share(index))
  elif i.op == "dynamic-update-slice":
    update = _bytes(shapes.get(i.operands[1], ""))
    size = 2 * update  # in place: the update, read and written
    alt = update * (_alt_share(shapes.get(i.operands[1], "")) + _alt_share(i.out))
  else:
    # An asynchronous collective's `-start` also returns its operands: count them once.
    result = float(hlo_collectives.result_bytes(i.op, i.out))
    size = result + sum(_bytes(shapes.get(o, "")) for o in i.operands)
    alt = result * _alt_share(i.out) + sum(
        _bytes(shapes.get(o, "")) * _alt_share(shapes.get(o, "")) for o in i.operands)
  return size, alt, host


def ops_report(hlo_text: str, *, num_devices: int, peak_flops: float, hbm_bandwidth: float,
               link_bandwidth: float, compiler_bytes: float = 0.0, compiler_flops: float = 0.0,
               narrow_peaks: dict[str, float] | None = None) -> Report:
  """Every executed op of the compiled step with its bytes, FLOPs and roofline seconds;
  `narrow_peaks`: the peak of int8 / fp8 matmuls ("int8" -> OP/s), else `peak_flops`."""
  comps, lines, entry = parse(hlo_text)
  if entry is None:
    return Report(ops=(), compiler_bytes=compiler_bytes, compiler_flops=compiler_flops)
  times = hlo_collectives.runs(lines, entry, into_fusions=False)
  roots = _roots(lines)
  out = []
  for comp, n in times.items():
    shapes = {i.name: i.out for i in comps[comp]}
    for i in comps[comp]:
      target = re.search(r'custom_call_target="([^"]*)"', i.rest) if i.op == "custom-call" else None
      # ConcatBitcast: buffers side by side; AllocateBuffer, annotations: nothing moves
      if i.op in _FREE or i.op.endswith("-done") or (target and target[1] in _BOOKKEEPING):
        continue
      called = re.search(r"\bcalls=%?([\w.\-]+)", i.rest)
      inner = _inner(comps, called[1]) if called and i.op == "fusion" else []
      if any(j.op == "custom-call" and "AsyncCollectiveDone" in j.rest for j, _ in inner):
        continue  # the finishing half of an asynchronous collective: counted at its start
      size, alt, host = _traffic(i, called[1] if called and i.op == "fusion" else None,
                                 comps, roots, shapes)
      dots = [(j, s) for j, s in inner + [(i, shapes)] if j.op in ("convolution", "dot")]
      flops = sum(_conv_flops(j, s) for j, s in dots)
      narrow = narrow_dtype(dots) if dots else ""
      category = _category(i, inner)
      sent = 0.0
      if category == "collective":
        scatter = bool(called) and called[1].startswith("all-reduce-scatter")
        sent = sum(hlo_collectives.sent_bytes(j.op, j.out, j.rest, num_devices, scatter=scatter)
                   for j, _ in inner + [(i, shapes)])
      peak = (narrow_peaks or {}).get(narrow) or peak_flops
      seconds = max(flops / peak, size / hbm_bandwidth) + sent / link_bandwidth
      module, prim, pass_ = name_stack(_metadata(i, inner))
      prim = prim or i.op  # no metadata (e.g. copies the compiler adds): the opcode
      out.append(Op(name=i.name, opcode=i.op, category=category, module=module, primitive=prim,
                    pass_=pass_, count=n, narrow=narrow, host=host, bytes=size * n,
                    alt_bytes=alt * n, flops=flops * n, sent=sent * n, seconds=seconds * n))
  return Report(ops=tuple(out), compiler_bytes=compiler_bytes, compiler_flops=compiler_flops)
