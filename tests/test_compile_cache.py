"""JAX's persistent compilation cache is on by default (trainer.compile_cache): a second run of
the same setting, and a resumed run, read their programs back instead of compiling them; run.json
says where the time to the first step went (`startup`)."""

from __future__ import annotations

import json
import pathlib

from tests.conftest import cli

TINY = ("--config=configs/tiny.py", "--config.trainer.max_steps=2", "--config.eval.num_batches=1")
READ = "read from the compilation cache"


def _entries(folder: pathlib.Path) -> list[pathlib.Path]:
  return [p for p in folder.rglob("*") if p.is_file()]


def test_a_second_run_reads_the_first_runs_programs(tmp_path):
  cache = tmp_path / "cache"
  env = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  first = cli(*TINY, f"--config.trainer.compile_cache={cache}", f"--output_dir={tmp_path / 'a'}",
              env=env)
  assert first.returncode == 0, first.stderr[-2000:]
  assert READ not in first.stderr and _entries(cache)
  startup = json.loads((tmp_path / "a" / "run.json").read_text())["startup"]  # trainer/startup.py
  assert 0 < startup["to_experiment_s"] <= startup["to_compiled_s"] <= startup["to_first_step_s"]
  assert startup["first_step_s"] > 0 and startup["state_s"] >= 0
  second = cli(*TINY, f"--config.trainer.compile_cache={cache}",
               f"--output_dir={tmp_path / 'b'}", env=env)
  assert second.returncode == 0, second.stderr[-2000:]
  assert READ in second.stderr, second.stderr[-2000:]
  # the same run extended (resumed from its checkpoint) reads them too
  resumed = cli(*TINY[:1], "--config.trainer.max_steps=3", *TINY[2:],
                f"--config.trainer.compile_cache={cache}", f"--output_dir={tmp_path / 'a'}",
                env=env)
  assert resumed.returncode == 0 and READ in resumed.stderr, resumed.stderr[-2000:]


def test_the_cache_can_be_turned_off_and_a_bad_folder_is_one_line(tmp_path):
  env = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "env_cache")}
  off = cli(*TINY, "--config.trainer.compile_cache=off", f"--output_dir={tmp_path / 'a'}", env=env)
  assert off.returncode == 0, off.stderr[-2000:]
  assert not (tmp_path / "env_cache").exists() or not _entries(tmp_path / "env_cache")
  blocker = tmp_path / "file"
  blocker.write_text("x")
  bad = cli(*TINY, f"--config.trainer.compile_cache={blocker / 'sub'}",
            f"--output_dir={tmp_path / 'b'}", env=env)
  assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
  assert bad.stderr.startswith("axtrain: error: trainer.compile_cache=")
  assert not (tmp_path / "b").exists()
  empty = cli(*TINY, "--config.trainer.compile_cache=", f"--output_dir={tmp_path / 'c'}", env=env)
  assert empty.returncode == 2 and empty.stderr.startswith(
      "axtrain: error: trainer.compile_cache is empty;"), empty.stderr
