"""Exact resume after SIGKILL and SIGTERM, on another mesh, past a corrupt checkpoint, a
non-finite loss and Ctrl-C (a full disk: tests/test_fault_disk.py).

All runs train tests/testdata/ckpt_lm.py (30 steps, checkpoints every 10, every
step logged) and are compared with one uninterrupted run. Runs that are signalled, run on
fake devices, or whose exit must leave no late traceback are subprocesses; the others
run in this process (ckpt_util.run_here), sharing the subprocesses' compile cache.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import time
import warnings

import numpy as np
import pytest

from launcher.preemption import EXIT_PREEMPTED
from tests import ckpt_util as cu
from tests.ckpt_util import assert_same_params, checkpoint_folders, ref  # noqa: F401  (ref: a fixture)
from tests.launch_with_hooks import NanAt, StopAfter
from trainer.callbacks import Callback

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

def test_sigkill_then_sigterm_then_resume_is_exact(tmp_path, ref, cache, capfd):
  run_dir = tmp_path / "run"
  # SIGKILL after step 17: checkpoint 10 is committed, 11-17 are lost.
  proc = cu.start_paused(run_dir, cache, 17)
  # Meanwhile a second axtrain on the same directory (here, in this process) is refused.
  second = cu.run_here(capfd, run_dir, cache)
  assert second.returncode == 2, second.stderr[-2000:]
  assert "in use by another axtrain" in second.stderr
  assert f"pid {proc.pid}" in second.stderr
  rc, _ = cu.signal_and_wait(proc, signal.SIGKILL)
  assert rc == -signal.SIGKILL
  assert (run_dir / ".lock").exists()  # stale: its process is dead
  assert cu.steps(run_dir) == [10]

  # The same command resumes from 10; SIGTERM after step 24 saves step 24 and exits 75.
  proc = cu.start_paused(run_dir, cache, 24)
  rc, err = cu.signal_and_wait(proc, signal.SIGTERM)
  assert rc == EXIT_PREEMPTED, err[-3000:]
  assert "resumed from checkpoint step 10" in err
  assert cu.status(run_dir) == "preempted"
  assert 24 in cu.steps(run_dir)

  # Again (in this process): resumes from 24 and completes.
  result = cu.run_here(capfd, run_dir, cache)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 24" in result.stderr
  assert cu.status(run_dir) == "completed"
  info = json.loads((run_dir / "run.json").read_text())
  assert info["restarts"] == 2

  want, got = cu.losses(ref), cu.losses(run_dir)
  assert sorted(got) == list(range(1, 31))
  assert {s: got[s] for s in range(1, 31)} == want  # bit for bit
  assert_same_params(ref, run_dir)


def test_resume_on_another_mesh(tmp_path, ref, cache, capfd):
  """1 device -> 2 devices (fsdp=2) -> 1 device (data=1), via stop checkpoints at 12 and 23, each
  part with other mesh flags, none of which makes another run (the mesh is placement): the
  1-device runs in this process (a stop requested by a callback), the 2-device one a subprocess
  (SIGTERM)."""
  run_dir = tmp_path / "run"
  result = cu.run_here(capfd, run_dir, cache, callbacks=[StopAfter(12)])
  assert result.returncode == EXIT_PREEMPTED, result.stderr[-3000:]
  assert cu.steps(run_dir) == [10, 12]
  two = ("--config.mesh.data=1", "--config.mesh.fsdp=2")
  proc = cu.start_paused(run_dir, cache, 23, *two, devices=2)
  rc, err = cu.signal_and_wait(proc)
  assert rc == EXIT_PREEMPTED, err[-3000:]
  assert "'fsdp': 2" in err and "resumed from checkpoint step 12" in err
  assert "continues with mesh.data unset -> 1, mesh.fsdp unset -> 2 (where and how" in err
  result = cu.run_here(capfd, run_dir, cache, "--config.mesh.data=1")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 23" in result.stderr
  assert "continues with mesh.fsdp 2 -> unset (where" in result.stderr
  assert json.loads((run_dir / "run.json").read_text())["mesh"]["axes"]["fsdp"] == 1
  want, got = cu.losses(ref), cu.losses(run_dir)
  assert sorted(got) == list(range(1, 31))
  assert {s: got[s] for s in range(1, 13)} == {s: want[s] for s in range(1, 13)}  # one device
  for step in range(13, 31):  # fsdp=2 sums its gradients in another order: rounding apart
    np.testing.assert_allclose(got[step], want[step], rtol=2e-4, err_msg=f"step {step}")
  pa, pb = cu.params(ref, 30), cu.params(run_dir, 30)
  for key in pa:
    np.testing.assert_allclose(pb[key], pa[key], rtol=1e-3, atol=1e-5, err_msg=key)


def _truncate_largest_file(step_dir: pathlib.Path) -> pathlib.Path:
  biggest = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  size = biggest.stat().st_size
  with open(biggest, "r+b") as f:
    f.truncate(size // 2)
  return biggest


def test_corrupt_latest_checkpoint_falls_back(tmp_path, ref, cache, capfd):
  run_dir = tmp_path / "run"
  cu.copy_as_crashed(ref, run_dir, upto=20)
  # A run killed after its step-30 save committed, whose step-30 files were then damaged.
  import shutil  # pylint: disable=import-outside-toplevel
  shutil.copytree(ref / "checkpoints" / "30", run_dir / "checkpoints" / "30")
  _truncate_largest_file(run_dir / "checkpoints" / "30" / "state")
  result = cu.run_here(capfd, run_dir, cache)
  assert result.returncode == 0, result.stderr[-3000:]
  warnings = [l for l in result.stderr.splitlines() if l.startswith("axtrain: warning:")]
  assert len(warnings) == 1, result.stderr[-3000:]
  assert "checkpoints/30 is unreadable (state/" in warnings[0]
  assert "bytes, the manifest needs" in warnings[0]  # found by check_step before any read
  assert "falling back to step 20" in warnings[0] and "<" not in warnings[0]  # no object reprs
  assert "resumed from checkpoint step 20" in result.stderr
  assert "Traceback" not in result.stderr, result.stderr[:3000]  # the head names the channel
  assert (run_dir / "corrupt_checkpoints" / "30").is_dir()  # set aside, not deleted
  got = cu.losses(run_dir)
  assert {s: got[s] for s in range(21, 31)} == {s: cu.losses(ref)[s] for s in range(21, 31)}
  assert_same_params(ref, run_dir)

  # No usable checkpoint at all: say so and exit 1 instead of starting over (a subprocess: what
  # it prints up to its exit is checked).
  broken = tmp_path / "broken"
  cu.copy_as_crashed(ref, broken, upto=20)
  for step in (10, 20):
    for path in (broken / "checkpoints" / str(step) / "state").rglob("*"):
      if path.is_file() and path.parent.name == "d":
        path.unlink()  # deleted array files
  result = cu.run(broken, cache)
  assert result.returncode == 1, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if l.startswith("axtrain: error:")]
  assert len(errors) == 1 and "no usable checkpoint" in errors[0], result.stderr[-3000:]
  assert errors[0].endswith("; pass --overwrite to start the run over"), errors[0]
  warnings = [l for l in result.stderr.splitlines() if l.startswith("axtrain: warning:")]
  assert len(warnings) == 2 and all("is missing); moved it to" in w for w in warnings), warnings
  # Reads abandoned by the failed restores must not print tracebacks (CI saw them garble the error).
  assert "Traceback" not in result.stderr, result.stderr[:3000]  # the head names the channel
  assert cu.status(broken) == "failed"
  assert cu.losses(broken) == {s: cu.losses(ref)[s] for s in range(1, 21)}  # nothing trained


HOST = "--config.trainer.state_memory=host"  # a state in host memory: read beside the compile


def test_a_host_memory_resume_reads_its_checkpoint_beside_the_compile(tmp_path, ref, cache, capfd):
  """trainer/early_restore.py: the checkpoint is read while the steps compile, the loop takes
  that read, and the run goes on bit for bit."""
  run_dir = tmp_path / "run"
  cu.copy_as_crashed(ref, run_dir, upto=20)
  shown, filters = warnings.showwarning, list(warnings.filters)
  result = cu.run_here(capfd, run_dir, cache, HOST)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 20" in result.stderr
  # The read in its thread left Python's warnings as the compile beside it found them.
  assert warnings.showwarning is shown and warnings.filters == filters
  startup = json.loads((run_dir / "run.json").read_text())["startup"]
  # The read started before the steps were compiled (it is started before the compile is), and
  # the loop took it rather than reading the checkpoint again.
  assert startup["restore_started_s"] <= startup["to_steps_compiled_s"], startup
  assert startup["restore_read_s"] > 0 and "restore_after_compile" not in startup, startup
  assert 0 <= startup["restore_placing_s"] <= startup["restore_read_s"], startup
  got = cu.losses(run_dir)
  assert {s: got[s] for s in range(21, 31)} == {s: cu.losses(ref)[s] for s in range(21, 31)}
  assert_same_params(ref, run_dir)


def test_a_damaged_newest_checkpoint_read_beside_the_compile_falls_back_once(
    tmp_path, ref, cache, capfd):
  """The early read of a damaged checkpoint is dropped without a word; the loop's own restore
  warns once, sets it aside and falls back, as without the early read."""
  run_dir = tmp_path / "run"
  cu.copy_as_crashed(ref, run_dir, upto=20)
  shutil.copytree(ref / "checkpoints" / "30", run_dir / "checkpoints" / "30")
  _truncate_largest_file(run_dir / "checkpoints" / "30" / "state")
  result = cu.run_here(capfd, run_dir, cache, HOST)
  assert result.returncode == 0, result.stderr[-3000:]
  warnings = [l for l in result.stderr.splitlines() if l.startswith("axtrain: warning:")]
  assert len(warnings) == 1 and "falling back to step 20" in warnings[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[:3000]
  startup = json.loads((run_dir / "run.json").read_text())["startup"]
  assert "restore_read_s" not in startup and "restore_started_s" not in startup, startup
  assert startup["restore_after_compile"] == "the early read failed", startup
  got = cu.losses(run_dir)
  assert {s: got[s] for s in range(21, 31)} == {s: cu.losses(ref)[s] for s in range(21, 31)}


def test_a_killed_runs_leftovers_are_set_aside_not_written_over(tmp_path, ref, cache, capfd):
  """What a killed run (or a user) can leave, resumed: metrics.jsonl ending in a cut-off line
  (`{"step": 11, "lo`, no newline), an empty folder named like step 20 and a file where
  checkpoint 30 goes. Each is set aside with a warning, never written over: the line to
  metrics.jsonl.cut, the folder and the file to corrupt_checkpoints/. The run resumes from 10,
  each record on a line of its own, and `axtrain runs` reads it as completed at 30."""
  run_dir = tmp_path / "run"
  cu.copy_as_crashed(ref, run_dir, upto=10)
  with open(run_dir / "metrics.jsonl", "a") as f:
    f.write('{"step": 11, "lo')
  (run_dir / "checkpoints" / "20").mkdir()
  (run_dir / "checkpoints" / "30").write_text("x\n")
  result = cu.run_here(capfd, run_dir, cache)
  assert result.returncode == 0, result.stderr[-3000:]
  warnings = [l for l in result.stderr.splitlines() if l.startswith("axtrain: warning:")]
  assert len(warnings) == 3, result.stderr[-3000:]
  assert ("metrics.jsonl ended in a line cut off by a run that stopped while writing it "
          '(16 bytes: {"step": 11, "lo); moved it to ') in warnings[0]
  assert "checkpoints/30 is unreadable (a file, not a checkpoint folder); moved it to " \
      f"{run_dir.absolute() / 'corrupt_checkpoints' / '30'}" in warnings[1], warnings[1]
  assert "checkpoints/20 is unreadable (" in warnings[2] and "falling back to step 10" in warnings[2]
  assert "resumed from checkpoint step 10" in result.stderr
  assert (run_dir / "metrics.jsonl.cut").read_text() == '{"step": 11, "lo\n'
  assert (run_dir / "corrupt_checkpoints" / "30").read_text() == "x\n"
  assert (run_dir / "corrupt_checkpoints" / "20").is_dir()
  assert cu.steps(run_dir) == [10, 20, 30]
  records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert {r["step"]: r["loss"] for r in records if "loss" in r} == cu.losses(ref)
  listed = json.loads((run_dir / "manifest.json").read_text())["files"]
  assert {"metrics.jsonl.cut", "corrupt_checkpoints/30"} <= set(listed)
  from launcher import runs  # pylint: disable=import-outside-toplevel
  capfd.readouterr()
  (run,), _ = runs.collect([str(run_dir)])
  assert (run.status, run.steps, run.max_steps) == ("completed", 30, 30)
  assert capfd.readouterr().err == ""  # no line skipped


def test_readers_of_a_run_fall_back_past_a_damaged_newest_checkpoint(tmp_path, ref, cache, capfd):
  """convert --to_hf, generate and eval read the newest checkpoint that reads, with a warning
  naming the damaged one, which they leave in place (only training moves checkpoints); an
  explicit --step of the damaged one is refused, naming the steps that read."""
  from launcher import main as main_lib  # pylint: disable=import-outside-toplevel
  run_dir = tmp_path / "run"
  shutil.copytree(ref, run_dir)
  _truncate_largest_file(run_dir / "checkpoints" / "30" / "state")
  commands = {"convert": ["convert", f"--to_hf={run_dir}", f"--output_dir={tmp_path / 'hf'}"],
              "generate": ["generate", f"--run_dir={run_dir}", "--prompt=def", "--max_new_tokens=2"],
              "eval": ["eval", f"--run_dir={run_dir}"]}
  for name, args in commands.items():
    capfd.readouterr()
    with cu.compile_cache(cache):
      code = main_lib.main(["axtrain", *args])
    out, err = capfd.readouterr()
    assert code == 0, (name, err[-3000:])
    [warning] = [l for l in err.splitlines() if l.startswith("axtrain: warning:")]
    assert warning.startswith(f"axtrain: warning: checkpoint {run_dir / 'checkpoints' / '30'} is "
                              f"unreadable (state/"), (name, warning)
    assert warning.endswith("; using step 20, the newest that reads (--step=N chooses another)")
  assert out.startswith("step 20: eval_loss") and cu.steps(run_dir) == [10, 20, 30]
  for args in (commands["convert"][:2] + [f"--output_dir={tmp_path / 'hf2'}"],
               commands["eval"]):
    with cu.compile_cache(cache):
      code = main_lib.main(["axtrain", *args, "--step=30"])
    [error] = capfd.readouterr().err.splitlines()
    assert code != 0 and error.endswith("; the steps that read: 10, 20 (--step=20)"), error
  assert not (tmp_path / "hf2").exists()


def test_restore_step_that_does_not_exist_is_refused(tmp_path, ref, cache, capfd):
  run_dir = tmp_path / "run"
  cu.copy_as_crashed(ref, run_dir, upto=20)
  before = cu.snapshot(run_dir)
  error = cu.one_error_line(cu.run_here(capfd, run_dir, cache,
                                        "--config.checkpoint.restore_step=7"))
  assert "checkpoint.restore_step=7" in error and "(committed steps: 10, 20)" in error
  assert cu.snapshot(run_dir) == before  # nothing written or changed
  fresh = tmp_path / "fresh"
  error = cu.one_error_line(cu.run_here(capfd, fresh, cache, "--config.checkpoint.restore_step=7"))
  assert "(committed steps: none)" in error and not fresh.exists()


def test_restore_step_on_a_completed_run_trains_again_from_it(tmp_path, ref, cache, capfd):
  """An explicit restore_step before the end rewinds a completed run: the newer checkpoints are
  set aside and steps 21-30 are trained again, equal to the first time bit for bit."""
  run_dir = tmp_path / "run"
  shutil.copytree(ref, run_dir)
  result = cu.run_here(capfd, run_dir, cache, "--config.checkpoint.restore_step=20")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "already completed" not in result.stderr
  assert "resuming from step 20; newer checkpoints [30] moved to" in result.stderr
  assert (run_dir / "superseded_checkpoints" / "30").is_dir() and cu.steps(run_dir) == [10, 20, 30]
  assert cu.status(run_dir) == "completed"
  records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "loss" in r] == [*range(1, 31), *range(21, 31)]
  assert cu.losses(run_dir) == cu.losses(ref)
  # restore_step at the end trains nothing: the run is complete there.
  result = cu.run_here(capfd, run_dir, cache, "--config.checkpoint.restore_step=30")
  assert result.returncode == 0 and "already completed; nothing to do" in result.stderr


def test_init_from_run_of_another_shape_is_refused(tmp_path, ref, cache, capfd):
  run_dir = tmp_path / "run"
  before = cu.snapshot(ref)
  error = cu.one_error_line(cu.run_here(capfd, run_dir, cache, f"--config.init.from_run={ref}",
                                        "--config.model.num_layers=3"))
  assert f"init.from_run={ref}: parameter params.layers." in error
  assert "has shape (2, " in error and "but (3, " in error and "in this model" in error
  assert not run_dir.exists() and cu.snapshot(ref) == before
  # Stacked layers (model.scan_layers) in the model but not in the checkpoint: says what to set.
  error = cu.one_error_line(cu.run_here(capfd, run_dir, cache, f"--config.init.from_run={ref}",
                                        "--config.model.scan_layers=false"))
  assert error.endswith("set --config.model.scan_layers=true to read it"), error
  assert not run_dir.exists() and cu.snapshot(ref) == before


def test_nonfinite_loss_stops_with_one_line_error(tmp_path, cache, capfd):
  run_dir = tmp_path / "run"
  result = cu.run_here(capfd, run_dir, cache, callbacks=[NanAt(13)])
  assert result.returncode == 1, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if l.startswith("axtrain: error:")]
  assert len(errors) == 1, result.stderr[-3000:]
  assert "non-finite loss or gradient at step 13" in errors[0]
  assert f"last good checkpoint: step 10 in {run_dir.absolute() / 'checkpoints'}" in errors[0]
  assert "Traceback" not in result.stderr
  assert cu.status(run_dir) == "failed"
  assert cu.steps(run_dir) == [10]  # nothing non-finite was saved
  assert max(cu.losses(run_dir)) == 13


def test_nonfinite_skip_counts_and_continues(tmp_path, ref, cache, capfd):
  """Also starts from the reference run's parameters (init.from_run)."""
  run_dir = tmp_path / "run"
  result = cu.run_here(capfd, run_dir, cache, "--config.trainer.skip_nonfinite=True",
                       f"--config.init.from_run={ref}", callbacks=[NanAt(4)])
  assert result.returncode == 0, result.stderr[-3000:]
  assert cu.status(run_dir) == "completed"
  # Said once, when the step is counted (at its log: log_every 1).
  warnings = [l for l in result.stderr.splitlines() if l.startswith("axtrain: warning:")]
  assert warnings == ["axtrain: warning: skipped step 4 with a non-finite loss or gradient, "
                      "parameters unchanged; 1 of 4 steps skipped so far (lower "
                      "optimizer.learning_rate if this goes on)"], result.stderr[-3000:]
  records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  skipped = {r["step"]: r["nonfinite_skipped"] for r in records if "loss" in r}
  assert skipped == {s: int(s >= 4) for s in range(1, 31)}
  losses = cu.losses(run_dir)
  assert losses[4] is None  # metrics.jsonl writes NaN as null
  assert all(np.isfinite(losses[s]) for s in range(5, 31))
  # Step 1 already uses the trained parameters: its loss is the reference's late loss range.
  assert losses[1] < cu.losses(ref)[1] - 1.0


class _SignalAt(Callback):
  """Sends this process SIGINT after step `step` and waits until the loop sees the request;
  records after every step how many earlier steps the devices had not finished."""

  def __init__(self, step: int):
    self.step, self.behind = step, []

  def on_step_end(self, step: int, loop) -> None:
    self.behind.append(sum(1 for s, flag in loop.unchecked if s < step and not flag.is_ready()))
    if step == self.step:
      os.kill(os.getpid(), signal.SIGINT)
      deadline = time.monotonic() + 60
      while not loop.stop_requested() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_sigint_stops_after_the_step_in_flight(tmp_path, cache, capfd):
  """The host runs at most one step ahead of the devices, so the step a SIGINT's checkpoint holds
  is the one the devices were running, not one the host dispatched dozens of steps ahead (the
  next logging step: here none before the end)."""
  hook = _SignalAt(6)
  result = cu.run_here(capfd, tmp_path / "run", cache, "--config.trainer.log_every=100",
                       callbacks=[hook])
  assert result.returncode == EXIT_PREEMPTED, result.stderr[-3000:]
  assert "SIGINT: finishing the current step and saving a checkpoint" in result.stderr
  assert json.loads((tmp_path / "run" / "run.json").read_text())["last_step"] == 6
  assert cu.steps(tmp_path / "run") == [6]
  assert hook.behind == [0] * 6, hook.behind  # every step before the one just dispatched is done


def test_a_second_ctrl_c_names_the_checkpoint_the_run_resumes_from(tmp_path, cache):
  """Two Ctrl-Cs 20 ms apart, paused after step 12: the save of 12 is abandoned (its temporary
  folder, if it began, is not a checkpoint) and the exit line names the newest committed step,
  which is what the next run resumes from; no line claims a checkpoint that never committed."""
  run_dir = tmp_path / "run"
  proc = cu.start_paused(run_dir, cache, 12)
  proc.send_signal(signal.SIGINT)
  time.sleep(0.02)  # two deliveries (the kernel merges a signal sent while one is pending)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=600)
  assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
  assert "saved a checkpoint" not in err, err[-3000:]
  [line] = [l for l in err.splitlines() if "second SIGINT" in l]
  committed = cu.steps(run_dir)  # step 10's save may not have committed yet either
  assert line == "axtrain: second SIGINT: exiting now; " + (
      f"a checkpoint still being written is abandoned; the run resumes from its newest "
      f"committed one, step {committed[-1]}" if committed else
      "no checkpoint was committed yet: the run starts over"), err[-3000:]
  assert cu.status(run_dir) == "preempted"


@pytest.mark.slow  # four interrupted runs and their resumes (make test-slow)
@pytest.mark.parametrize("moment,pause,at,code,saved", [
    ("the first step", 1, "pause_after_step", EXIT_PREEMPTED, [1]),
    ("a checkpoint write", 10, "pause_after_step", EXIT_PREEMPTED, [10]),
    ("an evaluation", 15, "pause_at_eval", EXIT_PREEMPTED, [10, 16]),
    ("the last step", 30, "pause_after_step", 0, [10, 20, 30]),
])
def test_ctrl_c_in_the_loop(tmp_path, ref, cache, capfd, moment, pause, at, code, saved):
  """Ctrl-C at `moment`: the step in flight finishes and is saved, exit 75 (after the last step
  the run simply completes, exit 0); nothing is half-written, so the same command then ends
  where the uninterrupted run ends, bit for bit. (Before the loop: tests/test_preemption.py.)"""
  del moment
  run_dir, extra = tmp_path / "run", ("--config.eval.every_steps=15",)
  proc = cu.start_paused(run_dir, cache, pause, *extra, at=at)
  rc, err = cu.signal_and_wait(proc, signal.SIGINT)
  assert rc == code, err[-3000:]
  assert "SIGINT: finishing the current step and saving a checkpoint" in err
  assert "Traceback" not in err, err[-3000:]
  assert cu.steps(run_dir) == saved and checkpoint_folders(run_dir) == [str(s) for s in saved]
  result = cu.run_here(capfd, run_dir, cache, *extra)
  assert result.returncode == 0, result.stderr[-3000:]
  assert cu.status(run_dir) == "completed"
  assert cu.losses(run_dir) == cu.losses(ref)
  assert_same_params(ref, run_dir)
