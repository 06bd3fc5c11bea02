"""Run directories: one per run, never nested; --overwrite touches exactly one run's own files."""

from __future__ import annotations

import json
import pathlib

import pytest

from launcher import main as main_lib, run_dir

QUICK = '''
from configs import llama


def get_config(arg=None):
  cfg = llama.get_config("size=test")
  cfg.trainer.max_steps = 1
  cfg.optimizer.schedule.warmup_steps = 0
  cfg.data.seq_len = 32
  cfg.eval.batch_size = 8
  cfg.eval.num_batches = 1
  cfg.trainer.log_every = 1
  cfg.trainer.hang_timeout_s = 0.0  # the watchdog needs a real stderr; capsys has none
  return cfg
'''
# A sweep over seeds: every run compiles the same programs, so the compile cache serves them.
SWEEP = (["--config.trainer.seed=1"], ["--config.trainer.seed=2"])
NAMES = ["base", "trainer.seed=1", "trainer.seed=2"]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
  import jax  # pylint: disable=import-outside-toplevel
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  before = {n: getattr(jax.config, n) for n in names}
  jax.config.update(names[0], str(tmp_path_factory.mktemp("jax_cache")))
  jax.config.update(names[1], 0.0)
  yield
  for name, value in before.items():
    jax.config.update(name, value)


@pytest.fixture
def quick(tmp_path, monkeypatch, compile_cache):  # pylint: disable=unused-argument
  """A one-step config in tmp_path, run from there (default run directories land in it)."""
  (tmp_path / "quick.py").write_text(QUICK)
  monkeypatch.chdir(tmp_path)
  return tmp_path


def axtrain(capsys, *args) -> tuple[int, str]:
  code = main_lib.main(["axtrain", "--config=quick.py", "--noprogress", *args])
  return code, capsys.readouterr().err


def snapshot(root: pathlib.Path) -> dict:
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_default_dir_sorts_overrides_and_never_nests():
  base = run_dir.default_dir("configs/tiny.py", [])
  assert base == pathlib.Path("runs/tiny/base")
  one = run_dir.default_dir("configs/tiny.py", [("trainer.seed", "1"), ("data.seq_len", "32")])
  other = run_dir.default_dir("configs/tiny.py", [("data.seq_len", "32"), ("trainer.seed", "1")])
  assert one == other == pathlib.Path("runs/tiny/data.seq_len=32,trainer.seed=1")
  # A repeated key: the last value wins, as it does in the config.
  assert run_dir.default_dir("c.py", [("a", "1"), ("a", "2")]).name == "a=2"
  assert run_dir.default_dir("configs/gpt2.py:size=xl", []) == pathlib.Path("runs/gpt2_size=xl/base")
  for a in (base, one):
    for b in (base, one):
      assert a == b or not (a in b.parents or b in a.parents)


def test_flags_in_two_orders_are_one_run(quick, capsys):
  first = ["--config.trainer.seed=1", "--config.eval.batch_size=8"]
  code, err = axtrain(capsys, *first)
  assert code == 0, err
  runs = [p for p in (quick / "runs" / "quick").iterdir()]
  assert [p.name for p in runs] == ["eval.batch_size=8,trainer.seed=1"]
  code, err = axtrain(capsys, *reversed(first))
  assert code == 0 and "already completed; nothing to do" in err, err
  assert list((quick / "runs" / "quick").iterdir()) == runs


def test_overwrite_replaces_one_run_and_no_other(quick, capsys):
  runs = quick / "runs" / "quick"
  for args in ([], *SWEEP):
    code, err = axtrain(capsys, *args)
    assert code == 0, err
  names = sorted(p.name for p in runs.iterdir())
  assert names == NAMES
  for args, name in zip(([], *SWEEP), NAMES):
    others = {n: snapshot(runs / n) for n in names if n != name}
    before = json.loads((runs / name / "run.json").read_text())
    (runs / name / "metrics.jsonl").write_text("stale\n")  # so a rewrite shows
    code, err = axtrain(capsys, *args, "--overwrite")
    assert code == 0, err
    after = json.loads((runs / name / "run.json").read_text())
    assert after["status"] == "completed" and after["first_start_time"] >= before["start_time"]
    assert (runs / name / "metrics.jsonl").read_text().startswith('{"step": 1')
    assert {n: snapshot(runs / n) for n in others} == others, f"--overwrite of {name} touched another run"


def test_overwrite_refuses_a_directory_with_foreign_files(quick, capsys):
  out = quick / "mine"
  out.mkdir()
  (out / "notes.txt").write_text("keep me")
  (out / "config.json").write_text("{}")
  before = snapshot(out)
  for extra in ([], ["--overwrite"]):
    code, err = axtrain(capsys, f"--output_dir={out}", *extra)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"axtrain: error: {out} holds files that axtrain did not write "
                          f"(notes.txt)")
    assert snapshot(out) == before


def test_overwrite_of_a_converted_directory_keeps_what_convert_wrote(tmp_path):
  out = tmp_path / "converted"
  (out / "checkpoints" / "0").mkdir(parents=True)
  (out / "checkpoints" / "0" / "state").write_text("weights")
  (out / "checkpoints" / "5").mkdir()
  (out / "superseded_checkpoints").mkdir()
  for name, text in (("config.py", "py"), ("hf_config.json", "{}"), ("metrics.jsonl", "{}\n")):
    (out / name).write_text(text)
  config = {"trainer": {"max_steps": 10}, "checkpoint": {"restore_step": 0}}
  (out / "config.json").write_text(json.dumps(config))
  (out / "run.json").write_text(json.dumps({"status": "converted", "converted_from": "/hf",
                                            "hf_dtype": "BF16"}))
  rd = run_dir.RunDir(out)
  # restore_step chooses where to resume; it does not make another run.
  assert rd.prepare({**config, "checkpoint": {"restore_step": 3}}, overwrite=False) == "incomplete"
  with pytest.raises(run_dir.UserError, match="trainer.max_steps differ"):
    rd.prepare({**config, "trainer": {"max_steps": 2}}, overwrite=False)
  with pytest.raises(run_dir.UserError, match="converted from Hugging Face; this config changes "
                                               "its model.dim"):
    rd.prepare({**config, "model": {"dim": 8}}, overwrite=True)
  assert rd.prepare({**config, "trainer": {"max_steps": 2}}, overwrite=True) == "overwrite"
  rd.start({**config, "trainer": {"max_steps": 2}}, argv=["axtrain"], fresh=True, extra={})
  assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.json", "config.py",
                                                   "hf_config.json", "run.json"]
  assert [p.name for p in (out / "checkpoints").iterdir()] == ["0"]
  assert (out / "checkpoints" / "0" / "state").read_text() == "weights"
  assert (out / "config.py").read_text() == "py"
  info = json.loads((out / "run.json").read_text())
  assert info["converted_from"] == "/hf" and info["hf_dtype"] == "BF16"
  assert info["status"] == "running"
  # Once checkpoint.keep has rotated the converted weights out, --overwrite would lose them.
  (out / "checkpoints" / "0" / "state").unlink()
  (out / "checkpoints" / "0").rmdir()
  with pytest.raises(run_dir.UserError, match="rotated out"):
    rd.prepare(config, overwrite=True)
