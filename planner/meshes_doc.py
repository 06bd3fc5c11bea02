"""docs/meshes.md's tables, generated from trainer/meshes.py: every mesh entry, and each GPU
row's chip as the GPU compiler is told it (planner/gpu_targets.py).

    python -m planner.meshes_doc           # print the tables
    python -m planner.meshes_doc --write   # rewrite them between their markers in docs/meshes.md
"""

from __future__ import annotations

import pathlib
import sys

from planner.gpu_targets import CAPABILITIES
from trainer.meshes import GB, MESHES, GiB, MiB

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "meshes.md"
START = "<!-- mesh-table:start (generated: python -m planner.meshes_doc --write) -->\n"
END = "<!-- mesh-table:end -->"
GPU_START = "<!-- gpu-table:start (generated: python -m planner.meshes_doc --write) -->\n"
GPU_END = "<!-- gpu-table:end -->"


def _num(x, unit, scale):
  return "-" if x is None else f"{x / scale:g} {unit}"


def _bytes(n):
  return _num(n, *(("GiB", GiB) if (n or 0) % GiB == 0 else ("GB", GB)))


def markdown_table() -> str:
  """One row per registry entry."""
  rows = ["| name | platform | device kind (regex) | devices | hosts | axes | TPU topology "
          "| peak bf16 / device | HBM / device | HBM bandwidth | link / device (one way) "
          "| between hosts / device | interconnect |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for e in MESHES.values():
    hw = e.hardware
    devices = "all" if e.num_devices is None else str(e.num_devices)
    hosts = "any" if e.num_devices is None else str(e.num_hosts)
    axes = ", ".join(f"{a}={n}" for a, n in e.axes)
    kind = hw.device_kind.replace("|", "\\|")
    rows.append(f"| `{e.name}` | {hw.platform} | `{kind}` | {devices} | {hosts} | {axes} | "
                f"{e.topology or '-'} | {_num(hw.peak_bf16_flops, 'TFLOP/s', 1e12)} | "
                f"{_bytes(hw.hbm_bytes)} | {_num(hw.hbm_bandwidth, 'GB/s', 1e9)} | "
                f"{_num(hw.link_bandwidth, 'GB/s', 1e9)} | {_num(hw.host_bandwidth, 'GB/s', 1e9)}"
                f" | {hw.interconnect} |")
  return "\n".join(rows) + "\n"


def gpu_table() -> str:
  """One row per GPU row of the registry: its chip and the limits of its compute capability."""
  rows = ["| name | CUDA name | compute capability | SMs | FP32 cores / SM | L2 | boost clock "
          "| threads / SM | shared memory / SM | source |",
          "|---|---|---|---|---|---|---|---|---|---|"]
  for e in MESHES.values():
    chip = e.hardware.gpu
    if chip is None:
      continue
    lim = CAPABILITIES.get(tuple(chip.compute_capability))
    per_cc = ((str(lim.fp32_cores_per_sm), str(lim.threads_per_sm),
               f"{lim.shared_memory_per_sm // 1024} KiB") if lim else ("-", "-", "-"))
    rows.append(f"| `{e.name}` | {chip.cuda_name} | "
                f"{'.'.join(map(str, chip.compute_capability))} | {chip.sm_count} | {per_cc[0]} | "
                f"{chip.l2_bytes / MiB:g} MiB | {chip.boost_clock_ghz:g} GHz | {per_cc[1]} | "
                f"{per_cc[2]} | {chip.source} |")
  return "\n".join(rows) + "\n"


def _between(text: str, start: str, end: str, table: str) -> str:
  head, sep, rest = text.partition(start)
  _, sep2, tail = rest.partition(end)
  if not sep or not sep2:
    raise ValueError(f"docs/meshes.md lacks the markers {start.strip()} ... {end}")
  return head + start + table + end + tail


def docs_with_table(text: str) -> str:
  """`text` (docs/meshes.md) with the generated tables between their markers."""
  return _between(_between(text, START, END, markdown_table()), GPU_START, GPU_END, gpu_table())


if __name__ == "__main__":
  if sys.argv[1:] == ["--write"]:
    DOCS.write_text(docs_with_table(DOCS.read_text()))
  else:
    sys.stdout.write(markdown_table() + "\n" + gpu_table())
