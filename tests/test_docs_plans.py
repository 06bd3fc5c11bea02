"""The plan figures that README.md and docs/plan.md publish are the stored reports' own.

Every figure sits in a fragment that planner/plan_docs.py renders from a stored `axtrain plan
--json` report (tests/testdata/plans/). Fast: the docs are what the stored reports render to
(a figure typed by hand, or a report stored without the docs rendered again, fails), no report
output stands outside a fragment, and the store holds exactly the reports plan_docs names.
Slow: the stored report that compiled fastest, compiled afresh, still gives its figures: memory
within 2% (or within 8 scalar outputs of the step: METRIC_OUTPUTS_BYTES) and the step estimate
within 5% (a planner change that moves them fails here until
`python -m planner.plan_docs NAME` stores them again).
"""

from __future__ import annotations

import difflib
import json
import re

import pytest

from planner import plan_docs
from tests.conftest import gpu_compiler_missing

# A line of `axtrain plan`'s report, as it would stand in a doc that quotes one.
REPORT_LINE = re.compile(r"^\s*(plan: \S+ on |memory: (fits|does NOT fit)|ESTIMATE |"
                         r"train (peak|temporaries) +\[)")


@pytest.mark.parametrize("path", plan_docs.DOCS, ids=lambda p: p.name)
def test_docs_are_what_the_stored_reports_render_to(path):
  text = path.read_text()
  assert plan_docs.FRAGMENT.search(text), f"{path.name} holds no plan-docs fragment"
  rendered = plan_docs.render(text)
  diff = "".join(difflib.unified_diff(text.splitlines(True), rendered.splitlines(True),
                                      "on disk", "rendered", n=1))
  assert rendered == text, (f"{path.name} is not what the stored reports render to; run "
                            f"`python -m planner.plan_docs --render`:\n{diff[:3000]}")


@pytest.mark.parametrize("path", plan_docs.DOCS, ids=lambda p: p.name)
def test_no_report_output_outside_a_fragment(path):
  """A quoted report line outside a fragment would be a figure nothing checks."""
  outside = plan_docs.FRAGMENT.sub("", path.read_text())
  stray = [line for line in outside.splitlines() if REPORT_LINE.match(line)]
  assert not stray, f"{path.name} quotes report lines outside a plan-docs fragment: {stray}"


def test_the_store_holds_exactly_the_reports():
  stored = {p.stem for p in plan_docs.STORE.glob("*.json")}
  assert stored == set(plan_docs.BY_NAME), (
      f"missing: {sorted(set(plan_docs.BY_NAME) - stored)}; "
      f"not a report of planner/plan_docs.py: {sorted(stored - set(plan_docs.BY_NAME))}")
  for report in plan_docs.REPORTS:
    data = plan_docs.json_of(report.name)
    assert (data["config"], data["mesh"]) == (report.config, report.mesh), report.name


def test_a_figure_edited_by_hand_is_caught():
  """The render check can fail: one digit changed inside a fragment of README.md."""
  text = plan_docs.ROOT.joinpath("README.md").read_text()
  m = next(m for m in plan_docs.FRAGMENT.finditer(text) if re.search(r"\d", m[3]))
  i = m.start(3) + re.search(r"\d", m[3]).start()
  edited = text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:]
  assert plan_docs.render(edited) == text != edited


def test_an_unknown_fragment_is_refused():
  with pytest.raises(KeyError, match="no plan-docs fragment kind 'mfv'"):
    plan_docs.render("<!-- plan-docs:mfv:x -->0<!-- /plan-docs:mfv:x -->")


# --- afresh --------------------------------------------------------------------------------

def _relative(fresh: float, stored: float) -> float:
  return abs(fresh - stored) / max(abs(stored), 1e-12)


MEMORY = ("argument", "output", "alias", "temp")  # the compiler's bytes per device
# The step's metrics are scalar outputs of it (trainer/train_metrics.py): a metric added or
# dropped moves `output` by a scalar's padded size (512 bytes on TPU: tiny on tpu-v5e-8, 4,608
# bytes beyond its donated state with `grad_clipped`, 4,096 without). With the state in host
# memory those scalars are all the device's outputs (llm_1b@tpu-v5e-1: 6 KiB), where 2% is
# not one of them; so a figure may also move by up to 8 of them.
METRIC_OUTPUTS_BYTES = 8 * 512
ESTIMATE = ("step_s", "serial_s", "mfu", "mfu_serial")



def _cheapest() -> str:
  """The stored report whose train step compiled fastest when it was stored (its `compile:`
  seconds), so that the one fresh compile costs least."""
  stored = [r for r in plan_docs.REPORTS if r.path.is_file()]
  return min(stored, key=lambda r: plan_docs.json_of(r.name)["train"]["seconds"]).name


@pytest.mark.slow
def test_a_fresh_compile_gives_the_stored_figures():
  """The cheapest stored report compiled again: memory within 2%, the estimate within 5%."""
  name = _cheapest()
  report = plan_docs.BY_NAME[name]
  if report.mesh.startswith("gpu-") and (missing := gpu_compiler_missing()):
    pytest.skip(missing)
  stored = json.loads(report.path.read_text())
  fresh = plan_docs.fresh(report)
  off = {f"train.{k}": _relative(fresh["train"][k], stored["train"][k]) for k in MEMORY
         if abs(fresh["train"][k] - stored["train"][k]) > METRIC_OUTPUTS_BYTES}
  off.update({f"estimate.{k}": _relative(fresh["estimate"][k], stored["estimate"][k])
              for k in ESTIMATE})
  over = {k: f"{v:.1%}" for k, v in off.items()
          if v > (0.02 if k.startswith("train.") else 0.05)}
  assert not over, (f"{name} compiled now differs from its stored report by {over}; store it "
                    f"again (and render the docs): python -m planner.plan_docs {name}")
