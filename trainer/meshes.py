"""The mesh registry: one table of named accelerator meshes and the hardware facts behind them.

Each entry gives the mesh axes (`-1` fills from the device count), the
logical-axis -> mesh-axis rules, and per-device facts for planning (peak bf16
FLOP/s, HBM bytes, devices per host, interconnect). Multi-host GPU and Trainium
meshes take a host-count suffix: `gpu-h100-8x4` is four 8-GPU hosts.

To add an entry, add a row to `_GPU`, `_TPU` or `_NEURON` below (or an `Entry`
to `_OTHER`), then regenerate the table in docs/meshes.md with
`python -m trainer.meshes --write-docs` (tests/test_meshes.py fails while the
table and this file disagree).
"""

from __future__ import annotations

import dataclasses
import re

from core.registry import ConfigError, suggest

AXES = ("data", "fsdp", "model")

# Logical axis -> mesh axes. Parameter names on the left come from the layer
# library; `act_*` names are activations. Each mesh axis is used at most once
# per array (flax skips an axis that an earlier dimension took).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("act_batch", ("data", "fsdp")),
    ("act_length", None),
    ("act_embed", None),
    ("act_heads", "model"),
    ("act_mlp", "model"),
    ("act_vocab", "model"),
    ("embed", "fsdp"),
    ("vocab", "model"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("mlp", "model"),
    ("experts", None),
    ("act_experts", None),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
)


@dataclasses.dataclass(frozen=True)
class Hardware:
  platform: str  # jax platform: cpu / gpu / tpu / neuron
  device_kind: str  # regex matched against jax.devices()[0].device_kind
  devices_per_host: int  # jax devices on one host
  peak_bf16_flops: float | None  # dense bf16 FLOP/s per device (None: not published / CPU)
  hbm_bytes: int | None  # accelerator memory per device
  interconnect: str  # between devices (and hosts)


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  hardware: Hardware
  axes: tuple[tuple[str, int], ...]  # ((axis, size), ...); one size may be -1
  num_hosts: int = 1
  rules: tuple = DEFAULT_RULES

  @property
  def num_devices(self) -> int | None:
    per_host = self.hardware.devices_per_host
    return None if per_host <= 0 else per_host * self.num_hosts


GiB = 1024 ** 3
GB = 1000 ** 3

# (name, device_kind regex, devices/host, peak bf16 FLOP/s, HBM bytes, interconnect)
# Sources: NVIDIA A100/H100/H200/B200 datasheets (dense, without sparsity); the A100
# row is the 80 GB part. `\b` keeps "GH200" (Grace Hopper) from matching H200.
_GPU = (
    ("gpu-a100-8", r"\bA100", 8, 312e12, 80 * GB, "NVLink3 600 GB/s per GPU"),
    ("gpu-h100-8", r"\bH100", 8, 989e12, 80 * GB, "NVLink4 900 GB/s per GPU"),
    ("gpu-h200-8", r"\bH200", 8, 989e12, 141 * GB, "NVLink4 900 GB/s per GPU"),
    ("gpu-b200-8", r"\bB200", 8, 2250e12, 180 * GB, "NVLink5 1.8 TB/s per GPU"),
)
# (family, device_kind regex, chips on a single-host slice, chips per host of a
#  multi-host slice, peak bf16 FLOP/s per chip, HBM per chip, interconnect,
#  TensorCores per chip in the name, slice sizes). Slice names follow Cloud TPU:
#  v4 and v5p count TensorCores (2 per chip, one jax device per chip), v5e and v6e
#  count chips (v5litepod-8 / v6e-8 are one 8-chip host; larger slices use 4-chip
#  hosts). Source: Cloud TPU system-architecture docs.
_TPU = (
    ("tpu-v4", r"TPU v4", 4, 4, 275e12, 32 * GiB, "ICI 3D torus", 2, (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)),
    ("tpu-v5e", r"TPU v5 ?lite|TPU v5e", 8, 4, 197e12, 16 * GiB, "ICI 2D torus", 1, (1, 4, 8, 16, 32, 64, 128, 256)),
    ("tpu-v5p", r"TPU v5p|TPU v5$", 4, 4, 459e12, 95 * GiB, "ICI 3D torus", 2, (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288)),
    ("tpu-v6e", r"TPU v6 ?lite|TPU v6e", 8, 4, 918e12, 32 * GiB, "ICI 2D torus", 1, (1, 4, 8, 16, 32, 64, 128, 256)),
)
# Trainium: one jax device per (logical) NeuronCore. trn1.32xlarge: 16 chips x 2 cores,
# 190 TFLOP/s bf16 and 32 GiB per chip. trn2.48xlarge: 16 chips x 4 logical cores
# (LNC=2), 667 TFLOP/s bf16 and 96 GiB per chip. Source: AWS Neuron docs.
_NEURON = (
    ("neuron-trn1-32", r"NC_v2|trn1|Trainium1", 32, 95e12, 16 * GiB, "NeuronLink 384 GB/s per chip, EFA between hosts"),
    ("neuron-trn2-64", r"NC_v3|trn2|Trainium2", 64, 166.75e12, 24 * GiB, "NeuronLink 1 TB/s per chip, EFA between hosts"),
)

_OTHER = (
    Entry("cpu", Hardware("cpu", r"cpu", -1, None, None, "host memory"),
          (("data", -1), ("fsdp", 1), ("model", 1))),
    Entry("gpu", Hardware("gpu", r".*", -1, None, None, "unknown"),
          (("data", 1), ("fsdp", -1), ("model", 1))),
    Entry("tpu", Hardware("tpu", r".*", -1, None, None, "ICI"),
          (("data", 1), ("fsdp", -1), ("model", 1))),
    Entry("neuron", Hardware("neuron", r".*", -1, None, None, "NeuronLink"),
          (("data", 1), ("fsdp", -1), ("model", 1))),
)


def _build_table() -> dict[str, Entry]:
  table = {e.name: e for e in _OTHER}
  for name, kind, per_host, flops, hbm, link in _GPU:
    # Within a host FSDP over NVLink; across hosts data parallel (hybrid sharding).
    table[name] = Entry(name, Hardware("gpu", kind, per_host, flops, hbm, link),
                        (("data", 1), ("fsdp", -1), ("model", 1)))
  for family, kind, single_host, multi_host, flops, hbm, link, cores_per_chip, sizes in _TPU:
    for size in sizes:
      chips = size // cores_per_chip
      per_host = chips if chips <= single_host else multi_host
      hosts = chips // per_host
      hw = Hardware("tpu", kind, per_host, flops, hbm, link)
      table[f"{family}-{size}"] = Entry(f"{family}-{size}", hw,
                                        (("data", 1), ("fsdp", -1), ("model", 1)), hosts)
  for name, kind, per_host, flops, hbm, link in _NEURON:
    table[name] = Entry(name, Hardware("neuron", kind, per_host, flops, hbm, link),
                        (("data", 1), ("fsdp", -1), ("model", 1)))
  return table


MESHES: dict[str, Entry] = _build_table()
_HOSTS = re.compile(r"^(?P<base>.+)x(?P<hosts>\d+)$")


def with_hosts(entry: Entry, hosts: int) -> Entry:
  """A GPU/Trainium entry over `hosts` hosts: FSDP within a host, data parallel across."""
  if hosts == 1:
    return entry
  axes = tuple((a, hosts if a == "data" else n) for a, n in entry.axes)
  return dataclasses.replace(entry, name=f"{entry.name}x{hosts}", num_hosts=hosts, axes=axes)


def lookup(name: str) -> Entry:
  """`NAME` or, for GPU/Trainium hosts, `NAMExHOSTS`."""
  if name in MESHES:
    return MESHES[name]
  m = _HOSTS.match(name)
  if m and m["base"] in MESHES and MESHES[m["base"]].hardware.platform in ("gpu", "neuron"):
    hosts = int(m["hosts"])
    if hosts < 1:
      raise ConfigError(f"--mesh={name}: the host count must be at least 1")
    return with_hosts(MESHES[m["base"]], hosts)
  raise ConfigError(f"--mesh={name}: unknown mesh{suggest(name, MESHES)}; see docs/meshes.md"
                    f" or --mesh=auto")


def check_devices(entry: Entry, device_count: int) -> None:
  """A named entry with a fixed size must match the devices JAX sees."""
  if entry.num_devices is not None and entry.num_devices != device_count:
    hw = entry.hardware
    raise ConfigError(f"--mesh={entry.name} is {entry.num_devices} devices ({hw.devices_per_host}"
                      f" per host x {entry.num_hosts} hosts) but JAX sees {device_count}; pick "
                      f"the entry for these devices (docs/meshes.md) or --mesh=auto")


def auto(platform: str, device_kind: str, device_count: int, process_count: int) -> Entry:
  """The entry for the devices JAX sees: a named one when kind and count match, else generic.

  Several full GPU/Trainium hosts give `NAMExHOSTS`. Devices of a known kind in
  another count (a partial host) get the generic platform entry, carrying that
  kind's hardware facts with the devices actually present.
  """
  partial = None
  for entry in MESHES.values():
    hw = entry.hardware
    if (hw.platform == platform and hw.devices_per_host > 0
        and re.search(hw.device_kind, device_kind, re.IGNORECASE)):
      if entry.num_devices == device_count:
        return entry
      if (platform in ("gpu", "neuron") and process_count > 1
          and device_count == hw.devices_per_host * process_count):
        return with_hosts(entry, process_count)
      partial = partial or hw
  if platform not in MESHES:
    raise ConfigError(f"--mesh=auto: no mesh for platform '{platform}' ({device_kind});"
                      f" pass --mesh=NAME")
  generic = MESHES[platform]
  if partial is None:
    return generic
  hw = dataclasses.replace(partial, devices_per_host=-1)  # not a fixed-size entry
  return dataclasses.replace(generic, hardware=hw)


def markdown_table() -> str:
  """The docs/meshes.md table: one row per registry entry."""
  def num(x, unit, scale):
    return "-" if x is None else f"{x / scale:g} {unit}"
  rows = ["| name | platform | device kind (regex) | devices | hosts | axes | peak bf16 / device "
          "| HBM / device | interconnect |",
          "|---|---|---|---|---|---|---|---|---|"]
  for e in MESHES.values():
    hw = e.hardware
    devices = "all" if e.num_devices is None else str(e.num_devices)
    hosts = "any" if e.num_devices is None else str(e.num_hosts)
    axes = ", ".join(f"{a}={n}" for a, n in e.axes)
    kind = hw.device_kind.replace("|", "\\|")
    rows.append(f"| `{e.name}` | {hw.platform} | `{kind}` | {devices} | {hosts} | {axes} | "
                f"{num(hw.peak_bf16_flops, 'TFLOP/s', 1e12)} | {num(hw.hbm_bytes, *(('GiB', GiB) if (hw.hbm_bytes or 0) % GiB == 0 else ('GB', GB)))} | "
                f"{hw.interconnect} |")
  return "\n".join(rows) + "\n"


DOCS_START = "<!-- mesh-table:start (generated: python -m trainer.meshes --write-docs) -->\n"
DOCS_END = "<!-- mesh-table:end -->"


def docs_with_table(text: str) -> str:
  """`text` (docs/meshes.md) with the generated table between its markers."""
  head, sep, rest = text.partition(DOCS_START)
  _, sep2, tail = rest.partition(DOCS_END)
  if not sep or not sep2:
    raise ValueError("docs/meshes.md lacks the mesh-table markers")
  return head + DOCS_START + markdown_table() + DOCS_END + tail


# -- choosing an entry for a run, and the config's per-mesh rules ----------------------------

def select(name: str) -> Entry:
  """`--mesh=NAME` from the registry (it must fit the devices JAX sees), or `auto`-detected."""
  import jax  # pylint: disable=import-outside-toplevel  (the table above needs no jax)
  if name != "auto":
    entry = lookup(name)
    check_devices(entry, jax.device_count())
    return entry
  device = jax.devices()[0]
  return auto(device.platform, device.device_kind, jax.device_count(), jax.process_count())


def apply_rules(cfg, mesh_name: str, explicit: set[str]) -> str | None:
  """Applies the first of `cfg.mesh.rules` whose regex matches `mesh_name`; returns that regex.

  `cfg` is the run's ConfigDict; paths in `explicit` (command-line overrides) are left as set.
  """
  from ml_collections.config_flags import config_path  # pylint: disable=import-outside-toplevel
  rules = cfg.mesh.rules
  if not isinstance(rules, (tuple, list)):
    raise ConfigError(f"mesh.rules must be a tuple of (regex, {{path: value}}) pairs, got "
                      f"{rules!r:.80}")
  for i, rule in enumerate(rules):
    if (not isinstance(rule, (tuple, list)) or len(rule) != 2 or not isinstance(rule[0], str)
        or not hasattr(rule[1], "items")):
      raise ConfigError(f"mesh.rules[{i}] must be (regex, {{path: value}}), got {rule!r:.80}")
  for regex, changes in rules:
    try:
      matched = re.fullmatch(regex, mesh_name)
    except re.error as e:
      raise ConfigError(f"mesh.rules: bad regex '{regex}': {e}") from None
    if not matched:
      continue
    for path, value in changes.items():
      if path in explicit:
        continue
      try:
        config_path.set_value(path, cfg, value)
      except (KeyError, AttributeError, IndexError):
        parent, _, leaf = path.rpartition(".")
        try:
          keys = list(config_path.get_value(parent, cfg).keys()) if parent else list(cfg.keys())
        except (KeyError, AttributeError, IndexError):
          keys = []
        raise ConfigError(f"mesh rule '{regex}': unknown key '{path}'{suggest(leaf, keys)}"
                          ) from None
      except (TypeError, ValueError) as e:
        raise ConfigError(f"mesh rule '{regex}': {path}={value!r}: {' '.join(str(e).split())}"
                          ) from None
    return regex
  return None


if __name__ == "__main__":
  import pathlib
  import sys
  docs = pathlib.Path(__file__).resolve().parents[1] / "docs" / "meshes.md"
  if sys.argv[1:] == ["--write-docs"]:
    docs.write_text(docs_with_table(docs.read_text()))
  else:
    sys.stdout.write(markdown_table())
