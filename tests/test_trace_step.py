"""benchmarks/trace_step.py: a setting's train and eval steps traced alone, as one JSON line."""

from __future__ import annotations

import json

import pytest

from benchmarks import trace_step


def test_it_traces_both_steps_of_a_setting(capsys):
  assert trace_step.main(["--config=configs/tiny.py", "--repeat=1"]) == 0
  row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert row["config"] == "configs/tiny.py" and row["mesh"] == "cpu"
  assert row["train_trace_s"] > 0 and row["eval_trace_s"] > 0


def test_a_repeat_below_one_is_refused(capsys):
  with pytest.raises(SystemExit) as e:
    trace_step.main(["--config=configs/tiny.py", "--repeat=0"])
  assert e.value.code == 2 and "--repeat=0" in capsys.readouterr().err
