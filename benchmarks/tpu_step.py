"""TPU step efficiency: LLaMA-1B's train step as libtpu compiles it for v5e:4x4, on this CPU.

    python -m benchmarks.tpu_step                 # rows at this checkout
    python -m benchmarks.tpu_step --before=REV    # also the same rows of commit REV, first
    python -m benchmarks.tpu_step --write         # and put the table in BENCHMARKS.md
    python -m benchmarks.tpu_step --render        # the last run's table (benchmarks/tpu_step.json)

Setting (the TPU efficiency issue): configs/llm_1b.py on tpu-v5e-16 (16 chips, fsdp=16),
global batch 64 x 2048 of packed documents (positions and segment ids, as every corpus source
yields; `data.mean_doc_len`), model.remat=full, no gradient accumulation, bfloat16 compute. Layers
are unrolled and windowed einsum is off (planner/plan.py:WINDOWED_EINSUM_OFF) so that libtpu's
cost model, a per-op roofline, sees every op; it gives each ConcatBitcast -1 s, added back.
Each row compiles in its own process (`--measure`), importing the code of the tree it
measures, so a row of an older commit uses that commit's model and step.

Per chip: the compiler's FLOPs and bytes accessed, its temporaries, the cost model's step and
the MFU that implies (model FLOPs per chip / step / 197 TFLOP/s, the v5e's bf16 peak).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from benchmarks import sections

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = "configs/llm_1b.py"
MESH = "tpu-v5e-16"
SETTING = {"data.batch_size": 64, "data.mean_doc_len": 1024, "model.remat": "full",
           "trainer.grad_accum_steps": 1, "model.scan_layers": False}
# What each row changes on top of SETTING (and the mesh rule of configs/llama.py).
UNPACKED = {"data.mean_doc_len": 0}  # one stream per row: no positions or segment ids
ROWS = {
    "xla attention": {"model.block.attention.implementation": "xla"},
    "chunked attention": {"model.block.attention.implementation": "chunked"},
    "splash attention": {"model.block.attention.implementation": "splash"},
    "xla attention, unpacked": {"model.block.attention.implementation": "xla", **UNPACKED},
    "splash attention, unpacked": {"model.block.attention.implementation": "splash", **UNPACKED},
}
PEAK = 197e12  # v5e bf16 FLOP/s per chip
# The model FLOPs per chip per step, the numerator of every row's MFU so that rows
# compare with MaxText's (trainer/flops.py counts 67.3 T: its attention term is not halved for
# the causal mask).
MODEL_FLOPS = 64.0e12
# MaxText 0.2.5 at the same setting (quoted from the issue; its train_compile, same libtpu, a
# packed batch: inputs_segmentation and inputs_position).
MAXTEXT = [("MaxText 0.2.5, dot-product attention", 81.9e12, 371e9, 5.76, 0.77),
           ("MaxText 0.2.5, splash attention (Pallas)", 72.5e12, 202e9, 4.64, 0.52)]
BEGIN, END = "<!-- tpu_step: begin -->", "<!-- tpu_step: end -->"
RESULTS = ROOT / "benchmarks" / "tpu_step.json"  # the last run's rows, for --render


def measure(overrides: dict) -> dict:
  """Compiles the step at SETTING + overrides in this process; per-chip figures."""
  # The measured tree's modules: imported here, in the --measure process that tree's path serves.
  # pylint: disable=import-outside-toplevel
  import jax
  import numpy as np
  from trainer import config as config_lib, experiment, mesh_rules, meshes, flops
  from planner import plan
  from trainer.data import base
  spec = importlib.util.spec_from_file_location("cfg", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config(None)
  entry = meshes.lookup(MESH)
  setting = {**SETTING, **overrides}
  # A tree from before data sources declared their batches (trainer/data/base.py:Source.fields)
  # has no data.mean_doc_len, and its planner compiled inputs, targets and weights only: it
  # gets the packed batch's positions and segment ids below, as its corpus sources yielded them.
  declared = hasattr(base.Source, "fields")
  packed = setting["data.mean_doc_len"] > 0
  if not declared:
    del setting["data.mean_doc_len"]
  mesh_rules.apply_rules(cfg, entry, set(setting))
  for path, value in setting.items():
    node = cfg
    *parents, leaf = path.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  run = config_lib.parse(cfg)
  devices, _ = plan.target_devices(entry)
  exp = experiment.build(run, entry, devices, platform="tpu")
  state, batch = plan.abstract_inputs(exp, exp.source.batch_size)
  if packed and not declared:
    batch.update({k: jax.ShapeDtypeStruct(batch["inputs"].shape, np.int32,
                                          sharding=exp.batch_sharding)
                  for k in ("positions", "segment_ids")})
  start = time.perf_counter()
  with exp.context():
    compiled = exp.step_fn.lower(state, batch).compile(compiler_options={
        "xla_tpu_enable_windowed_einsum_for_all_gather": False,
        "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False})
  seconds = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  text = compiled.as_text()
  concat = len(re.findall(r'custom_call_target="ConcatBitcast"', text))
  tokens = exp.source.batch_size * exp.source.seq_len
  model = flops.model_flops_per_token(run, exp.abstract_state.params) * tokens / len(devices)
  step = float(cost["optimal_seconds"]) + concat
  return {"flops": float(cost["flops"]), "bytes": float(cost["bytes accessed"]),
          "temp_gib": compiled.memory_analysis().temp_size_in_bytes / 2 ** 30,
          "step_s": step, "model_flops": float(model), "mfu": float(MODEL_FLOPS / step / PEAK),
          "concat_bitcasts": concat, "compile_s": seconds, "params": int(exp.num_params),
          "batch": sorted(batch)}


def _start(tree: pathlib.Path, overrides: dict) -> subprocess.Popen:
  env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS="cpu",
             TPU_ACCELERATOR_TYPE="v5litepod-1", TPU_WORKER_HOSTNAMES="localhost",
             TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  return subprocess.Popen([sys.executable, str(pathlib.Path(__file__).resolve()), "--measure",
                           json.dumps(overrides)], cwd=tree, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
  out, err = proc.communicate()
  lines = [l for l in out.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    return {"error": " ".join(err.split())[-300:]}
  return json.loads(lines[-1])


def run_rows(jobs: list[tuple[str, pathlib.Path, dict]], parallel: int) -> list[tuple[str, dict]]:
  """Compiles each (name, tree, overrides) in its own process, `parallel` at a time (a compile
  keeps about one core busy)."""
  results, running, queue = {}, [], list(jobs)
  while queue or running:
    while queue and len(running) < parallel:
      name, tree, overrides = queue.pop(0)
      running.append((name, _start(tree, overrides)))
    name, proc = running.pop(0)
    results[name] = _result(proc)
    print(f"{name}: {json.dumps(results[name])}", file=sys.stderr)
  return [(name, results[name]) for name, _, _ in jobs]


def _commit(tree: pathlib.Path) -> str:
  return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                        capture_output=True, text=True, check=False).stdout.strip() or "?"


def table(results: list[tuple[str, dict]]) -> str:
  lines = ["| per chip | batch | compiler FLOPs | bytes accessed | temporaries | cost-model step "
           "| est. MFU |", "|---|---|---|---|---|---|---|"]
  for name, flops, bytes_, temp, step in MAXTEXT:
    lines.append(f"| {name} | packed | {flops / 1e12:.1f} T | {bytes_ / 1e9:.0f} GB | "
                 f"{temp:.2f} GiB | {step:.2f} s | {MODEL_FLOPS / step / PEAK:.2f} |")
  for name, r in results:
    if "error" in r:
      lines.append(f"| {name} | | failed: {r['error'][:120]} | | | | |")
      continue
    # Rows saved before the batch was recorded compiled inputs, targets and weights only.
    batch = "packed" if "segment_ids" in r.get("batch", ()) else "unpacked"
    lines.append(f"| {name} | {batch} | {r['flops'] / 1e12:.1f} T | {r['bytes'] / 1e9:.0f} GB | "
                 f"{r['temp_gib']:.2f} GiB | {r['step_s']:.2f} s | "
                 f"{MODEL_FLOPS / r['step_s'] / PEAK:.2f} |")
  return "\n".join(lines) + "\n"


def section(results, *, command: str, seconds: float) -> str:
  setting = ", ".join(f"{k}={v}" for k, v in SETTING.items())
  model = next((r["model_flops"] for _, r in results if "model_flops" in r), 0.0)
  return (f"{BEGIN}\n## TPU step efficiency (libtpu's compiler and cost model, on this CPU)\n\n"
          f"`{command}` ({time.strftime('%Y-%m-%d')}, {seconds / 60:.0f} min). "
          f"{CONFIG} on {MESH} (v5e:4x4, fsdp=16) with its mesh rule and {setting}; bfloat16 "
          f"compute; windowed einsum off; libtpu's cost-model step with 1 s added back per "
          f"ConcatBitcast. MFU = {MODEL_FLOPS / 1e12:.1f} TFLOP of model per chip / step / "
          f"197 TFLOP/s for every row (trainer/flops.py counts {model / 1e12:.1f} T: its "
          f"attention term is not halved for the causal mask). The MaxText rows are quoted from "
          f"its `train_compile` at the same setting; rows named by a commit were compiled from "
          f"that commit's tree. Batch: `packed` rows compile the batch every corpus source "
          f"yields (inputs, targets, weights, positions, segment_ids; here synthetic documents, "
          f"data.mean_doc_len), `unpacked` rows inputs, targets and weights only.\n\n"
          + table(results) + f"{END}\n")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--measure", help=argparse.SUPPRESS)
  parser.add_argument("--before", help="also measure this commit's tree (a git revision)")
  parser.add_argument("--rows", default="xla attention,splash attention",
                      help=f"comma-separated rows of: {', '.join(ROWS)}")
  parser.add_argument("--before_rows", default="xla attention",
                      help="rows to measure at --before")
  parser.add_argument("--jobs", type=int, default=2, help="compiles at once")
  parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md's section")
  parser.add_argument("--render", action="store_true",
                      help=f"no compiling: the table of the last run ({RESULTS.name})")
  args = parser.parse_args(argv)
  if args.measure is not None:
    print(json.dumps(measure(json.loads(args.measure))))
    return 0
  if args.render:
    if not RESULTS.is_file():
      parser.error(f"--render: {RESULTS} does not exist; run without --render first")
    saved = json.loads(RESULTS.read_text())
    return _output(section([tuple(r) for r in saved["rows"]], command=saved["command"],
                           seconds=saved["seconds"]), write=args.write)
  for row in (args.rows + "," + args.before_rows).split(","):
    if row not in ROWS:
      parser.error(f"unknown row {row!r}; rows: {', '.join(ROWS)}")
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    jobs = []
    if args.before:
      tree = pathlib.Path(tmp) / "before"
      subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                      args.before], check=True, capture_output=True)
      commit = _commit(tree)
      jobs += [(f"axtrain {commit} (before), {row}", tree, ROWS[row])
               for row in args.before_rows.split(",")]
    commit = _commit(ROOT)
    jobs += [(f"axtrain {commit}, {row}", ROOT, ROWS[row]) for row in args.rows.split(",")]
    try:
      results = run_rows(jobs, args.jobs)
    finally:
      if args.before:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                        str(pathlib.Path(tmp) / "before")], check=False, capture_output=True)
  command = "python -m benchmarks.tpu_step " + " ".join(
      a for a in (argv or sys.argv[1:]) if a not in ("--write",) and not a.startswith("--jobs"))
  seconds = time.perf_counter() - start
  RESULTS.write_text(json.dumps({"command": command.strip(), "seconds": seconds,
                                 "rows": results}, indent=1) + "\n")
  return _output(section(results, command=command.strip(), seconds=seconds), write=args.write)


def _output(text: str, *, write: bool) -> int:
  sys.stdout.write(text)
  if write:
    sections.write_section(text.rstrip("\n"), begin=BEGIN, end=END)
  return 0


if __name__ == "__main__":
  sys.exit(main())
