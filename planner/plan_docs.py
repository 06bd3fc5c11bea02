"""The plan figures of README.md and docs/plan.md, from stored `axtrain plan --json` reports.

    python -m planner.plan_docs                     # compile every report, then render the docs
    python -m planner.plan_docs llm_1b              # compile llm_1b's reports, then render
    python -m planner.plan_docs llm_1b@gpu-h100-8   # compile this one report, then render
    python -m planner.plan_docs --render            # compile nothing: render what is stored
    python -m planner.plan_docs --list              # each report's name and command

Each report (`REPORTS`) is one `axtrain plan ... --json` run in a subprocess (GPU and
Trainium entries restart themselves with their own environment), stored as it finishes in
tests/testdata/plans/<name>.json. The docs hold no plan figure typed by hand: every one sits
in a fragment between `<!-- plan-docs:KEY -->` and `<!-- /plan-docs:KEY -->`, which
`render` rewrites from the stored reports (`FRAGMENTS`): a report as `axtrain plan` prints it
(planner/plan_report.py:text of the stored JSON), lines of one, a table of several, a figure.
tests/test_docs_plans.py checks that the docs are what the stored reports render to, and
(marked slow) that a fresh compile of the cheapest stored report still gives its figures.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Callable

from planner import doc_fragments, plan_report

ROOT = pathlib.Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "testdata" / "plans"
DOCS = (ROOT / "docs" / "plan.md", ROOT / "README.md", ROOT / "docs" / "offload.md")


@dataclasses.dataclass(frozen=True)
class Report:
  """One `axtrain plan` report: `name` is its file in STORE (config@mesh, ~tag for a variant
  with `flags`); `note` is what a table of the docs calls it."""
  name: str
  config: str  # the --config argument
  mesh: str
  flags: tuple[str, ...] = ()  # after --noeval: overrides, --ops
  note: str = ""

  def command(self) -> list[str]:
    return ["plan", f"--config={self.config}", f"--mesh={self.mesh}", "--noeval", *self.flags]

  @property
  def path(self) -> pathlib.Path:
    return STORE / f"{self.name}.json"


def _shipped(config: str, mesh: str) -> Report:
  return Report(f"{config}@{mesh}", f"configs/{config}.py", mesh, note="shipped")


def _variant(base: Report, tag: str, *flags: str, note: str = "") -> Report:
  return Report(f"{base.name}~{tag}", base.config, base.mesh, tuple(flags), note)


# The shipped LLM configs on their meshes (per config one GPU, one Trainium and two TPU
# entries, as in its mesh.rules), 70B on one GPU host (which does not fit), and 125m on the
# one chip the calibration was measured on (planner/calibration.py).
SHIPPED = (
    *(_shipped("llm_1b", m) for m in ("tpu-v5e-16", "gpu-h100-8", "neuron-trn1-32",
                                       "tpu-v5p-128")),
    *(_shipped("llm_7b", m) for m in ("tpu-v5p-128", "gpu-h100-8x2", "neuron-trn2-64",
                                       "tpu-v6e-64")),
    *(_shipped("llm_70b", m) for m in ("tpu-v5p-512", "gpu-h100-8x16", "neuron-trn2-64x8",
                                        "tpu-v5p-1024", "gpu-h100-8")),
    Report("llama_125m@tpu-v5e-1", "configs/llama.py:size=125m", "tpu-v5e-1",
           note="`grad_accum_steps=64` (4 rows a microbatch), `pallas_hd64`, `scan_layers=false`: "
                "the chip's rule as shipped"),
)
_BY_NAME = {r.name: r for r in SHIPPED}
_1B_V5E, _7B_H100, _70B_H100, _125M_V5E = (
    _BY_NAME["llm_1b@tpu-v5e-16"], _BY_NAME["llm_7b@gpu-h100-8x2"],
    _BY_NAME["llm_70b@gpu-h100-8x16"], _BY_NAME["llama_125m@tpu-v5e-1"])
# 125m's rule for the chip undone: the recipe before it (docs/plan.md "What the sweep found on
# one v5e chip"), then a setting of that sweep's ranking.
_NO_RULE = {"trainer.microbatch_rows": 0, "eval.microbatch_rows": 0,
            "model.block.attention.implementation": "xla", "model.scan_layers": "true"}
_SPLASH = {"model.block.attention.implementation": "splash"}


def _sweep_row(tag: str, changes: dict, note: str) -> Report:
  flags = {**_NO_RULE, **changes}
  return _variant(_125M_V5E, tag, *(f"--config.{k}={v}" for k, v in flags.items()), note=note)


_BEFORE = "before the GPU compiler"  # the layout the config shipped with then
_MAXTEXT = "MaxText's layout"  # of the published run in PEERS: sequences per GPU in one pass
VARIANTS = (
    # the layouts the GPU rules shipped before the GPU compiler, and the sweep's runners-up
    _variant(_7B_H100, "hsdp-full-4", "--config.mesh.fsdp=8", "--config.mesh.model=1",
             "--config.model.remat=full", "--config.trainer.grad_accum_steps=4", note=_BEFORE),
    _variant(_7B_H100, "hsdp-dots-8", "--config.mesh.fsdp=8", "--config.mesh.model=1"),
    _variant(_7B_H100, "hsdp-dots-4", "--config.mesh.fsdp=8", "--config.mesh.model=1",
             "--config.trainer.grad_accum_steps=4", note=_MAXTEXT),
    _variant(_70B_H100, "fsdp16-model8-full-32", "--config.mesh.fsdp=16",
             "--config.mesh.model=8", "--config.model.remat=full",
             "--config.trainer.grad_accum_steps=32", note=_BEFORE),
    _variant(_70B_H100, "full-16", "--config.model.remat=full"),
    _variant(_70B_H100, "fsdp16-model8-full-16", "--config.mesh.fsdp=16",
             "--config.mesh.model=8", "--config.model.remat=full"),
    _variant(_70B_H100, "fsdp128-full-4", "--config.mesh.fsdp=128", "--config.mesh.model=1",
             "--config.model.remat=full", "--config.trainer.grad_accum_steps=4",
             "--config.eval.batch_size=128", note=_MAXTEXT),
    # `--ops` without --nowindowed_einsum: how far the per-op sums overcount
    _variant(_1B_V5E, "ops", "--ops", "--config.data.batch_size=64",
             "--config.trainer.grad_accum_steps=1", "--config.model.scan_layers=false"),
    # the one-chip sweep's ranking, from 125m's recipe without the chip's rule (its best is
    # the rule as shipped: 4 rows a microbatch, splash, layers unrolled)
    _sweep_row("accum32-chunk1024-splash-unrolled",
               {**_SPLASH, "model.scan_layers": "false", "trainer.grad_accum_steps": 32,
                "trainer.loss_chunk_size": 1024},
               "`grad_accum_steps=32`, `loss_chunk_size=1024`, `splash`, `scan_layers=false`"),
    _sweep_row("accum64-splash", {**_SPLASH, "trainer.grad_accum_steps": 64},
               "`grad_accum_steps=64`, `splash`"),
    _sweep_row("accum32-chunk1024-splash",
               {**_SPLASH, "trainer.grad_accum_steps": 32, "trainer.loss_chunk_size": 1024},
               "`grad_accum_steps=32`, `loss_chunk_size=1024`, `splash`"),
)
# The launch examples' configs on their meshes (README.md, docs/launch.md, `axtrain launch
# --help`) that SHIPPED lacks: tests/test_launch_examples.py checks that every example has its
# report here and that it fits.
LAUNCHED = tuple(_shipped("llm_1b", m) for m in ("gpu-h100-8x2", "gpu-h100-8x4", "tpu-v5e-16x2"))
# The recipes that fit their chips with the train state in host memory (docs/offload.md):
# llm_1b on one v5e chip, llm_7b on one v5e host of 8.
OFFLOADED = tuple(_shipped(c, m) for c, m in (("llm_1b", "tpu-v5e-1"), ("llm_7b", "tpu-v5e-8")))
REPORTS = SHIPPED + VARIANTS + LAUNCHED + OFFLOADED
BY_NAME = {r.name: r for r in REPORTS}


# --- compiling -----------------------------------------------------------------------------

class CompileError(RuntimeError):
  """`axtrain plan` of a report did not succeed (its exit code and last line of stderr)."""


def fresh(report: Report) -> dict:
  """The report's `axtrain plan --json`, compiled now in a subprocess of this checkout."""
  env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  result = subprocess.run([sys.executable, "-m", "launcher", *report.command(), "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise CompileError(f"{report.name}: exit {result.returncode}: "
                       + (result.stderr.strip().splitlines() or ["?"])[-1])
  return json.loads(result.stdout)


def store(report: Report, data: dict) -> None:
  STORE.mkdir(parents=True, exist_ok=True)
  report.path.write_text(json.dumps(data, indent=1) + "\n")


def chosen(args: list[str]) -> list[Report]:
  """The reports named by `args`, each a report's name or a config's (`llm_1b`: its reports
  and their variants), in REPORTS order."""
  known = {r.name for r in REPORTS} | {r.name.split("@")[0] for r in REPORTS}
  unknown = [a for a in args if a not in known]
  if unknown:
    raise SystemExit(f"plan_docs: no report named {', '.join(unknown)} (--list lists them)")
  return [r for r in REPORTS if r.name in args or r.name.split("@")[0] in args]


# --- rendering ------------------------------------------------------------------------------

def load(report: Report):
  """The stored report as a planner.plan.Plan (its per-op listing, which --json leaves out,
  is None), and its mesh rule."""
  # pylint: disable=import-outside-toplevel
  from planner import calibration, hlo_collectives, host_ram, memory_model
  from planner import plan as plan_lib
  data = json.loads(report.path.read_text())

  def build(cls, d: dict, **nested):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names and k not in nested}, **nested)

  def compiled(d: dict | None):
    if d is None:
      return None
    collectives = build(hlo_collectives.Collectives, d["collectives"])
    return build(plan_lib.Compiled, d, collectives=collectives, notes=tuple(d["notes"]), ops=None)

  e = data["estimate"]
  estimate = None if e is None else build(
      plan_lib.Estimate, e, calibration=build(calibration.Calibration, e["calibration"]))
  nested = {"analytic": build(memory_model.Analytic, data["analytic"]),
            "train": compiled(data["train"]), "eval": compiled(data["eval"]),
            "split": build(memory_model.Split, data["split"]), "estimate": estimate,
            "host": build(host_ram.HostNeed, data["host"]) if data.get("host") else None}
  plan = build(plan_lib.Plan, data, **nested)
  return plan, data.get("mesh_rule")


def report_text(report: Report) -> str:
  """What `axtrain plan` printed for the report (planner/plan_report.py:text)."""
  plan, rule = load(report)
  return plan_report.text(plan) + (f"  mesh rule: {rule!r}\n" if rule else "")


def report_section(report: Report) -> str:
  title = report.config.removeprefix("configs/").removesuffix(".py")
  return (f"### {title} on {report.mesh}\n\n```\n$ axtrain {' '.join(report.command())}\n"
          f"{report_text(report)}```\n")


FRAGMENT = doc_fragments.pattern("plan-docs")


def render(text: str) -> str:
  """`text` with every fragment rendered afresh from the stored reports: the fragment
  `KIND` or `KIND:ARG` holds what FRAGMENTS[KIND]() or FRAGMENTS[KIND](ARG) returns."""
  return doc_fragments.render(text, "plan-docs", FRAGMENTS,
                              where="planner/plan_docs.py:FRAGMENTS")


def render_docs() -> None:
  for path in DOCS:
    path.write_text(render(path.read_text()))


# --- the fragments ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def plan_of(name: str):
  return load(BY_NAME[name])[0]


@functools.lru_cache(maxsize=None)
def json_of(name: str) -> dict:
  return json.loads(BY_NAME[name].path.read_text())


def _layout(p) -> str:
  """A layout as the tables say it: the mesh axes that split, remat and microbatches."""
  axes = " ".join(f"{k}={v}" for k, v in p.axes.items() if v > 1)
  return f"{axes}, remat {p.remat}, {p.grad_accum_steps} microbatches"


def mfu(name: str) -> str:
  """The estimate's MFU, overlapped / serial."""
  e = plan_of(name).estimate
  return f"{e.mfu:.2f} / {e.mfu_serial:.2f}"


def step(name: str) -> str:
  """The estimate's step time, overlapped / serial."""
  e = plan_of(name).estimate
  return f"{plan_report.secs(e.step_s)} / {plan_report.secs(e.serial_s)}"


def peak(name: str) -> str:
  """The train step's peak bytes per device."""
  return plan_report.gib(plan_of(name).train.peak)


def reports() -> str:
  """Every shipped report, as `axtrain plan` prints it, under a heading."""
  return "\n" + "\n".join(report_section(r) for r in SHIPPED)


# README's excerpts: (report, a comment on its command, the lines shown: patterns that the
# start of a line, stripped, matches).
README_EXCERPTS = (
    ("llm_1b@tpu-v5e-16", "", ("plan:", "run:", "train temporaries", "memory:", "ESTIMATE",
                               r"\S+ tokens/s")),
    ("llm_7b@neuron-trn2-64", "", ("plan:", "memory:", "ESTIMATE")),
    ("llm_70b@gpu-h100-8x16", "", ("plan:", "memory:", "ESTIMATE", r"\S+ tokens/s", "at ")),
    ("llm_70b@gpu-h100-8", "one host: no", ("plan:", "memory:")),
)


def readme_excerpts() -> str:
  """A fenced block of a few lines of a few reports, each under its command."""
  blocks = []
  for name, comment, patterns in README_EXCERPTS:
    report = BY_NAME[name]
    command = f"$ axtrain {' '.join(report.command())}" + (f"     # {comment}" if comment else "")
    lines = [line for line in report_text(report).splitlines()
             if any(re.match(p, line.strip()) for p in patterns)]
    blocks.append("\n".join([command, *lines]))
  return "\n```\n" + "\n\n".join(blocks) + "\n```\n"


def _rank(report: Report) -> tuple:
  """The sweep's order: those that fit first, then by the estimate, overlapped then serial."""
  p = plan_of(report.name)
  return (not p.fits, p.estimate.step_s, p.estimate.serial_s)


def parts(name: str) -> str:
  """The estimate's parts: matmuls, memory-bound ops, collectives."""
  e, secs = plan_of(name).estimate, plan_report.secs
  return (f"matmuls {secs(e.compute_s)}, memory-bound ops {secs(e.hbm_s)}, collectives "
          f"{secs(e.collective_s)}")


def h100_layouts() -> str:
  """The layouts of llm_70b and llm_7b on H100 hosts, ranked per config as the sweep ranks."""
  rows = ["| config on entry | layout | peak per GPU | step, overlapped / serial | est. MFU, "
          "overlapped / serial |", "|---|---|---|---|---|"]
  for base in (_70B_H100, _7B_H100):
    group = sorted((r for r in REPORTS if r.name.split("~")[0] == base.name), key=_rank)
    for i, r in enumerate(group):
      p = plan_of(r.name)
      label = f"**{r.note}**: " if r.note == "shipped" else f"{r.note}: " if r.note else ""
      where = f"{_config_name(r)} on {r.mesh}" if i == 0 else ""
      rows.append(f"| {where} | {label}{_layout(p)} | {peak(r.name)}"
                  f"{'' if p.fits else ' (does NOT fit)'} | {step(r.name)} | {mfu(r.name)} |")
  return "\n" + "\n".join(rows) + "\n"


def _config_name(report: Report) -> str:
  return report.config.removeprefix("configs/").removesuffix(".py")


# docs/plan.md's GPU reports when the CPU compiler stood in for the GPU (before be7fb9b):
# temporaries / peak per GPU, and bytes sent between hosts per GPU per step.
CPU_STAND_IN = {
    "llm_1b@gpu-h100-8": ("12.8 / 14.5 GiB", "one host"),
    "llm_7b@gpu-h100-8x2~hsdp-full-4": ("48.6 / 58 GiB", "404 GiB"),
    "llm_70b@gpu-h100-8x16~fsdp16-model8-full-32": ("66.9 / 72.1 GiB", "4.33e+03 GiB"),
}


def _pair(a: float, b: float) -> str:
  """`a / b GiB`: two byte counts, the unit said once where they share it."""
  x, y = plan_report.gib(a), plan_report.gib(b)
  return f"{x.rsplit(' ', 1)[0]} / {y}" if x.split()[-1] == y.split()[-1] else f"{x} / {y}"


def gpu_compilers() -> str:
  """The CPU stand-in's figures beside the analytic model's and the GPU compiler's now."""
  gib = plan_report.gib
  rows = ["| config on entry, layout | CPU stand-in: temporaries / peak | analytic model | "
          "GPU compiler: temporaries / peak | between hosts: CPU stand-in -> GPU compiler |",
          "|---|---|---|---|---|"]
  for name, (cpu, cpu_hosts) in CPU_STAND_IN.items():
    p, r = plan_of(name), BY_NAME[name]
    cross = p.train.collectives.cross_host_bytes
    hosts = f"{cpu_hosts} -> {gib(cross)}" if cross else cpu_hosts
    rows.append(f"| {_config_name(r)} on {r.mesh}: {_layout(p)} | {cpu} | "
                f"{gib(p.analytic.total)} | {_pair(p.train.temp, p.train.peak)} | "
                f"{hosts} |")
  return "\n" + "\n".join(rows) + "\n"


def v5e_sweep() -> str:
  """The one-chip sweep's settings, ranked as the sweep ranks them (fits, then estimate)."""
  names = [r.name for r in sorted((r for r in REPORTS
                                   if r.name.split("~")[0] == _125M_V5E.name), key=_rank)]
  rows = ["| rank | changes | train peak [TPU compiler] | step (estimate) | MFU (estimate) |",
          "|---|---|---|---|---|"]
  for i, n in enumerate(names, 1):
    p = plan_of(n)
    rows.append(f"| {i} | {BY_NAME[n].note} | {peak(n)}{'' if p.fits else ' (does NOT fit)'} "
                f"| {plan_report.secs(p.estimate.step_s)} | {p.estimate.mfu:.2f} |")
  return "\n" + "\n".join(rows) + "\n"


def ops_overcount() -> str:
  """How far `--ops`'s per-op sums overcount with windowed einsum on."""
  cover = json_of(f"{_1B_V5E.name}~ops")["ops"]["coverage"]
  return f"{cover['bytes']:.0%} of the compiler's bytes and {cover['flops']:.0%} of its FLOPs"


@dataclasses.dataclass(frozen=True)
class Peer:
  """A published measured run of the model class of one of our reports on the same GPUs: its
  MFU is its published TFLOP/s over the peak, or its tokens/s times our report's model FLOPs
  per token (6N + attention, trainer/flops.py) over the peak."""
  report: str  # ours as shipped
  layout: str  # ours at the run's layout (sequences per GPU in one pass, axes)
  run: str
  published: str  # the figure, as published
  source: str
  tflops: float = 0.0  # per GPU, as published
  tokens: float = 0.0  # per GPU per second, as published


PEERS = (
    Peer("llm_7b@gpu-h100-8x2", "llm_7b@gpu-h100-8x2~hsdp-dots-4",
         "MaxText, Llama-2-7B on 2 A3 hosts (16 H100): data=2 fsdp=8, 4 sequences of 4096 a GPU "
         "in one pass, cuDNN flash attention (Transformer Engine), remat `minimal_flash`",
         "422 TFLOP/s a GPU (492 on one host of 8 GPUs)",
         "MaxText's `MaxText/configs/a3/llama_2_7b/README.md` and `2vm.sh` (2024)",
         tflops=422e12),
    Peer("llm_70b@gpu-h100-8x16", "llm_70b@gpu-h100-8x16~fsdp128-full-4",
         "MaxText, Llama-3-70B on 16 DGX H100 hosts (128 GPUs), BF16: fsdp=128, 2 sequences of "
         "8192 a GPU in one pass",
         "15.57 s a step of 256 x 8192 tokens, 1,052 tokens/s a GPU",
         "NVIDIA DGX Cloud Benchmarking recipe \"Maxtext Llama3 70B 25.02\" (NGC catalog, 2025)",
         tokens=1052.266),
)


def peer_mfu(report: str) -> str:
  """The MFU of the published run beside `report` (see Peer)."""
  from trainer import meshes  # pylint: disable=import-outside-toplevel
  peer, p = next(q for q in PEERS if q.report == report), plan_of(report)
  top = meshes.lookup(p.mesh).hardware.peak_bf16_flops
  per_token = p.model_flops / (p.batch * p.seq_len)
  return f"{(peer.tflops / top if peer.tflops else peer.tokens * per_token / top):.2f}"


def peers() -> str:
  """Published runs of our reports' model classes on the same GPUs, beside our estimates (as
  shipped, and at the run's layout)."""
  rows = ["| published run | its figure | its MFU | est. MFU of our plan, overlapped / serial: "
          "as shipped | at its layout | source |", "|---|---|---|---|---|---|"]
  for peer in PEERS:
    r, at = BY_NAME[peer.report], plan_of(peer.layout)
    rows.append(f"| {peer.run} | {peer.published} | {peer_mfu(peer.report)} | "
                f"{mfu(peer.report)} ({_config_name(r)} on {r.mesh}) | {mfu(peer.layout)} "
                f"({_layout(at)}{'' if at.fits else '; does NOT fit'}) | {peer.source} |")
  return "\n" + "\n".join(rows) + "\n"


def offloaded() -> str:
  """The recipes that fit with their state in host memory: device and host memory, estimate."""
  rows = ["| recipe | mesh | device peak | host RAM per host at its peak | estimate |",
          "|---|---|---|---|---|"]
  for report in OFFLOADED:
    p = plan_of(report.name)
    e = p.estimate
    rows.append(
        f"| `{report.config}` | {p.mesh} | {plan_report.gib(p.needed)} of "
        f"{plan_report.gib(p.usable)} usable | {plan_report.gib(p.host_needed)} of "
        f"{plan_report.gib(p.host_ram)} | {plan_report.secs(e.step_s)} a step, MFU "
        f"{e.mfu:.2f}; of it {plan_report.secs(e.transfer_s)} of host transfers "
        f"({plan_report.gib(e.to_host)} back per device) |")
  return "\n" + "\n".join(rows) + "\n"


# The host RAM in use (GB, `free`'s used column) beside a stored report's phases: llm_1b as
# shipped on the lent v5e host, 2026-12-07 at e2ced50 (docs/offload.md; benchmarks/whole_run.py).
CHIP_HOST_GB = {"llm_1b@tpu-v5e-1": {"in steps": "22.11", "a save": "22.39-22.89",
                                     "a restore": "22.63", "a first run's steps": "22.71"}}


def host_phases(name: str) -> str:
  """A stored report's host RAM in each phase of the run (GB), beside the chip's."""
  h, chip = plan_of(name).host, CHIP_HOST_GB.get(name, {})
  rows = ["| phase | the plan | the chip (RAM in use) |", "|---|---|---|"]
  for phase, n in h.phases().items():
    rows.append(f"| {phase} | {n / 1e9:.3g} GB | "
                + (f"{chip[phase]} GB" if phase in chip else "not measured") + " |")
  return "\n" + "\n".join(rows) + "\n"


FRAGMENTS: dict[str, Callable[..., str]] = {
    "reports": reports, "readme-excerpts": readme_excerpts, "h100-layouts": h100_layouts,
    "gpu-compilers": gpu_compilers, "v5e-sweep": v5e_sweep, "ops-overcount": ops_overcount,
    "peers": peers, "mfu": mfu, "step": step, "peak": peak, "parts": parts,
    "peer-mfu": peer_mfu, "offloaded": offloaded, "host-phases": host_phases,
}


FLAGS = ("--list", "--render")


def main(argv: list[str]) -> int:
  args = [a for a in argv[1:] if not a.startswith("-")]
  if any(a in ("-h", "--help") for a in argv[1:]):
    print(__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1])
    return 0
  if unknown := [a for a in argv[1:] if a.startswith("-") and a not in FLAGS]:
    print(f"planner.plan_docs: error: unknown flag {unknown[0]}; flags: {', '.join(FLAGS)}, "
          f"--help", file=sys.stderr)
    return 2
  if "--list" in argv:
    for r in REPORTS:
      print(f"{r.name}: axtrain {' '.join(r.command())}")
    return 0
  for report in [] if "--render" in argv else chosen(args) if args else list(REPORTS):
    start = time.perf_counter()
    try:
      store(report, fresh(report))
      said = "stored"
    except CompileError as e:
      said = str(e)
    print(f"{report.name}: {said} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
  render_docs()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
