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


@pytest.mark.parametrize("args, said", [
    (["--config=configs/tiny.py", "--repeat=0"], "--repeat=0"),
    (["--config=configs/nope.py"], "configs/nope.py"),
    (["--config=configs/llama.py"], "size"),
    (["--config=configs/tiny.py", "--mesh=tpu-v9"], "did you mean"),
])
def test_a_mistake_is_one_line_and_exit_2(capsys, args, said):
  with pytest.raises(SystemExit) as e:
    trace_step.main(args)
  err = capsys.readouterr().err
  assert e.value.code == 2 and said in err and "Traceback" not in err
