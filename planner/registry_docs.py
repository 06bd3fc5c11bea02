"""The docs' lists of what the registries hold, rendered from them.

    python -m planner.registry_docs           # render every registry-docs fragment of the docs
    python -m planner.registry_docs --check   # exit 1, naming the docs, where one is stale

A list of kinds, file endings, choices, defaults, allowed ranges or mesh entries in README.md
or docs/*.md is a `<!-- registry-docs:KEY -->` fragment (planner/doc_fragments.py), never
typed by hand: a kind, an ending or a range added to the code reaches the docs by this command,
and tests/test_registry_docs.py fails until it has run. The fragments (`FRAGMENTS`):

    kinds:REGISTRY            `a`, `b` or `c`: the registry's kinds
    slots:PREFIX              a table: each config path under PREFIX that holds a node, its kinds
    choices:REGISTRY.FIELD    `x` or `y`: the values of a Literal field (the same in every kind)
    fields:REGISTRY.KIND      `f` 1, `g` None: the kind's fields and defaults, less those every
                              kind of the registry has with the same default
    refused:REG+REG...        a table: each allowed range (`RANGES`), the fields it holds
    suffixes                  the file endings of each data kind that reads files
    mesh-table, gpu-table     the mesh entries, and the GPU entries' chips
    family-files, hf-map-files  the files of the model families (a size table) and of the
                              Hugging Face maps (modules/hf_maps.py:FAMILIES)
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import typing
from typing import Any, Callable

import modules
import trainer.experiment  # noqa: F401  (registers the layer library, data, optimizers)
from core.registry import child_registry, registry
from modules.hf_maps import FAMILIES
from planner import doc_fragments
from planner.gpu_targets import CAPABILITIES
from trainer.config import RunConfig
from trainer.data.corpus import document_kinds
from trainer.meshes import GB, MESHES, GiB, MiB

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SOURCE = "registry-docs"
FRAGMENT = doc_fragments.pattern(SOURCE)


def _series(items: list[str], last: str = "or") -> str:
  return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def _value(x: Any) -> str:
  if isinstance(x, float):
    return repr(x).replace("e-0", "e-").replace("e+0", "e+")
  return str(x)


def _configs(name: str) -> dict[str, type]:
  reg = registry(name)
  return {k: reg.entry(k).config_cls for k in reg.kinds()}


def kinds(name: str) -> str:
  """The registry's kinds."""
  return _series([f"`{k}`" for k in registry(name).kinds()])


def _slots(cls: type, path: str, seen: dict[str, set[str]], above: tuple[str, ...]) -> None:
  for f in dataclasses.fields(cls):
    reg = child_registry(f)  # (a list of nodes, a mixture's sources, is no slot of one kind)
    if reg is None or f"{path}{f.name}" in seen:
      continue
    seen[f"{path}{f.name}"] = set(reg.kinds())
    if reg.name not in above:  # a registry whose node holds its own kind: walked once
      for kind in reg.kinds():
        _slots(reg.entry(kind).config_cls, f"{path}{f.name}.", seen, (*above, reg.name))


def slots(prefix: str) -> str:
  """The config paths under `prefix` that hold a registry's node, with the kinds each takes."""
  seen: dict[str, set[str]] = {}
  _slots(RunConfig, "", seen, ())
  rows = [f"| `{path}.kind` | {', '.join(f'`{k}`' for k in sorted(kinds_))} |"
          for path, kinds_ in sorted(seen.items()) if path.split(".")[0] == prefix]
  return "\n| slot | kinds |\n|---|---|\n" + "\n".join(rows) + "\n"


def choices(path: str) -> str:
  """The values of the Literal field REGISTRY.FIELD, the same in every kind that has it."""
  name, field = path.split(".")
  found = {typing.get_args(typing.get_type_hints(cls)[field])
           for cls in _configs(name).values() if field in typing.get_type_hints(cls)}
  if len(found) != 1 or not next(iter(found)):
    raise ValueError(f"{path}: no Literal field of one set of values in every {name} kind")
  return _series([f"`{v}`" for v in next(iter(found))])


def _defaults(cls: type) -> dict[str, Any]:
  return {f.name: f.default for f in dataclasses.fields(cls)
          if f.name != "kind" and f.default is not dataclasses.MISSING}


def fields(path: str) -> str:
  """The fields of REGISTRY.KIND with their defaults, less those every kind of the registry has
  with the same default."""
  name, kind = path.split(".")
  every = [_defaults(cls) for cls in _configs(name).values()]
  own = {k: v for k, v in _defaults(_configs(name)[kind]).items()
         if not all(k in d and d[k] == v for d in every)}
  return ", ".join(f"`{k}` {_value(v)}" for k, v in own.items())


def refused(names: str) -> str:
  """A table of the allowed ranges of the registries `names` (REG+REG): for each range, the
  fields that hold it, with the kinds that have the field where not every kind does."""
  rows: dict[str, list[str]] = {}  # range -> the fields that hold it
  for name in names.split("+"):
    configs = _configs(name)
    holders: dict[tuple[str, str], list[str]] = {}
    for kind, cls in configs.items():
      for field, interval in cls.RANGES.items():
        holders.setdefault((str(interval), field), []).append(kind)
    for (interval, field), kinds_ in holders.items():
      rows.setdefault(interval, []).append(
          f"`{field}`" + ("" if len(kinds_) == len(configs) else f" ({', '.join(kinds_)})"))
  return ("\n| allowed | fields (the kinds that have them, where not all do) |\n|---|---|\n"
          + "".join(f"| {r} | {', '.join(f)} |\n" for r, f in sorted(rows.items())))


def suffixes() -> str:
  """The file endings of each data kind that reads files, the kind after each."""
  data = registry("data")
  return ", ".join(f"{'/'.join(f'`{s}`' for s in data.entry(k).target.SUFFIXES)} (`{k}`)"
                   for k in document_kinds() if data.entry(k).target.SUFFIXES)


def family_files() -> str:
  """The files of the model families of modules/ (each with a size table)."""
  return ", ".join(f"`modules/{name}.py`" for name in modules.families())


def hf_map_files() -> str:
  """The files of the Hugging Face maps."""
  return ", ".join(f"`{source}`" for source in sorted({f.source for f in FAMILIES.values()}))


# -- mesh entries -----------------------------------------------------------------------------

def _num(x, unit, scale):
  return "-" if x is None else f"{x / scale:g} {unit}"


def _bytes(n):
  return _num(n, *(("GiB", GiB) if (n or 0) % GiB == 0 else ("GB", GB)))


def mesh_table() -> str:
  """One row per mesh entry."""
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
  return "\n" + "\n".join(rows) + "\n"


def gpu_table() -> str:
  """One row per GPU entry: its chip and the limits of its compute capability."""
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
  return "\n" + "\n".join(rows) + "\n"


FRAGMENTS: dict[str, Callable[..., str]] = {
    "kinds": kinds, "slots": slots, "choices": choices, "fields": fields, "refused": refused,
    "suffixes": suffixes, "mesh-table": mesh_table, "gpu-table": gpu_table,
    "family-files": family_files, "hf-map-files": hf_map_files,
}


def render(text: str) -> str:
  return doc_fragments.render(text, SOURCE, FRAGMENTS,
                              where="planner/registry_docs.py:FRAGMENTS")


def main(argv: list[str]) -> int:
  if argv[1:] not in ([], ["--check"]):
    print("usage: python -m planner.registry_docs [--check]", file=sys.stderr)
    return 2
  stale = [p for p in DOCS if render(p.read_text()) != p.read_text()]
  if argv[1:] == ["--check"]:
    for path in stale:
      print(f"{path.relative_to(ROOT)} is stale: python -m planner.registry_docs",
            file=sys.stderr)
    return 1 if stale else 0
  for path in stale:
    path.write_text(render(path.read_text()))
    print(f"rendered {path.relative_to(ROOT)}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
