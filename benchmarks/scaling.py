"""How axtrain's step time grows with model size, at a fixed batch of tokens."""

from __future__ import annotations

import dataclasses

from trainer import loop
from trainer.experiment import Experiment


@dataclasses.dataclass
class Point:
  name: str
  params: int
  flops_per_step: float
  step_s: float


def measure(name: str, exp: Experiment, flops_per_step: float) -> Point:
  """One run of trainer.max_steps steps; the step time its loop logs (steps 2..K)."""
  result = loop.train(exp)
  record = [x for x in result.records if "step_time_s" in x][-1]
  return Point(name, exp.num_params, flops_per_step, record["step_time_s"])


def plot(points: list[Point], path, *, tokens: int) -> bool:
  """Step time against parameters, log-log; False when matplotlib is missing."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  xs, ys = [p.params for p in points], [p.step_s for p in points]
  ax.loglog(xs, ys, "o-")
  for p in points:
    ax.annotate(p.name, (p.params, p.step_s), textcoords="offset points", xytext=(5, -12))
  ax.set_xlabel("parameters")
  ax.set_ylabel("step time (s)")
  ax.set_title(f"axtrain train step on CPU, {tokens} tokens per step")
  ax.grid(True, which="both", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return True
