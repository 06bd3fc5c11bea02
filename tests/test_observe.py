"""What a run shows: metrics one step late, TensorBoard events, MFU, profiles, the console."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import re
import time
import types

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from configs.base import lm_config
from launcher import main as launcher_main
from modules import llama
from tests.conftest import ROOT
from trainer import config as config_lib, experiment, loop, metrics, meshes, writers
from trainer.callbacks import Callback
from trainer.progress import Progress

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

SEQ, BATCH = 32, 8
STEP_KEYS = ("loss", "aux_loss", "grad_norm", "param_norm", "update_norm", "learning_rate")


def _experiment(max_steps: int, *, eval_every: int = 0, **trainer) -> experiment.Experiment:
  cfg = lm_config(llama.model_node("test"), max_steps=max_steps, learning_rate=1e-3,
                  batch_size=BATCH, seq_len=SEQ, warmup_steps=2, data_kind="synthetic")
  cfg.eval.batch_size, cfg.eval.num_batches, cfg.eval.every_steps = 8, 1, eval_every
  cfg.trainer.peak_flops = 1e12  # no CPU benchmark in tests
  for key, value in trainer.items():
    cfg.trainer[key] = value
  return experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
  """7 steps, a record every 2 steps and an evaluation at step 4, into a run directory."""
  run_dir = tmp_path_factory.mktemp("run")
  exp = _experiment(7, eval_every=4, log_every=2)
  console = io.StringIO()
  result = loop.train(exp, run_dir=run_dir, progress=Progress(7, stream=console))
  return exp, run_dir, result, console.getvalue()


def test_one_step_late_logging_changes_no_value(logged_run):
  """Records equal those of a plain loop that fetches every step's metrics at once."""
  exp, _, result, _ = logged_run
  data = exp.source.train_iterator(process_index=0, process_count=1)
  state, want = exp.init(), {}
  with exp.context():
    for step in range(1, 8):
      state, m = exp.step_fn(state, exp.global_batch(next(data)))
      want[step] = {k: float(v) for k, v in jax.device_get(m).items()}
  assert [(r["step"], "loss" in r) for r in result.records] == [
      (2, True), (4, True), (4, False), (6, True), (7, True), (7, False)]
  for r in result.records:
    if "loss" in r:
      assert {k: r[k] for k in STEP_KEYS} == {k: want[r["step"]][k] for k in STEP_KEYS}, r["step"]
  params = jax.tree.leaves(jax.device_get(state.params))
  for a, b in zip(params, jax.tree.leaves(jax.device_get(result.state.params))):
    np.testing.assert_array_equal(a, b)


def test_event_files_hold_the_same_scalars_as_metrics_jsonl(logged_run):
  _, run_dir, result, _ = logged_run
  lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert lines == result.records
  events = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"))
  events.Reload()
  tags = set(events.Tags()["scalars"])
  want: dict[str, dict[int, float]] = {}
  for record in lines:
    for key, value in record.items():
      if key != "step":
        want.setdefault(key, {})[record["step"]] = value
  assert tags == set(want), tags ^ set(want)
  for tag in tags:
    got = {e.step: e.value for e in events.Scalars(tag)}
    assert got == {s: float(np.float32(v)) for s, v in want[tag].items()}, tag


def test_mfu_is_analytic_flops_over_step_time_over_peak(logged_run):
  exp, _, result, _ = logged_run
  s = llama.size("test")
  head_dim = s.dim // s.num_heads
  attention = s.dim * head_dim * (2 * s.num_heads + 2 * s.num_kv_heads)  # q, o; k, v
  matmul_params = s.num_layers * (attention + 3 * s.dim * s.hidden_dim) + s.dim * s.vocab_size
  per_token = 6 * matmul_params + 12 * s.num_layers * s.num_heads * head_dim * SEQ
  for r in (r for r in result.records if "loss" in r):
    flops_per_sec = per_token * BATCH * SEQ / r["step_time_s"] / exp.mesh.size
    assert r["model_flops_per_sec_per_device"] == pytest.approx(flops_per_sec, rel=1e-9)
    assert r["mfu"] == pytest.approx(flops_per_sec / 1e12, rel=1e-9)


def test_console_and_run_facts(logged_run):
  _, run_dir, result, console = logged_run
  assert "\r" not in console  # not a terminal: plain lines
  lines = console.splitlines()
  assert lines[0].startswith("mesh {'data': 1") and "parameters" in lines[0]
  assert "MiB per device" in lines[0]
  assert lines[1] == f"run directory {run_dir}; view with: tensorboard --logdir {run_dir}"
  assert any(l.startswith("step 6/7 |") and "ETA" in l for l in lines)
  assert result.compiled["flops"] > 0 and result.compiled["total_bytes"] > 0


def test_profile_captures_a_trace(tmp_path):
  exp = _experiment(4, profile_steps=(2, 3), log_every=2)
  result = loop.train(exp, run_dir=tmp_path)
  traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0, list(tmp_path.rglob("*"))
  assert (traces[0].parent / "perfetto_trace.json.gz").stat().st_size > 0
  assert result.profiles == [{"steps": [2, 3], "dir": str(tmp_path / "profile")}]


@pytest.mark.parametrize("override, message", [
    ("--config.trainer.profile_steps=(5, 2)", "trainer.profile_steps=(5, 2)"),
    ("--config.trainer.profile_steps=(1, 400)", "<= trainer.max_steps (300)"),
    pytest.param("--config.trainer.wandb_project=sweep", "pip install wandb",
                 marks=pytest.mark.skipif(importlib.util.find_spec("wandb") is not None,
                                          reason="wandb is installed")),
])
def test_bad_observe_settings_are_one_line_exit_2(tmp_path, capsys, override, message):
  out = tmp_path / "run"
  rc = launcher_main.main(["axtrain", f"--config={ROOT / 'configs' / 'tiny.py'}", override,
                           f"--output_dir={out}"])
  err = capsys.readouterr().err
  assert rc == 2 and err.startswith("axtrain: error: ") and err.count("\n") == 1, err
  assert message in err
  assert not out.exists()


def test_cpu_peak_is_measured_once_and_cached(tmp_path):
  first = metrics.cpu_peak_flops(tmp_path)
  assert first > 0
  cached = json.loads((tmp_path / "peak_flops.json").read_text())
  (key,) = cached
  (tmp_path / "peak_flops.json").write_text(json.dumps({key: 123.0}))
  assert metrics.cpu_peak_flops(tmp_path) == 123.0  # read, not measured again


def test_an_injected_nan_stops_the_loop_at_its_step():
  """Callbacks reach the batch before dispatch; the error names the bad step, logged one late."""
  from tests.launch_with_hooks import NanAt  # pylint: disable=import-outside-toplevel
  exp = _experiment(6, log_every=1)
  seen = []

  class Records(Callback):
    def on_record(self, record):
      seen.append(record)

  with pytest.raises(loop.NonFiniteError, match="at step 3; last good checkpoint: none") as e:
    loop.train(exp, callbacks=[NanAt(3), Records()])
  assert e.value.step == 3
  assert [r["step"] for r in seen] == [1, 2, 3] and np.isnan(seen[-1]["loss"])
  # The usual cause first: a learning rate too high; skipping only for rare bad steps.
  message = str(e.value)
  assert message.index("lower optimizer.learning_rate (now 0.001)") < message.index(
      "trainer.skip_nonfinite=True skips them"), message


def test_docs_observe_names_real_files_and_symbols():
  text = (ROOT / "docs" / "observe.md").read_text()
  named = re.findall(r"((?:trainer|launcher|tests)/[\w/]+\.py)(?::(\w+))?", text)
  assert len(named) >= 5, named
  for path, symbol in named:
    source = (ROOT / path).read_text()
    defined = rf"^((def|class) {symbol}\b|{symbol}\b[^=\n(]*=)"  # a function, class or constant
    assert not symbol or re.search(defined, source, re.M), (path, symbol)
  for hook in ("on_train_start", "on_batch", "on_record", "on_step_end", "on_train_end"):
    assert hook in text and f"def {hook}(" in (ROOT / "trainer" / "callbacks.py").read_text()


def test_a_resumed_run_shows_each_step_once_in_tensorboard(tmp_path, monkeypatch):
  """A crash after step 5 (checkpoint at 3, records up to 4); the resumed run redoes 4.

  Event files are named by the second: both runs get the same second here, as a quick resume
  can, and the first run's events must survive it."""
  monkeypatch.setattr(writers, "time",
                      types.SimpleNamespace(time=lambda: 1.7e9, sleep=time.sleep))
  exp = _experiment(6, log_every=1)
  exp = experiment.build(dataclasses.replace(exp.run, checkpoint=dataclasses.replace(
      exp.run.checkpoint, every_steps=3)), meshes.lookup("cpu"))

  class Crash(Callback):
    def on_step_end(self, step, loop_state):
      if step == 5:
        raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    loop.train(exp, run_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints", callbacks=[Crash()])
  result = loop.train(exp, run_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")
  assert result.start_step == 3
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  logged = [r["step"] for r in records if "loss" in r]
  assert logged == [1, 2, 3, 4, 4, 5, 6]
  events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
  events.Reload()
  assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5, 6]


def test_a_record_always_starts_a_line_of_its_own(tmp_path):
  """metrics.jsonl as a killed run leaves it: a last record that only lacks its newline gets
  one (kept, nothing set aside); a line cut off mid-record is moved to metrics.jsonl.cut with
  a warning (a longer one shown by its start), and the next record starts a line of its own."""
  path, said, made = tmp_path / "metrics.jsonl", [], []
  path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}')
  writer = writers.JsonlWriter(path, warn=said.append, record=made.append)
  writer.on_record({"step": 3, "loss": 2.0})
  writer.on_train_end(None)
  assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [1, 2, 3]
  assert said == [] and made == [path] and not (tmp_path / "metrics.jsonl.cut").exists()
  cut = '{"step": 4, "loss": 1.9, "grad_norm": 0.123456789, "lea'
  path.write_text(path.read_text() + cut)
  writer = writers.JsonlWriter(path, warn=said.append, record=made.append)
  writer.on_record({"step": 4, "loss": 1.9})
  writer.on_train_end(None)
  assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [1, 2, 3, 4]
  assert (tmp_path / "metrics.jsonl.cut").read_text() == cut + "\n"
  assert made[-1] == tmp_path / "metrics.jsonl.cut"
  assert said == [f"{path} ended in a line cut off by a run that stopped while writing it "
                  f"({len(cut)} bytes: {cut[:40]}...); moved it to {path}.cut, and new records "
                  f"start on a line of their own"]


def test_the_device_peak_counts_a_tpu_steps_reserved_scratch():
  """XLA:TPU keeps a running program's temporaries in reserved scratch, outside the buffers'
  counters: the peak adds both (the counters as one v5e chip reported them for llm_1b at 8 rows);
  a GPU's allocator, which reports no reserved scratch, is read as it is."""
  from trainer import metrics  # pylint: disable=import-outside-toplevel
  tpu = {"bytes_in_use": 95744, "peak_bytes_in_use": 6055544832, "bytes_reserved": 0,
         "peak_bytes_reserved": 5971755008, "bytes_limit": 16909336064}
  assert metrics.device_peak(tpu) == 6055544832 + 5971755008
  assert metrics.device_peak({"bytes_in_use": 1, "peak_bytes_in_use": 7}) == 7
  assert metrics.device_peak({"bytes_in_use": 1}) is None


def test_python_warnings_during_a_compile_are_not_counted_as_xlas_lines():
  """A warning of Python's own (numpy's, while a step is traced) is shown on stderr as ever,
  not kept among XLA's C++ lines (a run's compiler.log and its "XLA logged N lines"). In a
  process of its own: pytest records every warning of its tests instead of printing it."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  script = ("import os, warnings\n"
            "from planner import compiler_output\n"
            "notes, rest = [], []\n"
            "with compiler_output.compiler_log(notes, rest=rest):\n"
            "  os.write(2, b'W0000 some_pass.cc:1] an XLA line\\n')\n"
            "  warnings.warn('overflow encountered in cast', RuntimeWarning)\n"
            "print(rest, notes)\n")
  done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                        check=True)
  assert done.stdout == "['W0000 some_pass.cc:1] an XLA line'] []\n"
  assert "RuntimeWarning: overflow encountered in cast" in done.stderr


def test_xlas_own_log_of_the_compile_goes_to_the_runs_compiler_log(tmp_path):
  """XLA logs from C++ to the process's stderr; during the steps' compile (init, train, eval)
  that goes to <run_dir>/compiler.log, with one axtrain note on the console. XLA's per-compile
  lines (TF_CPP_VMODULE, in the test's environment only) show it; the compile cache is off so
  that the steps really compile."""
  from tests.conftest import cli  # pylint: disable=import-outside-toplevel
  run = tmp_path / "run"
  result = cli(f"--config={ROOT / 'tests' / 'testdata' / 'ckpt_lm.py'}",
               "--config.trainer.max_steps=1", f"--output_dir={run}", "--noprogress",
               env={"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "cpu_compiler=1",
                    "JAX_ENABLE_COMPILATION_CACHE": "false"})
  assert result.returncode == 0, result.stderr[-3000:]
  log = (run / "compiler.log").read_text()
  for program in ("jit_train_step", "jit_eval_step"):
    assert f"Compiling: {program}" in log and program not in result.stderr, result.stderr[-3000:]
  [note] = [line for line in result.stderr.splitlines() if "while compiling the steps" in line]
  assert note.startswith("axtrain: note: XLA logged ") and note.endswith(str(run / "compiler.log"))
  assert "compiler.log" in json.loads((run / "manifest.json").read_text())["files"]
