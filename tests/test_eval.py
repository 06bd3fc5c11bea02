"""`axtrain eval`: a checkpoint's held-out loss without training, and its one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest

from launcher import main as main_lib
from trainer.data.base import DATA

pytestmark = pytest.mark.share_experiments  # tests/conftest.py


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """Six tiny steps with a checkpoint and an evaluation at steps 3 and 6."""
  out = tmp_path_factory.mktemp("eval") / "run"
  code = main_lib.main([
      "axtrain", "--config=configs/tiny.py", "--config.trainer.max_steps=6",
          "--config.optimizer.schedule.warmup_steps=0",
      "--config.trainer.log_every=3", "--config.data.seq_len=32", "--config.eval.num_batches=1",
      "--config.eval.batch_size=8", "--config.eval.every_steps=3",
      "--config.checkpoint.every_steps=3", "--progress=false", f"--output_dir={out}"])
  assert code == 0
  return out


def axtrain_eval(capsys, *args):
  code = main_lib.main(["axtrain", "eval", *map(str, args)])
  out, err = capsys.readouterr()
  return code, out, err


def evals(run_dir):
  lines = (run_dir / "metrics.jsonl").read_text().splitlines()
  return [r for r in map(json.loads, lines) if "eval_loss" in r]


def test_eval_reproduces_the_runs_eval_loss_exactly(run, capsys, tmp_path):
  run_dir = tmp_path / "run"
  shutil.copytree(run, run_dir)
  trained = {r["step"]: r for r in evals(run_dir)}
  assert sorted(trained) == [3, 6]
  info = json.loads((run_dir / "run.json").read_text())
  assert info["final_eval_loss"] == trained[6]["eval_loss"]

  code, out, err = axtrain_eval(capsys, f"--run_dir={run_dir}")  # latest: step 6
  assert code == 0, err
  code, _, err = axtrain_eval(capsys, f"--run_dir={run_dir}", "--step=3")
  assert code == 0, err
  latest, earlier = evals(run_dir)[-2:]
  for got, step in ((latest, 6), (earlier, 3)):  # loss, perplexity, tokens; not the time
    assert got.pop("eval_time_s") > 0 and trained[step].pop("eval_time_s") > 0
    assert got == {**trained[step], "source": "axtrain eval"}
  assert out.startswith(f"step 6: eval_loss {trained[6]['eval_loss']:.6f} ")


def test_eval_with_overrides_reads_other_eval_data(run, capsys, tmp_path):
  run_dir = tmp_path / "run"
  shutil.copytree(run, run_dir)
  code, _, err = axtrain_eval(capsys, f"--run_dir={run_dir}", "--config.eval.num_batches=2",
                              "--config.data.kind=synthetic")
  assert code == 0, err
  record = evals(run_dir)[-1]
  trained = json.loads((run_dir / "config.json").read_text())["data"]
  data = {"kind": "synthetic", "seq_len": trained["seq_len"], "batch_size": trained["batch_size"]}
  source = DATA.build(DATA.parse(data, "data"), vocab_size=256, seed=0)
  batches = source.eval_batches(batch_size=8, num_batches=2, process_index=0, process_count=1)
  assert record["eval_tokens"] == sum(int(b["weights"].sum()) for b in batches)
  assert record["eval_loss"] != evals(run)[-1]["eval_loss"]
  assert record["overrides"] == "--config.eval.num_batches=2 --config.data.kind=synthetic"


@pytest.mark.parametrize("case", ["no_checkpoints", "missing_step", "bad_key", "fixed_section",
                                  "bad_value", "not_a_run"])
def test_mistakes_are_one_line_exit_2_and_write_nothing(run, capsys, tmp_path, case):
  run_dir = tmp_path / "run"
  shutil.copytree(run, run_dir)
  args, expect = {
      "no_checkpoints": ([], "holds no checkpoints/ directory"),
      "missing_step": (["--step=4"], "--step=4 is not a committed checkpoint"),
      "bad_key": (["--config.eval.num_batch=2"], "did you mean 'num_batches'"),
      "fixed_section": (["--config.model.dim=8"], "--config.model.dim cannot be overridden"),
      "bad_value": (["--config.eval.batch_size=big"], "expected a value of type int"),
      "not_a_run": ([], "has no config.json"),
  }[case]
  if case == "no_checkpoints":
    shutil.rmtree(run_dir / "checkpoints")
  target = tmp_path if case == "not_a_run" else run_dir
  before = (run_dir / "metrics.jsonl").read_text()
  code, out, err = axtrain_eval(capsys, f"--run_dir={target}", *args)
  assert code == 2 and out == ""
  assert err.startswith("axtrain: error: eval: ") and err.count("\n") == 1, err
  assert expect in err
  assert (run_dir / "metrics.jsonl").read_text() == before


def test_eval_microbatches_give_the_same_loss(run, capsys, tmp_path):
  """eval.microbatch_rows=2 passes the 8 rows of each eval batch in 4 scans of 2: the same loss
  and token count as one pass (the sums add up in another order: float32 rounding)."""
  run_dir = tmp_path / "run"
  shutil.copytree(run, run_dir)
  results = []
  for rows in (0, 2):
    code, out, err = axtrain_eval(capsys, f"--run_dir={run_dir}",
                                  f"--config.eval.microbatch_rows={rows}")
    assert code == 0, err
    results.append(evals(run_dir)[-1])
  one, four = results
  assert four["eval_tokens"] == one["eval_tokens"]
  assert four["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-6)
  code, _, err = axtrain_eval(capsys, f"--run_dir={run_dir}", "--config.eval.microbatch_rows=3")
  assert code == 2 and "eval.microbatch_rows=3" in err


def test_a_full_disk_is_one_line_and_leaves_metrics_whole(run, capsys, tmp_path, monkeypatch):
  """The disk fills as eval appends its record (fault injection: os.write of metrics.jsonl
  writes half the record, then raises ENOSPC): one line naming the device and metrics.jsonl,
  exit 74, the half record taken back, so the file is what it was."""
  import errno  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  from launcher.errors import EXIT_NO_SPACE  # pylint: disable=import-outside-toplevel
  from trainer import disk  # pylint: disable=import-outside-toplevel
  run_dir = tmp_path / "run"
  shutil.copytree(run, run_dir)
  before, real_write, written = (run_dir / "metrics.jsonl").read_bytes(), os.write, []

  def write(fd, data):
    if not os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl"):
      return real_write(fd, data)
    if not written:
      written.append(real_write(fd, bytes(data)[:len(data) // 2]))
      return written[0]
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "write", write)
  code, out, err = axtrain_eval(capsys, f"--run_dir={run_dir}")
  assert code == EXIT_NO_SPACE and out == "" and err.count("\n") == 1, err
  assert err.startswith(f"axtrain: error: no space left on {disk.device_text(tmp_path)} writing "
                        f"{run_dir.absolute() / 'metrics.jsonl'} ("), err
  assert written and (run_dir / "metrics.jsonl").read_bytes() == before
