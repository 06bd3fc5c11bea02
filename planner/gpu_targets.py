"""The GPUs `axtrain plan` compiles for without one: XLA's GPU compiler, told what the GPU is.

The jax-cuda12 plugin makes compile-only GPU devices from a topology ("1xHxD": H hosts of D
GPUs) and a GpuTargetConfig text proto describing one GPU (openxla/xla PR 16913; jax issue
28376). `target_config` writes that text for a GPU mesh entry from two tables: the entry's
hardware row in trainer/meshes.py (memory bytes and bandwidth, from NVIDIA's datasheets) and
the row of `TARGETS` below whose CUDA device name the entry's `device_kind` regex matches.

Sources, by the letters used in the table:
  [W-A100]  NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): SMs, FP32 cores
            per SM, L2, boost clock (A100 SXM4).
  [W-H100]  NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): SMs of H100 SXM5,
            FP32 cores per SM, L2, boost clock. H200 is the same GH100 chip with HBM3e
            (NVIDIA H200 datasheet): the same SM, L2 and clock figures.
  [B-BW]    NVIDIA Blackwell architecture technical brief (2024) and the B200 rows of
            XLA's own target configs (xla/backends/gpu/target_config/specs/b200.txtpb,
            CUDA's device query of a B200): 148 SMs, 126.5 MiB L2, 1.965 GHz.
  [CUDA]    CUDA C++ Programming Guide, "Compute Capabilities" (compute capability of each
            GPU; per compute capability: threads, registers and shared memory limits).
  [PLUGIN]  what the jax-cuda12 0.10.2 plugin was built with
            (jax_cuda12_plugin._versions: CUDA runtime 12.9, cuDNN 9.8).
"""

from __future__ import annotations

import dataclasses
import re

from core.registry import ConfigError
from trainer.meshes import Entry

PLUGIN_VERSION = "0.10.2"  # jax-cuda12-plugin and jax-cuda12-pjrt: jaxlib's version
PLUGIN_INSTALL = (f"pip install 'jax-cuda12-plugin=={PLUGIN_VERSION}' "
                  f"'jax-cuda12-pjrt=={PLUGIN_VERSION}' (or `make install`)")
CUDA_RUNTIME = (12, 9, 0)  # [PLUGIN] cuda_runtime_build_version 12090
CUDNN = (9, 8, 0)  # [PLUGIN] cudnn_build_version 90800


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
  """Per compute capability [CUDA]: the same for 8.0, 9.0 and 10.0 except shared memory."""
  threads_per_block: int = 1024
  threads_per_warp: int = 32
  threads_per_sm: int = 2048
  registers_per_sm: int = 65536  # 32-bit registers
  registers_per_block: int = 65536
  shared_memory_per_block: int = 48 * 1024  # bytes without opting in
  shared_memory_per_sm: int  # bytes
  shared_memory_per_block_optin: int  # bytes a kernel may opt in to


_AMPERE = Limits(shared_memory_per_sm=164 * 1024, shared_memory_per_block_optin=163 * 1024)
_HOPPER_AND_LATER = Limits(shared_memory_per_sm=228 * 1024,
                           shared_memory_per_block_optin=227 * 1024)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuTarget:
  name: str  # the CUDA device name, as jax reports device_kind
  compute_capability: tuple[int, int]  # [CUDA]
  sm_count: int  # streaming multiprocessors
  fp32_cores_per_sm: int
  l2_bytes: int
  boost_clock_ghz: float
  limits: Limits


MiB = 1024 ** 2
TARGETS = (
    # [W-A100] 108 SMs, 64 FP32 cores per SM, 40 MB L2, 1410 MHz boost; [CUDA] 8.0.
    GpuTarget(name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), sm_count=108,
              fp32_cores_per_sm=64, l2_bytes=40 * MiB, boost_clock_ghz=1.41, limits=_AMPERE),
    # [W-H100] H100 SXM5: 132 SMs, 128 FP32 cores per SM, 50 MB L2, 1980 MHz; [CUDA] 9.0.
    GpuTarget(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132,
              fp32_cores_per_sm=128, l2_bytes=50 * MiB, boost_clock_ghz=1.98,
              limits=_HOPPER_AND_LATER),
    # [W-H100] the GH100 chip of H100 SXM5; [CUDA] 9.0.
    GpuTarget(name="NVIDIA H200", compute_capability=(9, 0), sm_count=132,
              fp32_cores_per_sm=128, l2_bytes=50 * MiB, boost_clock_ghz=1.98,
              limits=_HOPPER_AND_LATER),
    # [B-BW] 148 SMs, 128 FP32 cores per SM, 126.5 MiB L2, 1965 MHz; [CUDA] 10.0.
    GpuTarget(name="NVIDIA B200", compute_capability=(10, 0), sm_count=148,
              fp32_cores_per_sm=128, l2_bytes=int(126.5 * MiB), boost_clock_ghz=1.965,
              limits=_HOPPER_AND_LATER),
)


def for_entry(entry: Entry) -> GpuTarget:
  """The target whose CUDA name the entry's device_kind regex matches."""
  hw = entry.hardware
  found = [t for t in TARGETS if re.search(hw.device_kind, t.name, re.IGNORECASE)]
  if hw.platform != "gpu" or len(found) != 1 or not (hw.hbm_bytes and hw.hbm_bandwidth):
    known = ", ".join(t.name for t in TARGETS)
    raise ConfigError(f"--mesh={entry.name}: no GPU target description for device kind "
                      f"'{hw.device_kind}' (known: {known}); add its row to "
                      f"planner/gpu_targets.py:TARGETS")
  return found[0]


def topology(entry: Entry) -> str:
  """The plugin's topology name: 1 slice x hosts x GPUs per host."""
  return f"1x{entry.num_hosts}x{entry.hardware.devices_per_host}"


def target_config(entry: Entry) -> str:
  """The GpuTargetConfig text proto of one GPU of `entry`."""
  t, hw = for_entry(entry), entry.hardware
  lim = t.limits
  major, minor = t.compute_capability
  fields = {
      "threads_per_block_limit": lim.threads_per_block,
      "threads_per_warp": lim.threads_per_warp,
      "shared_memory_per_block": lim.shared_memory_per_block,
      "shared_memory_per_core": lim.shared_memory_per_sm,
      "threads_per_core_limit": lim.threads_per_sm,
      "core_count": t.sm_count,
      "fpus_per_core": t.fp32_cores_per_sm,
      "block_dim_limit_x": 2 ** 31 - 1,
      "block_dim_limit_y": 65535,
      "block_dim_limit_z": 65535,
      "memory_bandwidth": int(hw.hbm_bandwidth),
      "l2_cache_size": t.l2_bytes,
      "clock_rate_ghz": t.boost_clock_ghz,
      "device_memory_size": int(hw.hbm_bytes),
      "shared_memory_per_block_optin": lim.shared_memory_per_block_optin,
      "registers_per_core_limit": lim.registers_per_sm,
      "registers_per_block_limit": lim.registers_per_block,
  }
  info = "\n".join(f"  {k}: {v}" for k, v in fields.items())
  version = lambda v: f"{{ major: {v[0]} minor: {v[1]} patch: {v[2]} }}"
  return (f"gpu_device_info {{\n{info}\n"
          f"  cuda_compute_capability {{ major: {major} minor: {minor} }}\n}}\n"
          f'platform_name: "CUDA"\n'
          f"dnn_version_info {version(CUDNN)}\n"
          f"runtime_version {version(CUDA_RUNTIME)}\n"
          f'device_description_str: "{t.name}"\n')
