"""Regenerates docs/plan.md: `axtrain plan` of the shipped LLM configs on their meshes.

    python -m planner.plan_docs            # every report (hours on a 2-core machine)
    python -m planner.plan_docs llm_1b     # only the reports of configs/llm_1b.py
    python -m planner.plan_docs llm_1b@gpu-h100-8   # only this report

Each report runs `axtrain plan ... --noeval` in a subprocess (GPU and Trainium entries need
their own count of CPU devices) and is written to docs/plan.md as soon as it is done.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "plan.md"
# (config, mesh): per config one GPU, one Trainium and two TPU entries, as in its mesh.rules.
PLANS = (
    ("llm_1b", "tpu-v5e-16"), ("llm_1b", "gpu-h100-8"), ("llm_1b", "neuron-trn1-32"),
    ("llm_1b", "tpu-v5p-128"),
    ("llm_7b", "tpu-v5p-128"), ("llm_7b", "gpu-h100-8x2"), ("llm_7b", "neuron-trn2-64"),
    ("llm_7b", "tpu-v6e-64"),
    ("llm_70b", "tpu-v5p-512"), ("llm_70b", "gpu-h100-8x16"), ("llm_70b", "neuron-trn2-64x8"),
    ("llm_70b", "tpu-v5p-1024"),
)
START = "<!-- plan-reports:start (generated: python -m planner.plan_docs) -->\n"
END = "<!-- plan-reports:end -->"


def command(config: str, mesh: str) -> list[str]:
  return ["plan", f"--config=configs/{config}.py", f"--mesh={mesh}", "--noeval"]


def section(config: str, mesh: str, output: str) -> str:
  return (f"### {config} on {mesh}\n\n```\n$ axtrain {' '.join(command(config, mesh))}\n"
          f"{output.rstrip()}\n```\n\n")


def update(text: str, config: str, mesh: str, output: str) -> str:
  """docs/plan.md text with this (config, mesh) report replaced or added."""
  head, _, rest = text.partition(START)
  body, _, tail = rest.partition(END)
  parts = dict(re.findall(r"(### \S+ on \S+)\n\n(.*?\n```\n\n)", body, flags=re.S))
  parts[f"### {config} on {mesh}"] = section(config, mesh, output).split("\n\n", 1)[1]
  order = [f"### {c} on {m}" for c, m in PLANS]
  keys = sorted(parts, key=lambda k: order.index(k) if k in order else len(order))
  return head + START + "".join(f"{k}\n\n{parts[k]}" for k in keys) + END + tail


def main(argv: list[str]) -> int:
  env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  chosen = [(c, m) for arg in argv[1:] for c, m in PLANS if arg in (c, f"{c}@{m}")]
  for config, mesh in chosen if argv[1:] else PLANS:  # in the order asked for
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "launcher", *command(config, mesh)],
                            cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    output = result.stdout if result.returncode == 0 else f"exit {result.returncode}: " + (
        result.stderr.strip().splitlines() or ["?"])[-1]
    DOCS.write_text(update(DOCS.read_text(), config, mesh, output))
    print(f"{config} on {mesh}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
