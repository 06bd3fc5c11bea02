"""JAX's persistent compilation cache is on by default (trainer.compile_cache): a second run of
the same setting, and a resumed run, read their programs back instead of compiling them; run.json
says where the time to the first step went (`startup`).

The runs of one test share a process (tests/cli_batch.py): a run in the same process compiles
its steps again (new traces) and finds them in the persistent cache as a new process would.
JAX decides once per process whether it uses the cache, so "off" has a process of its own.
"""

from __future__ import annotations

import json
import pathlib

from tests.ckpt_util import losses
from tests.conftest import cli_batch

# The `test` model at the suite's small shapes (tests/test_kinds_cli.py): what is cached does not
# depend on the model, and configs/tiny.py's programs compiled for seconds each.
TINY = ["--config=configs/llama.py:size=test", "--config.trainer.max_steps=2",
        "--config.data.seq_len=32", "--config.data.batch_size=4", "--config.eval.batch_size=4",
        "--config.eval.num_batches=1"]
READ = "read from the compilation cache"


def _entries(folder: pathlib.Path) -> list[pathlib.Path]:
  return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def test_a_second_run_reads_the_first_runs_programs(tmp_path):
  # A state in host memory, every program cached (JAX's minimum compile time 0): the second run
  # initialises beside its steps' loads (trainer/early_init.py), the extension reads its
  # checkpoint beside them (trainer/early_restore.py).
  cache = f"--config.trainer.compile_cache={tmp_path / 'cache'}"
  host = "--config.trainer.state_memory=host"
  first, second, extended = cli_batch([
      [*TINY, host, cache, f"--output_dir={tmp_path / 'a'}"],
      [*TINY, host, cache, f"--output_dir={tmp_path / 'b'}"],
      [*TINY, host, "--config.trainer.max_steps=3", cache, f"--output_dir={tmp_path / 'a'}"]],
      env={"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
  assert first.returncode == 0, first.stderr[-2000:]
  assert READ not in first.stderr and _entries(tmp_path / "cache")
  startup = json.loads((tmp_path / "a" / "run.json").read_text())["startup"]  # trainer/startup.py
  assert (0 < startup["to_experiment_s"] <= startup["to_steps_compiled_s"]
          <= startup["to_compiled_s"] <= startup["to_first_step_s"])
  assert startup["first_step_s"] > startup["first_compile_s"] > 0 and startup["state_s"] >= 0
  spent = startup["compile"]  # JAX's own seconds: compiled (the loop reads back a program)
  assert spent["trace_s"] > 0 and spent["lower_s"] > 0 and spent["compile_s"] > 0
  assert spent["cache_read_s"] < spent["compile_s"]
  at = startup["compile_at"]  # the same seconds by phase: the steps' compile is in its phase
  assert 0 < at["to_steps_compiled_s"]["compile_s"] <= at["to_compiled_s"]["compile_s"]
  assert at["to_compiled_s"]["trace_s"] <= spent["trace_s"]
  programs = startup["compile_by_program"]  # by program: the train step's among them
  assert any("train" in name and seconds.get("compile_s", 0) > 0
             for name, seconds in programs.items()), programs
  for run in (second, extended):  # a second run of the setting; the same run extended (resumed)
    assert run.returncode == 0 and READ in run.stderr, run.stderr[-2000:]
  startup = json.loads((tmp_path / "b" / "run.json").read_text())["startup"]
  spent = startup["compile"]
  assert 0 <= spent["cache_read_s"] <= spent["compile_s"] and spent["trace_s"] > 0
  # the first run's programs were loaded while the second traced (trainer/compile_prefetch.py),
  # its initialisation's first, and run there: the same state, the same losses
  assert startup["programs_loaded_ahead"] >= 2, startup
  assert startup["init_run_s"] > 0 and startup["init_started_s"] <= startup["to_compiled_s"]
  second_losses = losses(tmp_path / "b")
  assert second_losses and second_losses == {s: losses(tmp_path / "a")[s] for s in second_losses}
  resumed = json.loads((tmp_path / "a" / "run.json").read_text())["startup"]
  assert "init_run_s" not in resumed and resumed["restore_read_s"] > 0, resumed


def test_the_cache_can_be_turned_off_and_a_bad_folder_is_one_line(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  off, bad, empty = cli_batch([
      [*TINY, "--config.trainer.compile_cache=off", f"--output_dir={tmp_path / 'a'}"],
      [*TINY, f"--config.trainer.compile_cache={blocker / 'sub'}", f"--output_dir={tmp_path / 'b'}"],
      [*TINY, "--config.trainer.compile_cache=", f"--output_dir={tmp_path / 'c'}"]],
      env={"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "env_cache")})
  assert off.returncode == 0, off.stderr[-2000:]
  assert not _entries(tmp_path / "env_cache")
  assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
  assert bad.stderr.startswith("axtrain: error: trainer.compile_cache=")
  assert empty.returncode == 2 and empty.stderr.startswith(
      "axtrain: error: trainer.compile_cache is empty;"), empty.stderr
  assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
