"""How run directories are named: by the overrides that make another run, sorted, never nested;
not by the mesh or trainer.max_steps (what a run is), directories named so by an older axtrain
still found, and README's sweep (split from tests/test_run_dirs.py, whose one-step config and
fixtures it uses)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from launcher import config_loading, run_dir, run_names
from tests.test_run_dirs import axtrain, compile_cache, quick  # noqa: F401  (fixtures)

pytestmark = pytest.mark.share_experiments  # tests/conftest.py


def test_default_dir_sorts_overrides_and_never_nests():
  base = run_names.default_dir("configs/tiny.py", [])
  assert base == pathlib.Path("runs/tiny/base")
  one = run_names.default_dir("configs/tiny.py", [("trainer.seed", "1"), ("data.seq_len", "32")])
  other = run_names.default_dir("configs/tiny.py", [("data.seq_len", "32"), ("trainer.seed", "1")])
  assert one == other == pathlib.Path("runs/tiny/data.seq_len=32,trainer.seed=1")
  # A repeated key: the last value wins, as it does in the config.
  assert run_names.default_dir("c.py", [("a", "1"), ("a", "2")]).name == "a=2"
  assert run_names.default_dir("configs/gpt2.py:size=xl", []) == pathlib.Path(
      "runs/gpt2_size=xl/base")
  for a in (base, one):
    for b in (base, one):
      assert a == b or not (a in b.parents or b in a.parents)


def _named(*overrides: str) -> str:
  """The directory name of `axtrain --config=configs/tiny.py OVERRIDES`."""
  argv = ["axtrain", *overrides]
  items = config_loading.overrides(argv)
  resolved = config_loading.load("configs/tiny.py", *overrides)
  effective = run_names.effective_overrides(items, resolved=resolved,
                                            base=config_loading.load("configs/tiny.py"))
  return run_names.name("configs/tiny.py", effective).name


def test_one_config_is_one_directory_name():
  lr = "--config.optimizer.learning_rate="
  # The value as resolved, one spelling: 2e-3, 0.002 and 0.0020 are one learning rate.
  assert _named(lr + "2e-3") == _named(lr + "0.002") == _named(lr + "0.0020") == (
      "optimizer.learning_rate=0.002")
  # Overrides that set what the file holds (tiny: AdamW, 300 steps) name nothing.
  assert _named(lr + "2e-3", "--config.optimizer.kind=adamw",
                "--config.trainer.max_steps=300") == "optimizer.learning_rate=0.002"
  assert _named("--config.optimizer.kind=adamw") == "base"
  # A switched kind names its fields even where they equal the old kind's.
  assert _named("--config.optimizer.kind=lion", "--config.optimizer.learning_rate=3e-3") == (
      "optimizer.kind=lion,optimizer.learning_rate=0.003")


def test_the_mesh_and_max_steps_name_no_directory():
  assert _named("--config.mesh.fsdp=2", "--config.mesh.data=1") == "base"
  assert _named("--config.checkpoint.every_steps=10", "--config.trainer.max_steps=40") == "base"
  assert _named("--config.trainer.grad_accum_steps=2", "--config.model.remat=full",
                "--config.trainer.seed=3") == "trainer.seed=3"
  assert _named("--config.eval.batch_size=4") == "eval.batch_size=4"  # another measurement
  assert [k for k in ("mesh.context", "mesh.rules", "trainer.grad_accum_steps",
                      "checkpoint.restore_step", "trainer.log_every") if run_dir.relaid(k)] == [
      "mesh.context", "mesh.rules", "trainer.grad_accum_steps", "checkpoint.restore_step",
      "trainer.log_every"]
  assert not any(run_dir.relaid(k) for k in ("trainer.max_steps", "trainer.seed",
                                             "model.scan_layers", "data.batch_size",
                                             "trainer.compute_dtype", "eval.num_batches"))


def test_raising_max_steps_extends_the_run_in_its_automatic_directory(quick, capsys):
  code, err = axtrain(capsys)
  assert code == 0, err
  code, err = axtrain(capsys, "--config.trainer.max_steps=3")
  assert code == 0 and "axtrain: note: extending runs/quick/base from trainer.max_steps 1 to 3, " \
      "continuing from step 1" in err, err
  runs = quick / "runs" / "quick"
  assert [p.name for p in runs.iterdir()] == ["base"]
  steps = [r["step"] for r in map(json.loads, (runs / "base" / "metrics.jsonl").read_text()
                                  .splitlines()) if "loss" in r]
  assert steps == [1, 2, 3]
  code, err = axtrain(capsys)  # the file's max_steps (1) is below the run's 3 now
  assert code == 2 and "trainer.max_steps 1 is below the run's 3" in err, err


def _legacy(quick, capsys, name: str, *args: str) -> pathlib.Path:
  """A run in runs/quick/<name>, as an axtrain that named directories so had put it."""
  code, err = axtrain(capsys, f"--output_dir=runs/quick/{name}", *args)
  assert code == 0, err
  return quick / "runs" / "quick" / name


def test_a_directory_named_with_max_steps_or_the_mesh_is_still_found(quick, capsys):
  old = _legacy(quick, capsys, "trainer.max_steps=2", "--config.trainer.max_steps=2")
  code, err = axtrain(capsys, "--config.trainer.max_steps=3")
  assert code == 0 and "extending runs/quick/trainer.max_steps=2 from trainer.max_steps 2 to 3" \
      in err, err
  code, err = axtrain(capsys, "--config.trainer.max_steps=3")
  assert code == 0 and "runs/quick/trainer.max_steps=2 already completed" in err, err
  mesh = _legacy(quick, capsys, "mesh.fsdp=1,trainer.seed=5", "--config.mesh.fsdp=1",
                 "--config.trainer.seed=5")
  code, err = axtrain(capsys, "--config.trainer.seed=5", "--config.mesh.data=1")
  assert code == 0 and f"{mesh.relative_to(quick)} already completed" in err, err
  assert sorted(p.name for p in old.parent.iterdir()) == [mesh.name, old.name]
  # Beside a run named by this axtrain, the same command would continue either: it asks.
  assert axtrain(capsys)[0] == 0
  code, err = axtrain(capsys, "--config.trainer.max_steps=4")
  assert code == 2 and err == ("axtrain: error: runs/quick holds 2 runs that this command "
                               "continues (trainer.max_steps=2, base; trainer.max_steps and the "
                               "mesh name no directory now); give --output_dir=<one of them>\n")


def test_the_readme_sweep_names_the_directories_the_loop_makes():
  """README's "Sweeps" loop and the directories its comment says it makes: each name as the
  command names it (the value as resolved and written by Python, not as typed)."""
  text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
  loop = re.search(r"^for lr in ([^;]+); do axtrain --config=configs/tiny\.py "
                   r"--config\.optimizer\.learning_rate=\$lr; done\n# -> (.+)$", text, re.M)
  assert loop, "README's sweep loop and its `# -> ...` comment"
  said = [pathlib.PurePath(p) for p in loop.group(2).split()]
  made = [pathlib.PurePath("runs/tiny", _named(f"--config.optimizer.learning_rate={lr}"))
          for lr in loop.group(1).split()]
  assert said == made
