"""docs/meshes.md's table of every mesh entry, generated from trainer/meshes.py.

    python -m planner.meshes_doc           # print the table
    python -m planner.meshes_doc --write   # rewrite it between the markers in docs/meshes.md
"""

from __future__ import annotations

import pathlib
import sys

from trainer.meshes import GB, MESHES, GiB

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "meshes.md"
START = "<!-- mesh-table:start (generated: python -m planner.meshes_doc --write) -->\n"
END = "<!-- mesh-table:end -->"


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


def docs_with_table(text: str) -> str:
  """`text` (docs/meshes.md) with the generated table between its markers."""
  head, sep, rest = text.partition(START)
  _, sep2, tail = rest.partition(END)
  if not sep or not sep2:
    raise ValueError("docs/meshes.md lacks the mesh-table markers")
  return head + START + markdown_table() + END + tail


if __name__ == "__main__":
  if sys.argv[1:] == ["--write"]:
    DOCS.write_text(docs_with_table(DOCS.read_text()))
  else:
    sys.stdout.write(markdown_table())
