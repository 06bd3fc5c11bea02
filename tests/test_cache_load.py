"""benchmarks/cache_load.py: a train step compiled into the compilation cache, then loaded back
in a fresh process, timed, as one JSON line."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from benchmarks import cache_load

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_step_compiled_into_the_cache_loads_back_in_a_fresh_process(tmp_path):
  # Its own process, as a user runs it: JAX decides once per process whether its cache is used.
  done = subprocess.run([sys.executable, "-m", "benchmarks.cache_load", "--config=configs/tiny.py",
                         "--config.model.num_layers=1", f"--cache={tmp_path}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  row = json.loads(done.stdout.strip().splitlines()[-1])
  assert row["overrides"] == ["--config.model.num_layers=1"]
  assert 100 < row["hlo_instructions"] < row["hlo_lines"]  # computations' headers are lines too
  # The entry is in the folder given, and the other process read it back: no "load" note.
  assert "load" not in row, row
  assert list(tmp_path.glob(f"{cache_load.TRAIN}-*"))
  assert 0 < row["stored_mb"] < row["executable_mb"]  # compressed on disk
  assert row["load_s"] > 0 and row["process_cpu_s"] >= 0 and row["read_s"] >= 0


@pytest.mark.parametrize("args, said", [
    (["--config=configs/tiny.py", "--mesh=tpu-v9"], "did you mean"),
    (["--config=configs/nope.py"], "configs/nope.py"),
    (["--config=configs/tiny.py", "--steps=3"], "unrecognized arguments: --steps=3"),
    (["--config=configs/tiny.py", "--config.model.num_layers=nan"], "num_layers=nan"),
])
def test_a_mistake_is_one_line_and_exit_2(capsys, args, said):
  with pytest.raises(SystemExit) as e:
    cache_load.main(args)
  err = capsys.readouterr().err
  assert e.value.code == 2 and said in err and "Traceback" not in err
