"""The GPUs `axtrain plan` compiles for without one: XLA's GPU compiler, told what the GPU is.

The jax-cuda12 plugin makes compile-only GPU devices from a topology ("1xHxD": H hosts of D
GPUs) and a GpuTargetConfig text proto describing one GPU (openxla/xla PR 16913; jax issue
28376). `target_config` writes that text for a GPU mesh entry from its row in trainer/meshes.py
(memory bytes and bandwidth from NVIDIA's datasheets; its chip, `Hardware.gpu`: CUDA name,
compute capability, SMs, L2, clock) and the limits of the chip's compute capability below, so a
GPU row with its chip is all a new GPU needs.

Sources, by the letters used in the table:
  [CUDA]    CUDA C++ Programming Guide, "Compute Capabilities": per compute capability, threads,
            registers and shared memory limits, and FP32 operations per clock per SM.
  [XLA]     XLA's own target configs, CUDA's device query of one GPU of each capability
            (xla/backends/gpu/target_config/specs: v100, a100_sxm_80, a6000, h100_sxm, b200,
            b300, rtx6000pro): the same figures, in the units of the proto.
  [PLUGIN]  what the jax-cuda12 0.10.2 plugin was built with
            (jax_cuda12_plugin._versions: CUDA runtime 12.9, cuDNN 9.8).
"""

from __future__ import annotations

import dataclasses

from core.registry import ConfigError
from trainer.meshes import Entry, GpuChip

PLUGIN_VERSION = "0.10.2"  # jax-cuda12-plugin and jax-cuda12-pjrt: jaxlib's version
PLUGIN_INSTALL = (f"pip install 'jax-cuda12-plugin=={PLUGIN_VERSION}' "
                  f"'jax-cuda12-pjrt=={PLUGIN_VERSION}' (or `make install`)")
CUDA_RUNTIME = (12, 9, 0)  # [PLUGIN] cuda_runtime_build_version 12090
CUDNN = (9, 8, 0)  # [PLUGIN] cudnn_build_version 90800


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
  """Per compute capability [CUDA]: what every capability since 7.0 shares has defaults."""
  threads_per_block: int = 1024
  threads_per_warp: int = 32
  threads_per_sm: int
  registers_per_sm: int = 65536  # 32-bit registers
  registers_per_block: int = 65536
  shared_memory_per_block: int = 48 * 1024  # bytes without opting in
  shared_memory_per_sm: int  # bytes
  shared_memory_per_block_optin: int  # bytes a kernel may opt in to
  fp32_cores_per_sm: int  # 32-bit floating-point multiply-adds per clock per SM


KiB = 1024
_HOPPER_AND_LATER = Limits(threads_per_sm=2048, shared_memory_per_sm=228 * KiB,
                           shared_memory_per_block_optin=227 * KiB, fp32_cores_per_sm=128)
# [CUDA], and [XLA] where it has a GPU of that capability (all but 8.9).
CAPABILITIES = {
    (7, 0): Limits(threads_per_sm=2048, shared_memory_per_sm=96 * KiB,  # V100
                   shared_memory_per_block_optin=96 * KiB, fp32_cores_per_sm=64),
    (8, 0): Limits(threads_per_sm=2048, shared_memory_per_sm=164 * KiB,  # A100
                   shared_memory_per_block_optin=163 * KiB, fp32_cores_per_sm=64),
    (8, 6): Limits(threads_per_sm=1536, shared_memory_per_sm=100 * KiB,  # A10, A40, RTX A6000
                   shared_memory_per_block_optin=99 * KiB, fp32_cores_per_sm=128),
    (8, 9): Limits(threads_per_sm=1536, shared_memory_per_sm=100 * KiB,  # L4, L40S
                   shared_memory_per_block_optin=99 * KiB, fp32_cores_per_sm=128),
    (9, 0): _HOPPER_AND_LATER,  # H100, H200
    (10, 0): _HOPPER_AND_LATER,  # B200
    (10, 3): _HOPPER_AND_LATER,  # B300
    (12, 0): Limits(threads_per_sm=1536, shared_memory_per_sm=128 * KiB,  # RTX PRO 6000
                    shared_memory_per_block_optin=99 * KiB, fp32_cores_per_sm=128),
}


def for_entry(entry: Entry) -> tuple[GpuChip, Limits]:
  """The entry's chip and the limits of its compute capability (one-line errors if unknown)."""
  hw = entry.hardware
  if hw.platform != "gpu" or hw.gpu is None or not (hw.hbm_bytes and hw.hbm_bandwidth):
    raise ConfigError(f"--mesh={entry.name}: no GPU chip description in its mesh row (its "
                      f"`gpu=GpuChip(...)`, memory and bandwidth); add them to its row of "
                      f"trainer/meshes.py:_GPU")
  limits = CAPABILITIES.get(tuple(hw.gpu.compute_capability))
  if limits is None:
    known = ", ".join(f"{a}.{b}" for a, b in CAPABILITIES)
    raise ConfigError(f"--mesh={entry.name}: no limits for compute capability "
                      f"{'.'.join(map(str, hw.gpu.compute_capability))} (known: {known}); add "
                      f"them to planner/gpu_targets.py:CAPABILITIES")
  return hw.gpu, limits


def topology(entry: Entry) -> str:
  """The plugin's topology name: 1 slice x hosts x GPUs per host."""
  return f"1x{entry.num_hosts}x{entry.hardware.devices_per_host}"


def target_config(entry: Entry) -> str:
  """The GpuTargetConfig text proto of one GPU of `entry`."""
  t, lim = for_entry(entry)
  hw = entry.hardware
  major, minor = t.compute_capability
  fields = {
      "threads_per_block_limit": lim.threads_per_block,
      "threads_per_warp": lim.threads_per_warp,
      "shared_memory_per_block": lim.shared_memory_per_block,
      "shared_memory_per_core": lim.shared_memory_per_sm,
      "threads_per_core_limit": lim.threads_per_sm,
      "core_count": t.sm_count,
      "fpus_per_core": lim.fp32_cores_per_sm,
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
          f'device_description_str: "{t.cuda_name}"\n')
