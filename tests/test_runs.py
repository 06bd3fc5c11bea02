"""`axtrain runs`: a three-run learning-rate sweep side by side (table, --json, --plot)."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import statistics
import sys

import pytest

from launcher import eval_run, main as main_lib, runs as runs_lib
from tests.conftest import ROOT

LEARNING_RATES = ("1e-3", "3e-3", "1e-2")
SHORT = ["--config=configs/llama.py:size=test", "--config.trainer.max_steps=6",
         "--config.trainer.log_every=2",
         "--config.optimizer.schedule.warmup_steps=0",
         "--config.data.seq_len=32", "--config.eval.num_batches=1", "--config.eval.batch_size=8",
         "--progress=false"]


@pytest.fixture(autouse=True)
def no_terminal_width(monkeypatch):
  """The tables here are compared whole: no width to fit unless a test sets COLUMNS."""
  monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  root = tmp_path_factory.mktemp("sweep")
  for lr in LEARNING_RATES:
    code = main_lib.main(["axtrain", *SHORT, f"--config.optimizer.learning_rate={lr}",
                          f"--output_dir={root / 'tiny' / f'lr={lr}'}"])
    assert code == 0
  return root


def axtrain(capsys, *args):
  code = main_lib.main(["axtrain", "runs", *map(str, args)])
  out, err = capsys.readouterr()
  return code, out, err


def records(run_dir):
  return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def expected(run_dir):
  """(final train loss, final eval loss) read straight from metrics.jsonl."""
  rs = records(run_dir)
  return ([r["loss"] for r in rs if "loss" in r][-1], [r["eval_loss"] for r in rs
                                                       if "eval_loss" in r][-1])


def cells(line):
  return re.split(r"\s{2,}", line.strip())


def test_table_shows_only_the_swept_key_and_the_right_losses(sweep, capsys):
  code, out, err = axtrain(capsys, sweep)
  assert code == 0, err
  header, *rows = out.splitlines()
  columns = cells(header)
  assert columns[:3] == ["run", "optimizer.learning_rate", "status"]  # the only differing key
  assert len(rows) == 3
  evals = []
  for row in rows:
    name, lr, status, steps, loss, best, final, *_ = cells(row)
    run_dir = sweep / "tiny" / name
    final_loss, eval_loss = expected(run_dir)
    assert float(lr) == float(name.removeprefix("lr="))
    assert (status, steps) == ("completed", "6/6")
    assert loss == f"{final_loss:.4f}" and final == best == f"{eval_loss:.4f}"
    evals.append(eval_loss)
  assert evals == sorted(evals)  # best run first


def test_glob_and_json(sweep, capsys):
  code, out, err = axtrain(capsys, sweep / "tiny" / "*", "--json")
  assert code == 0, err
  runs = json.loads(out)
  assert sorted(r["name"] for r in runs) == sorted(f"lr={lr}" for lr in LEARNING_RATES)
  for r in runs:
    final_loss, eval_loss = expected(sweep / "tiny" / r["name"])
    assert r["config"] == {"optimizer.learning_rate": float(r["name"].removeprefix("lr="))}
    assert (r["final_loss"], r["final_eval_loss"], r["steps"]) == (final_loss, eval_loss, 6)
    assert r["tokens_per_sec"] > 0 and (r["mfu"] is None or r["mfu"] > 0)


def test_plot_writes_a_png(sweep, capsys, tmp_path):
  from matplotlib import image  # pylint: disable=import-outside-toplevel
  target = tmp_path / "sweep.png"
  code, _, err = axtrain(capsys, sweep, f"--plot={target}")
  assert code == 0, err
  assert target.stat().st_size > 0
  pixels = image.imread(target)
  assert pixels.shape[0] > 100 and pixels.shape[1] > 100


@pytest.fixture(scope="module")
def many_runs(tmp_path_factory):
  """28 runs: copies of a saved sweep run, each with its own learning rate and 2,000 logged
  steps (a long sweep's curves)."""
  root = tmp_path_factory.mktemp("many")
  saved = ROOT / "tests" / "testdata" / "sweep" / "lr=1e-3"
  for i in range(28):
    run = root / f"run{i:02d}"
    shutil.copytree(saved, run)
    config = json.loads((run / "config.json").read_text())
    config["optimizer"]["learning_rate"] = (i + 1) * 1e-4
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 4.0 - s / 1000 + i / 100}) + "\n" for s in range(1, 2001))
        + "".join(json.dumps({"step": s, "eval_loss": 4.1 - s / 1000 + i / 100}) + "\n"
                  for s in range(200, 2001, 200)))
  return root


def test_plot_of_many_runs_prints_no_warning(many_runs, capsys, tmp_path, monkeypatch):
  """Issue 34: `runs --plot` printed matplotlib's UserWarning that its search for a free spot
  for the legend is slow. Its clock here runs 2 s per reading, as on a slow machine with long
  curves; the plot must not depend on that search (nor warn about anything else)."""
  import itertools  # pylint: disable=import-outside-toplevel
  import types  # pylint: disable=import-outside-toplevel
  import warnings  # pylint: disable=import-outside-toplevel
  from matplotlib import legend  # pylint: disable=import-outside-toplevel
  clock = itertools.count(0.0, 2.0)
  monkeypatch.setattr(legend, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
  target = tmp_path / "many.png"
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    code, out, err = axtrain(capsys, many_runs, f"--plot={target}")
  assert code == 0 and err == f"axtrain: wrote {target}\n", err
  assert [str(w.message) for w in caught] == []
  assert len(out.splitlines()) == 29 and target.stat().st_size > 0


def test_the_legend_of_many_runs_stays_beside_the_curves(many_runs):
  """The legend names the LEGEND_RUNS best runs and sums up the rest in one entry; it lies
  beside the axes, inside the figure, so no curve is hidden under it."""
  runs, keys = runs_lib.collect([str(many_runs)])
  fig = runs_lib.figure(runs, keys, title="axtrain runs " + " ".join(str(r.path) for r in runs))
  fig.canvas.draw()
  ax, = fig.axes
  legend = ax.get_legend()
  labels = [t.get_text() for t in legend.get_texts()]
  assert labels[:runs_lib.LEGEND_RUNS] == [f"optimizer.learning_rate={show}" for show in
                                           (runs_lib.show_value(r.config["optimizer.learning_rate"])
                                            for r in runs[:runs_lib.LEGEND_RUNS])]
  assert labels[runs_lib.LEGEND_RUNS:] == [
      f"{28 - runs_lib.LEGEND_RUNS} more runs (gray; `axtrain runs` lists them)",
      "train loss (solid)", "eval loss (dashed)"]
  box, axes_box, page = (legend.get_window_extent(), ax.get_window_extent(), fig.bbox)
  assert box.x0 >= axes_box.x1  # beside the axes, not over them
  assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
  title = ax.title.get_window_extent()
  assert page.x0 <= title.x0 and title.x1 <= page.x1 and ax.get_title() == "axtrain runs: 28 runs"
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  plt.close(fig)


def test_plot_without_matplotlib_says_how_to_install(sweep, capsys, tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
  code, out, err = axtrain(capsys, sweep, f"--plot={tmp_path / 'p.png'}")
  assert code == 2 and out == "" and not (tmp_path / "p.png").exists()
  assert err.count("\n") == 1 and "pip install 'axtrain[plot]'" in err


def test_plot_format_follows_the_suffix_and_bad_targets_are_refused(sweep, capsys, tmp_path):
  code, _, err = axtrain(capsys, sweep, f"--plot={tmp_path / 'sweep.svg'}")
  assert code == 0 and (tmp_path / "sweep.svg").read_text().lstrip().startswith("<?xml"), err
  (tmp_path / "afile").write_text("x")
  for target, message in (
      (tmp_path / "out.txt", f"--plot={tmp_path / 'out.txt'}: name a .png, .svg, .pdf file"),
      (tmp_path / "afile" / "x.png", f"{tmp_path / 'afile'} is a file, not a directory"),
      (tmp_path / "afile" / "sub" / "x.png", f"{tmp_path / 'afile'} is a file, not a directory"),
      (tmp_path / "nodir" / "x.png", f"directory {tmp_path / 'nodir'} does not exist")):
    code, out, err = axtrain(capsys, sweep, f"--plot={target}")
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert not target.exists()
  assert (tmp_path / "afile").read_text() == "x"


def test_corrupt_line_is_skipped_with_a_warning_and_status_shows(sweep, capsys, tmp_path):
  run = tmp_path / "broken"
  shutil.copytree(sweep / "tiny" / "lr=1e-3", run)
  rs = records(run)
  for r in rs:
    if "loss" in r:
      r["mfu"] = r["step"] / 100  # as the loop logs it: a fraction of peak
  lines = [json.dumps(r) for r in rs]
  lines.insert(1, '{"step": 2, "loss": ')  # a record cut short
  (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  info = json.loads((run / "run.json").read_text())
  (run / "run.json").write_text(json.dumps({**info, "status": "failed"}))
  code, out, err = axtrain(capsys, run)
  assert code == 0
  assert err.strip() == f"axtrain: warning: {run / 'metrics.jsonl'} line 2: not valid JSON; skipped"
  _, row = out.splitlines()
  assert cells(row)[1:4] == ["failed", "6/6", f"{expected(sweep / 'tiny' / 'lr=1e-3')[0]:.4f}"]
  mfu = statistics.median(r["mfu"] for r in rs if "mfu" in r)
  assert cells(row)[7] == f"{100 * mfu:.2f}%"


def test_a_completed_run_without_records_is_said_not_shown_as_0_steps(sweep, capsys, tmp_path):
  run = tmp_path / "emptied"
  shutil.copytree(sweep / "tiny" / "lr=1e-3", run)
  (run / "metrics.jsonl").write_text("")
  code, out, err = axtrain(capsys, run)
  assert code == 0
  assert err == (f"axtrain: warning: {run / 'metrics.jsonl'} is empty, although the run "
                 f"completed: its steps, losses and throughput are unknown (steps shown as ?)\n")
  assert cells(out.splitlines()[1])[1:3] == ["completed", "?/6"]
  (run / "metrics.jsonl").unlink()
  code, out, err = axtrain(capsys, run, "--json")
  assert "metrics.jsonl is missing, although the run completed" in err
  assert json.loads(out)[0]["steps"] is None
  # Its checkpoints show it trained too; a run that failed before its first record and
  # checkpoint trained nothing: no warning.
  info = json.loads((run / "run.json").read_text())
  (run / "run.json").write_text(json.dumps({**info, "status": "failed"}))
  code, out, err = axtrain(capsys, run)
  assert "metrics.jsonl is missing, although the run has checkpoints up to step 6:" in err
  shutil.rmtree(run / "checkpoints")
  (run / "run.json").write_text(json.dumps({**info, "status": "failed"}))
  code, out, err = axtrain(capsys, run)
  assert err == "" and cells(out.splitlines()[1])[1:3] == ["failed", "0/6"]


def test_no_runs_is_one_line_exit_2(capsys, tmp_path):
  (tmp_path / "empty").mkdir()
  for path in (tmp_path / "empty", tmp_path / "missing*"):
    code, out, err = axtrain(capsys, path)
    assert code == 2 and out == ""
    assert err.startswith("axtrain: error: runs: ") and err.count("\n") == 1, err


SWEEP_DOC = ["--config.trainer.max_steps=100", "--config.eval.every_steps=25"]  # Makefile


def test_docs_show_the_table_of_the_saved_sweep(capsys):
  """`make sweep-doc` keeps its runs' files in tests/testdata/sweep: the table in docs/sweep.txt
  and README.md is what `axtrain runs` renders from them, and they are runs of the config the
  README's loop runs today (a changed default would show here, not only in a stale table)."""
  saved = ROOT / "tests" / "testdata" / "sweep"
  code, out, err = axtrain(capsys, saved)
  assert code == 0, err
  assert out == (ROOT / "docs" / "sweep.txt").read_text()
  assert out in (ROOT / "README.md").read_text()
  assert (ROOT / "docs" / "sweep.png").stat().st_size > 0
  from launcher import config_loading, run_dir  # pylint: disable=import-outside-toplevel
  for lr in LEARNING_RATES:
    overrides = [*SWEEP_DOC, f"--config.optimizer.learning_rate={lr}"]
    info = json.loads((saved / f"lr={lr}" / "run.json").read_text())
    assert info["status"] == "completed" and set(overrides) <= set(info["argv"]), info["argv"]
    resolved = json.loads(config_loading.load("configs/tiny.py", *overrides).to_json_best_effort())
    stored = json.loads((saved / f"lr={lr}" / "config.json").read_text())
    assert run_dir.differences(stored, run_dir.identity(resolved)) == [], (
        f"configs/tiny.py changed since `make sweep-doc` ran: run it again")
  doc = (ROOT / "docs" / "runs.md").read_text()
  # The eval example: what `axtrain eval` prints for the saved lr=3e-3 run's last evaluation,
  # which on the run's own data is the logged eval_loss (tests/test_eval.py).
  logged = [r for r in map(json.loads, (saved / "lr=3e-3" / "metrics.jsonl").read_text()
                           .splitlines()) if "eval_loss" in r and "source" not in r][-1]
  line = eval_run.result_line(logged["step"], logged,
                              pathlib.Path("runs/sweep/lr=3e-3/metrics.jsonl"))
  assert f"\n{line}\n" in doc, f"docs/runs.md should show the saved run's eval: {line}"
  assert f'`"eval_loss": {logged["eval_loss"]!r}` at step {logged["step"]}' in doc
  listed = re.search(r"one object per run with the keys (.*?) \(`null`", doc, re.S)[1]
  fields = list(runs_lib.as_dict(runs_lib.Run(path=ROOT, config={}, info={}, train=[],
                                              evals=[]), []))
  assert re.findall(r"`(\w+)`", listed) == fields
  header = cells(runs_lib.table([], []).splitlines()[0])
  rows = re.findall(r"^\| `([^`|]+)`(?:, `([^`|]+)`)? \|", doc, re.M)
  assert [c for row in rows for c in row if c] == header


LONG = "model.dim=256,model.num_layers=8,trainer.seed=7,data.seq_len=512,notes=wider"


@pytest.fixture
def unlike(tmp_path):
  """Three saved sweep runs made unlike: one switched to Lion, one with another model, seed,
  sequence length and a long name (config.json edited: the table reads nothing else of it)."""
  saved = ROOT / "tests" / "testdata" / "sweep"
  out = tmp_path / "runs"
  for source, name in (("lr=1e-3", "base"), ("lr=3e-3", "lion"), ("lr=1e-2", LONG)):
    shutil.copytree(saved / source, out / name)
  def edit(name, change):
    path = out / name / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))
  edit("lion", lambda c: c.update(optimizer={
      "kind": "lion", "learning_rate": 3e-4, "b1": 0.9, "b2": 0.99, "clip_norm": 1.0,
      "weight_decay": 0.1, "decay_embeddings": True, "state_dtype": "float32",
      "schedule": c["optimizer"]["schedule"]}))
  def other_model(c):
    c["model"].update(dim=256, num_layers=8)
    c["trainer"]["seed"] = 7
    c["data"]["seq_len"] = 512
  edit(LONG, other_model)
  return out


def test_a_table_of_unlike_runs_fits_the_terminal_and_columns_choose(unlike, capsys,
                                                                    monkeypatch):
  code, out, err = axtrain(capsys, unlike)  # not a terminal: every differing key, whole
  assert code == 0 and err == "", err
  header = cells(out.splitlines()[0])
  assert "optimizer.kind" in header and "model.num_layers" in header and "trainer.seed" in header
  assert "optimizer.eps" not in header  # AdamW's own field: the kind column says it
  monkeypatch.setenv("COLUMNS", "80")
  code, out, err = axtrain(capsys, unlike)
  assert code == 0 and max(map(len, out.splitlines())) <= 80, out
  header, *rows = out.splitlines()
  assert "kind" in cells(header), out  # optimizer.kind, by the end of its key
  assert {"status", "steps", "loss", "final"} <= set(cells(header))
  assert any(cells(row)[0].endswith("...") for row in rows)  # the long name, cut
  assert err.startswith("axtrain: note: runs: left out to fit 80 characters: best eval, "
                        "tokens/s, MFU, wall, model.num_layers, "), err
  monkeypatch.delenv("COLUMNS")
  code, out, err = axtrain(capsys, unlike, "--columns=learning_rate,seed")
  assert code == 0 and err == "", err
  assert cells(out.splitlines()[0])[:4] == ["run", "optimizer.learning_rate", "trainer.seed",
                                            "status"]
  code, out, err = axtrain(capsys, unlike, "--columns=sede")
  assert code == 2 and "--columns: 'sede' is no config key of these runs" in err, err


def test_plot_inside_a_run_directory_is_refused(capsys, tmp_path):
  """A plot written into a run would be a file that run did not write, after which the run's
  own command refuses to resume or extend it: refused in one line, nothing written."""
  run = tmp_path / "run"
  shutil.copytree(ROOT / "tests" / "testdata" / "sweep" / "lr=1e-3", run)
  before = sorted(p.name for p in run.iterdir())
  code, out, err = axtrain(capsys, run, f"--plot={run / 'loss.png'}")
  assert code == 2 and out == "" and err == (
      f"axtrain: error: runs: --plot {run / 'loss.png'} is inside the run directory {run}, "
      f"which would then hold files it did not write (and its command would refuse to resume "
      f"or extend it); choose a path outside it\n")
  assert sorted(p.name for p in run.iterdir()) == before


def test_plot_on_a_full_disk_is_one_line_and_keeps_the_old_plot(capsys, tmp_path, monkeypatch):
  """The disk fills as --plot writes (fault injection: the write raises ENOSPC half-way; before,
  matplotlib wrote straight into the file, and a full disk left a 0-byte PNG where the last
  plot was): one line naming the device and the file, exit 74, the plot there before intact
  and no temporary file left."""
  from launcher.errors import EXIT_NO_SPACE  # pylint: disable=import-outside-toplevel
  from tests.conftest import fill_disk_at  # pylint: disable=import-outside-toplevel
  from trainer import disk  # pylint: disable=import-outside-toplevel
  target = tmp_path / "sweep.png"
  target.write_bytes(b"the last plot")
  fill_disk_at(monkeypatch, "/sweep.png.tmp")
  code, _, err = axtrain(capsys, ROOT / "tests" / "testdata" / "sweep", f"--plot={target}")
  assert code == EXIT_NO_SPACE and err.count("\n") == 1, err
  assert err.startswith(f"axtrain: error: no space left on {disk.device_text(tmp_path)} writing "
                        f"{target} (") and " needed, " in err, err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.png"]
  assert target.read_bytes() == b"the last plot"
