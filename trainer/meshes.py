"""The mesh registry: one table of named accelerator meshes and the hardware facts behind them.

Each entry gives the mesh axes (`-1` fills from the device count), the
logical-axis -> mesh-axis rules, and per-device facts for planning (peak bf16
FLOP/s, HBM bytes and bandwidth, link bandwidths, devices per host; TPU slices
also their libtpu topology for `axtrain plan`). Multi-host GPU and Trainium
meshes take a host-count suffix: `gpu-h100-8x4` is four 8-GPU hosts.

To add an entry, add a row to `_GPU` (with its chip, `GpuChip`), `_TPU` or `_NEURON` below
(or an `Entry` to `_GENERIC`), then regenerate the tables in docs/meshes.md with
`python -m planner.registry_docs` (tests/test_registry_docs.py fails while the
table and this file disagree).
"""

from __future__ import annotations

import dataclasses
import math
import re

from core.registry import ConfigError, suggest

# Mesh axes, slowest link first: `data` and `stage` may span hosts (or TPU slices), `model`
# never does. An axis that a mesh entry does not list has size 1. `expert` holds whole experts
# of a MoE layer (expert parallelism); everywhere else it acts as more data/FSDP: it splits the
# batch and, after the experts took it, the `embed` side of the weights.
AXES = ("data", "stage", "fsdp", "expert", "context", "model")

# Logical axis -> mesh axes. Parameter names on the left come from the layer
# library; `act_*` names are activations. Each mesh axis is used at most once
# per array: flax goes down the rules in order and skips a rule whose mesh axes an earlier
# rule gave to another dimension, so `experts` takes `expert` before `embed` can, and expert
# weights fall back to `embed` over `fsdp` (and `context`) alone.
# `context` splits sequences (act_length) and, like fsdp, the parameters' `embed` side;
# `stage` splits the scanned layer stack (`layers`) into pipeline stages, and outside the
# stages (embedding, LM head, loss) the batch like `data`.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "stage", "fsdp", "expert")),
    ("act_batch", ("data", "stage", "fsdp", "expert")),
    ("act_length", "context"),
    ("act_embed", None),
    ("act_heads", "model"),
    ("act_mlp", "model"),
    ("act_vocab", "model"),
    ("experts", "expert"),
    ("act_experts", "expert"),
    ("embed", ("fsdp", "expert", "context")),
    ("embed", ("fsdp", "context")),
    ("vocab", "model"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("mlp", "model"),
    ("head_dim", None),
    ("qkv", None),  # a fused q/k/v kernel's query heads, key and value (attention.fused_qkv)
    ("gate_up", None),  # a fused MLP kernel's gate and up (mlp.fused_gate_up)
    ("layers", "stage"),
    ("norm", None),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuChip:
  """One GPU as XLA's GPU compiler is told what it is (`axtrain plan` compiles for it without
  one: planner/gpu_targets.py adds the limits of its compute capability and the row's memory)."""
  cuda_name: str  # CUDA's device name: jax's device_kind, which the row's regex matches
  compute_capability: tuple[int, int]  # (major, minor): CUDA C++ Programming Guide
  sm_count: int  # streaming multiprocessors
  l2_bytes: int  # L2 cache
  boost_clock_ghz: float
  source: str  # where these figures come from


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hardware:
  platform: str  # jax platform: cpu / gpu / tpu / neuron
  device_kind: str  # regex matched against jax.devices()[0].device_kind
  devices_per_host: int  # jax devices on one host (-1: any number, a generic entry)
  peak_bf16_flops: float | None = None  # dense bf16 FLOP/s per device (None: unknown / CPU)
  # Dense int8 and fp8 OP/s per device (the quantized matmuls of model.quantization; None: the
  # chip has none, or no figure is known here: the plan times such dots at the bf16 peak).
  peak_int8_flops: float | None = None
  peak_fp8_flops: float | None = None
  hbm_bytes: int | None = None  # accelerator memory per device
  hbm_bandwidth: float | None = None  # memory bytes/s per device
  link_bandwidth: float | None = None  # device-to-device bytes/s per device, one direction
  host_bandwidth: float | None = None  # bytes/s per device between hosts (network), one direction
  # Host RAM per device (the host's divided among its devices): where trainer.state_memory
  # "host" keeps the train state (`axtrain plan` checks a host's RAM in each phase of a run,
  # saves and restores included: planner/host_ram.py).
  host_memory_bytes: int | None = None
  interconnect: str = "unknown"  # between devices (and hosts), in words
  source: str = ""  # where the figures come from
  gpu: GpuChip | None = None  # a GPU row's chip, for the GPU compiler

  def peak_flops(self, dtype: str = "") -> float | None:
    """Dense peak of a matmul whose operands are `dtype` ("int8", "fp8"; "": bf16), falling
    back to the bf16 peak where the row has no figure for it."""
    narrow = {"int8": self.peak_int8_flops, "fp8": self.peak_fp8_flops}.get(dtype)
    return narrow or self.peak_bf16_flops


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
  name: str
  hardware: Hardware
  # ((axis, size), ...), one size may be -1. Default: FSDP over every device of one host; with
  # several hosts the data axis spans them (with_hosts).
  axes: tuple[tuple[str, int], ...] = (("data", 1), ("fsdp", -1), ("model", 1))
  num_hosts: int = 1
  rules: tuple = DEFAULT_RULES
  topology: str | None = None  # TPU slice shape for libtpu's compiler, e.g. "v5e:4x4"
  # More of libtpu's compile-only topology options: the chips of one host (a host of 1 or 8
  # v5e chips is not its default 2x2x1) and, for v4, one device per chip (megacore).
  topology_options: tuple[tuple[str, object], ...] = ()
  num_slices: int = 1  # TPU slices joined by the data-center network (NAMExSLICES)

  @property
  def num_devices(self) -> int | None:
    per_host = self.hardware.devices_per_host
    return None if per_host <= 0 else per_host * self.num_hosts


GiB = 1024 ** 3
MiB = 1024 ** 2
GB = 1000 ** 3
GBps = 1e9  # bytes/s

# Sources: NVIDIA A100/H100/H200/B200 datasheets (dense, without sparsity; SXM parts; the A100
# row is the 80 GB part; int8 and fp8 dense: half the datasheets' sparse figures; A100 has no
# fp8). NVLink figures are the datasheets' bidirectional totals, halved for
# one direction; between hosts, one 400 Gb/s (A100: 200 Gb/s) InfiniBand NIC per GPU as in
# DGX / p5 systems. `\b` keeps "GH200" (Grace Hopper) from matching H200. Chips: NVIDIA's
# architecture whitepapers (SMs, L2, boost clock), CUDA's name of the part.
_GPU = {
    "gpu-a100-8": Hardware(
        platform="gpu", device_kind=r"\bA100", devices_per_host=8, peak_bf16_flops=312e12,
        peak_int8_flops=624e12,
        hbm_bytes=80 * GB, hbm_bandwidth=2039 * GBps, link_bandwidth=300 * GBps,
        host_bandwidth=25 * GBps, interconnect="NVLink3 600 GB/s per GPU",
        host_memory_bytes=1024 * GB // 8,
        source="NVIDIA A100 datasheet; DGX A100 (1 TB system memory)",
        gpu=GpuChip(cuda_name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), sm_count=108,
                    l2_bytes=40 * MiB, boost_clock_ghz=1.41,
                    source="NVIDIA A100 Tensor Core GPU Architecture whitepaper (A100 SXM4)")),
    "gpu-h100-8": Hardware(
        platform="gpu", device_kind=r"\bH100", devices_per_host=8, peak_bf16_flops=989e12,
        peak_int8_flops=1979e12, peak_fp8_flops=1979e12,
        hbm_bytes=80 * GB, hbm_bandwidth=3350 * GBps, link_bandwidth=450 * GBps,
        host_bandwidth=50 * GBps, interconnect="NVLink4 900 GB/s per GPU",
        host_memory_bytes=2048 * GB // 8,
        source="NVIDIA H100 SXM datasheet; DGX H100 (2 TB system memory)",
        gpu=GpuChip(cuda_name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132,
                    l2_bytes=50 * MiB, boost_clock_ghz=1.98,
                    source="NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5)")),
    "gpu-h200-8": Hardware(
        platform="gpu", device_kind=r"\bH200", devices_per_host=8, peak_bf16_flops=989e12,
        peak_int8_flops=1979e12, peak_fp8_flops=1979e12,
        hbm_bytes=141 * GB, hbm_bandwidth=4800 * GBps, link_bandwidth=450 * GBps,
        host_bandwidth=50 * GBps, interconnect="NVLink4 900 GB/s per GPU",
        host_memory_bytes=2048 * GB // 8,
        source="NVIDIA H200 SXM datasheet; DGX H200 (2 TB system memory)",
        gpu=GpuChip(cuda_name="NVIDIA H200", compute_capability=(9, 0), sm_count=132,
                    l2_bytes=50 * MiB, boost_clock_ghz=1.98,
                    source="H100 whitepaper: the same GH100 chip as H100 SXM5, with HBM3e")),
    "gpu-b200-8": Hardware(
        platform="gpu", device_kind=r"\bB200", devices_per_host=8, peak_bf16_flops=2250e12,
        peak_int8_flops=4500e12, peak_fp8_flops=4500e12,
        hbm_bytes=180 * GB, hbm_bandwidth=8000 * GBps, link_bandwidth=900 * GBps,
        host_bandwidth=50 * GBps, interconnect="NVLink5 1.8 TB/s per GPU",
        host_memory_bytes=2048 * GB // 8,
        source="NVIDIA DGX B200 datasheet (2 TB system memory)",
        gpu=GpuChip(cuda_name="NVIDIA B200", compute_capability=(10, 0), sm_count=148,
                    l2_bytes=int(126.5 * MiB), boost_clock_ghz=1.965,
                    source="NVIDIA Blackwell technical brief; XLA's b200 target spec")),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TpuFamily:
  """One TPU generation; every slice size becomes an entry `{name}-{size}`."""
  name: str  # tpu-v5e
  chip: Hardware  # devices_per_host: chips per host of a multi-host slice
  single_host: int  # chips on a single-host slice
  cores_per_chip: int  # TensorCores per chip counted in the slice name
  sizes: tuple[int, ...]  # slice names' sizes
  dims: int  # torus dimensions (2 or 3), for the libtpu topology name
  libtpu_name: str  # the generation in libtpu topology names ("v5e" in "v5e:4x4")
  # libtpu's chip config that makes one jax device per chip of a 2-core chip ("megacore"), where
  # its default is one device per TensorCore (v4); "" where one device per chip is the default.
  chip_config: str = ""

  def topology(self, chips: int) -> str:
    """Cloud TPU's slice shape: 2D a x b (a <= b); 3D from 2x2x1, doubling the smallest axis."""
    if self.dims == 2:
      a = 1
      while a * a * 4 <= chips:
        a *= 2
      shape = [a, chips // a]
    else:
      odd = chips // (chips & -chips)  # 12288 cores = 6144 chips = 2048 x 3: 16x16x24
      shape = [1, 1, 1] if chips == 1 else [2, 1, 1] if chips == 2 else [2, 2, 1]
      while math.prod(shape) * odd < chips:
        shape[max(j for j in range(3) if shape[j] == min(shape))] *= 2
      if odd > 1:
        shape[shape.index(min(shape))] *= odd
        shape.sort()
    return f"{self.libtpu_name}:{'x'.join(map(str, shape))}"

  def topology_options(self, chips_per_host: int) -> tuple[tuple[str, object], ...]:
    """libtpu's options beside the topology name: one host's chips as its x, y, z bounds (the
    shape of a slice of that many chips), and the chip config."""
    host = tuple(int(n) for n in self.topology(chips_per_host).split(":")[1].split("x"))
    options = (("chips_per_host_bounds", (*host, 1)[:3]),)
    return options + ((("chip_config_name", self.chip_config),) if self.chip_config else ())


# Slice names follow Cloud TPU: v4 and v5p count TensorCores (2 per chip, one jax device
# per chip), v5e and v6e count chips (v5litepod-8 / v6e-8 are one 8-chip host; larger
# slices use 4-chip hosts). Source: Cloud TPU system-architecture pages (per chip: peak
# bf16 and int8, HBM capacity and bandwidth, ICI bandwidth; ICI halved for one direction).
# int8: v5e 394, v5p 918, v6e 1836 TOPS, twice bf16 (v4's page gives no separate int8 figure:
# its int8 dots are timed at the bf16 peak). No TPU here has fp8 matmul units.
_TPU = (
    TpuFamily(name="tpu-v4", single_host=4, cores_per_chip=2, dims=3, libtpu_name="v4",
              chip_config="megacore",
              sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
              chip=Hardware(platform="tpu", device_kind=r"TPU v4", devices_per_host=4,
                            peak_bf16_flops=275e12, hbm_bytes=32 * GiB,
                            hbm_bandwidth=1200 * GBps, link_bandwidth=150 * GBps,
                            host_memory_bytes=400 * GB // 4,
                            interconnect="ICI 3D torus, 2400 Gb/s per chip",
                            source="Cloud TPU v4 docs (host: 4 chips, 400 GB)")),
    TpuFamily(name="tpu-v5e", single_host=8, cores_per_chip=1, dims=2, libtpu_name="v5e",
              sizes=(1, 4, 8, 16, 32, 64, 128, 256),
              chip=Hardware(platform="tpu", device_kind=r"TPU v5 ?lite|TPU v5e",
                            devices_per_host=4, peak_bf16_flops=197e12, hbm_bytes=16 * GiB,
                            peak_int8_flops=394e12,
                            hbm_bandwidth=819 * GBps, link_bandwidth=100 * GBps,
                            host_bandwidth=3.125 * GBps, host_memory_bytes=48 * GB,
                            interconnect="ICI 2D torus, 1600 Gb/s per chip; DCN between slices",
                            source="Cloud TPU v5e docs (DCN: 6.4 Tb/s per 256-chip pod; host "
                                   "RAM 48 GB per chip: ct5lp-hightpu-1t 48 GB, -4t 192 GB, "
                                   "-8t 400 GB)")),
    TpuFamily(name="tpu-v5p", single_host=4, cores_per_chip=2, dims=3, libtpu_name="v5p",
              sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288),
              chip=Hardware(platform="tpu", device_kind=r"TPU v5p|TPU v5$", devices_per_host=4,
                            peak_bf16_flops=459e12, hbm_bytes=95 * GiB, peak_int8_flops=918e12,
                            hbm_bandwidth=2765 * GBps, link_bandwidth=300 * GBps,
                            host_bandwidth=6.25 * GBps, host_memory_bytes=448 * GB // 4,
                            interconnect="ICI 3D torus, 4800 Gb/s per chip; DCN between slices",
                            source="Cloud TPU v5p docs (DCN: 50 Gb/s per chip; host: 4 chips, "
                                   "448 GB)")),
    TpuFamily(name="tpu-v6e", single_host=8, cores_per_chip=1, dims=2, libtpu_name="v6e",
              sizes=(1, 4, 8, 16, 32, 64, 128, 256),
              chip=Hardware(platform="tpu", device_kind=r"TPU v6 ?lite|TPU v6e",
                            devices_per_host=4, peak_bf16_flops=918e12, hbm_bytes=32 * GiB,
                            peak_int8_flops=1836e12,
                            hbm_bandwidth=1640 * GBps, link_bandwidth=224 * GBps,
                            host_bandwidth=12.5 * GBps, host_memory_bytes=180 * GB,
                            interconnect="ICI 2D torus, 3584 Gb/s per chip; DCN between slices",
                            source="Cloud TPU v6e docs (DCN: 25.6 Tb/s per 256-chip pod; host "
                                   "RAM 180 GB per chip: ct6e-standard-4t 720 GB)")),
)
# Trainium: one jax device per (logical) NeuronCore. trn1.32xlarge: 16 chips x 2 cores,
# 190 TFLOP/s bf16, 32 GiB and 820 GB/s HBM per chip, NeuronLink-v2 384 GB/s per chip,
# 800 Gb/s EFA per host. trn2.48xlarge: 16 chips x 4 logical cores (LNC=2), 667 TFLOP/s
# bf16, 96 GiB and 2.9 TB/s HBM per chip, NeuronLink-v3 1 TB/s per chip, 3.2 Tb/s EFA per
# host; host memory 512 GiB (trn1.32xlarge) and 2 TiB (trn2.48xlarge). Per-device figures
# divide the chip's by its cores. Source: AWS Neuron docs.
_NEURON = {
    "neuron-trn1-32": Hardware(
        platform="neuron", device_kind=r"NC_v2|trn1|Trainium1", devices_per_host=32,
        peak_bf16_flops=95e12, hbm_bytes=16 * GiB, hbm_bandwidth=410 * GBps,
        link_bandwidth=96 * GBps, host_bandwidth=3.125 * GBps, host_memory_bytes=512 * GiB // 32,
        interconnect="NeuronLink 384 GB/s per chip, EFA between hosts",
        source="AWS Neuron docs: trn1 architecture"),
    "neuron-trn2-64": Hardware(
        platform="neuron", device_kind=r"NC_v3|trn2|Trainium2", devices_per_host=64,
        peak_bf16_flops=166.75e12, hbm_bytes=24 * GiB, hbm_bandwidth=725 * GBps,
        link_bandwidth=125 * GBps, host_bandwidth=6.25 * GBps, host_memory_bytes=2048 * GiB // 64,
        interconnect="NeuronLink 1 TB/s per chip, EFA between hosts",
        source="AWS Neuron docs: trn2 architecture"),
}

# Generic entries: whatever devices of a platform JAX sees. CPU is data parallel.
_GENERIC = (
    Entry(name="cpu", hardware=Hardware(platform="cpu", device_kind=r"cpu", devices_per_host=-1,
                                        interconnect="host memory"),
          axes=(("data", -1), ("fsdp", 1), ("model", 1))),
    Entry(name="gpu", hardware=Hardware(platform="gpu", device_kind=r".*", devices_per_host=-1)),
    Entry(name="tpu", hardware=Hardware(platform="tpu", device_kind=r".*", devices_per_host=-1,
                                        interconnect="ICI")),
    Entry(name="neuron", hardware=Hardware(platform="neuron", device_kind=r".*",
                                           devices_per_host=-1, interconnect="NeuronLink")),
)


def _build_table() -> dict[str, Entry]:
  """Every entry by name. Within a host FSDP over the fast links (the default axes); across
  hosts data parallel (hybrid sharding, see with_hosts)."""
  table = {e.name: e for e in _GENERIC}
  for name, hw in {**_GPU, **_NEURON}.items():
    table[name] = Entry(name=name, hardware=hw)
  for family in _TPU:
    for size in family.sizes:
      chips = size // family.cores_per_chip
      per_host = chips if chips <= family.single_host else family.chip.devices_per_host
      hw = dataclasses.replace(family.chip, devices_per_host=per_host)
      table[f"{family.name}-{size}"] = Entry(name=f"{family.name}-{size}", hardware=hw,
                                            num_hosts=chips // per_host,
                                            topology=family.topology(chips),
                                            topology_options=family.topology_options(per_host))
  return table


MESHES: dict[str, Entry] = _build_table()
# Platforms whose named entries take a host-count suffix (NAMExHOSTS): hosts of a fixed size.
MULTI_HOST_PLATFORMS = tuple(sorted({e.hardware.platform for e in MESHES.values()
                                     if e.topology is None and e.num_devices is not None}))
_HOSTS = re.compile(r"^(?P<base>.+)x(?P<hosts>\d+)$")


def with_hosts(entry: Entry, hosts: int) -> Entry:
  """A GPU/Trainium entry over `hosts` hosts: FSDP within a host, data parallel across."""
  if hosts == 1:
    return entry
  axes = tuple((a, hosts if a == "data" else n) for a, n in entry.axes)
  return dataclasses.replace(entry, name=f"{entry.name}x{hosts}", num_hosts=hosts, axes=axes)


def with_slices(entry: Entry, slices: int) -> Entry:
  """A TPU entry over `slices` slices (Multislice): FSDP within a slice, data parallel across
  them over the data-center network (the chip's host_bandwidth)."""
  if slices == 1:
    return entry
  axes = tuple((a, slices if a == "data" else n) for a, n in entry.axes)
  return dataclasses.replace(entry, name=f"{entry.name}x{slices}", num_slices=slices,
                             num_hosts=entry.num_hosts * slices, axes=axes)


def lookup(name: str) -> Entry:
  """`NAME`; for GPU/Trainium hosts `NAMExHOSTS`; for TPU slices `NAMExSLICES`."""
  if name in MESHES:
    return MESHES[name]
  m = _HOSTS.match(name)
  base = MESHES.get(m["base"]) if m else None
  if base is not None and (base.hardware.platform in MULTI_HOST_PLATFORMS
                           or base.topology is not None):
    count = int(m["hosts"])
    what = "host" if base.topology is None else "slice"
    if count < 1:
      raise ConfigError(f"--mesh={name}: the {what} count must be at least 1")
    if base.topology is None:
      return with_hosts(base, count)
    if base.hardware.host_bandwidth is None:
      raise ConfigError(f"--mesh={name}: {base.name} has no data-center network figure in "
                        f"the registry, so no multi-slice entry; multi-slice: tpu-v5e, "
                        f"tpu-v5p, tpu-v6e")
    return with_slices(base, count)
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
  """The entry for the devices JAX sees: the named one whose kind and count match, else generic.

  Several full GPU/Trainium hosts give `NAMExHOSTS`. Devices of a known kind in another count
  (a partial host) get the generic platform entry, carrying that kind's hardware facts with the
  devices actually present. A match is never a guess: where two entries match (or, for a
  partial host, two kinds of hardware), ConfigError names them and how to pick one.
  """
  kinds = [e for e in MESHES.values()
           if e.hardware.platform == platform and e.hardware.devices_per_host > 0
           and re.search(e.hardware.device_kind, device_kind, re.IGNORECASE)]
  hosts = platform in MULTI_HOST_PLATFORMS and process_count > 1
  whole = [e if e.num_devices == device_count else with_hosts(e, process_count) for e in kinds
           if e.num_devices == device_count
           or (hosts and device_count == e.hardware.devices_per_host * process_count)]
  what = f"{device_count} {platform} device(s) of kind '{device_kind}'"
  if len(whole) > 1:
    names = [e.name for e in whole]
    raise ConfigError(f"--mesh=auto: {what} match {len(names)} mesh entries, "
                      f"{', '.join(names[:-1])} and {names[-1]}; pick one with --mesh=NAME "
                      f"(e.g. --mesh={names[0]})")
  if whole:
    return whole[0]
  if platform not in MESHES:
    raise ConfigError(f"--mesh=auto: no mesh for platform '{platform}' ({device_kind});"
                      f" pass --mesh=NAME")
  generic = MESHES[platform]
  facts = {}  # hardware facts, whatever the host size -> the first entry that has them
  for e in kinds:
    facts.setdefault(dataclasses.replace(e.hardware, devices_per_host=-1), e.name)
  if len(facts) > 1:
    names = list(facts.values())
    raise ConfigError(f"--mesh=auto: {what} match the hardware of {', '.join(names[:-1])} and "
                      f"{names[-1]}, which differ, and no entry of {device_count} devices; "
                      f"pass --mesh={platform} (no hardware facts) or make their device "
                      f"kinds tell them apart (trainer/meshes.py)")
  if not facts:
    return generic
  return dataclasses.replace(generic, hardware=next(iter(facts)))


# -- choosing an entry for a run ------------------------------------------------------------

def select(name: str) -> Entry:
  """`--mesh=NAME` from the registry (it must fit the devices JAX sees), or `auto`-detected."""
  import jax  # pylint: disable=import-outside-toplevel  (the table above needs no jax)
  if name != "auto":
    entry = lookup(name)
    check_devices(entry, jax.device_count())
    return entry
  device = jax.devices()[0]
  return auto(device.platform, device.device_kind, jax.device_count(), jax.process_count())


def check_present(entry: Entry) -> None:
  """ConfigError unless the devices JAX sees are of `entry`'s platform: training on a TPU or GPU
  entry needs those devices here (`axtrain plan` is how to target absent hardware)."""
  import jax  # pylint: disable=import-outside-toplevel
  platform = jax.devices()[0].platform
  if entry.hardware.platform != platform:
    raise ConfigError(f"--mesh={entry.name} is a {entry.hardware.platform} mesh but JAX sees "
                      f"{jax.device_count()} {platform} device(s) here; train here with "
                      f"--mesh={platform} (or --mesh=auto), or plan for that hardware with "
                      f"`axtrain plan --mesh={entry.name}`")
