"""benchmarks/startup_probe.py: a run's start, thread by thread, in a file that a cut-short run
still leaves (one process of its own: it patches JAX's cache read)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.test_compile_cache import TINY


def test_the_probe_says_where_a_runs_start_went(tmp_path):
  out = tmp_path / "probe.json"
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.startup_probe", str(out), "--", *TINY,
       f"--config.trainer.compile_cache={tmp_path / 'cache'}", f"--output_dir={tmp_path / 'run'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  probe = json.loads(out.read_text())
  events = [e["what"] for e in probe["events"]]
  assert events[0] == "probe_start" and events[-1] == "exit"
  assert events.index("check_train_start") < events.index("check_train_end")
  notes = {e["phase"]: e["t"] for e in probe["events"] if e["what"] == "note"}
  assert 0 < notes["to_experiment_s"] <= notes["to_steps_compiled_s"] <= notes["to_compiled_s"]
  run = json.loads((tmp_path / "run" / "run.json").read_text())["startup"]
  assert probe["startup"]["to_first_step_s"] == run["to_first_step_s"]
  assert probe["samples"] > 0 and any("MainThread" in b for b in probe["buckets"].values())
  assert probe["cache"] and all(c["miss"] for c in probe["cache"])  # a new cache: all compiled
