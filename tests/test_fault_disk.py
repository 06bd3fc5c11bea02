"""A full disk at any write of a run: one line, exit 74, the last checkpoint intact, and the same
command resumes exactly (fault injection in this process; real small filesystems in the slow
tier). Runs train tests/testdata/ckpt_lm.py as tests/test_fault_tolerance.py does."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess

import pytest

from launcher.errors import EXIT_NO_SPACE
from tests import ckpt_util as cu
from tests.ckpt_util import assert_same_params, checkpoint_folders, ref  # noqa: F401  (ref: a fixture)
from tests.conftest import report_full
from trainer.callbacks import Callback

pytestmark = pytest.mark.share_experiments  # tests/conftest.py


def no_space_line(result) -> str:
  """The one `axtrain: error: no space left ...` line of a run that found its disk full."""
  assert result.returncode == EXIT_NO_SPACE, (result.returncode, result.stderr[-3000:])
  errors = [l for l in result.stderr.splitlines() if l.startswith("axtrain: error:")]
  assert len(errors) == 1, result.stderr[-3000:]
  assert errors[0].startswith("axtrain: error: no space left on "), errors[0]
  for report in ("Traceback", "Exception ignored", "ERROR:absl"):
    assert report not in result.stderr, result.stderr[-3000:]
  return errors[0]


class _At(Callback):
  """Appends `step` to `flag` after step `step` (the fault injections below read it)."""

  def __init__(self, step: int, flag: list):
    self.step, self.flag = step, flag

  def on_step_end(self, step: int, loop) -> None:
    if step == self.step:
      self.flag.append(step)


def test_a_checkpoint_without_room_stops_in_one_line_and_resumes_exactly(tmp_path, ref, cache,
                                                                          capfd, monkeypatch):
  """A full disk at a checkpoint, by fault injection (CI mounts no small filesystem;
  test_full_tmpfs_* do it on a real one): first Orbax's write of checkpoint 20 fails in its
  background thread (ENOSPC from the writer of its `data` item), then, resumed, the room check
  before checkpoint 30 finds the disk full (os.statvfs reports one 4 kB block free after step
  25). Each stops with one line and exit 74, the committed checkpoints intact and no partial
  one left; the same command then ends where the uninterrupted run ends, bit for bit."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  run_dir = tmp_path / "run"
  path_type, real_write_text = type(epath.Path(tmp_path)), type(epath.Path(tmp_path)).write_text

  def write_text(self, *args, **kwargs):
    if self.name == "metadata" and "20.orbax-checkpoint-tmp" in str(self):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
    return real_write_text(self, *args, **kwargs)

  with monkeypatch.context() as patch:
    patch.setattr(path_type, "write_text", write_text)
    error = no_space_line(cu.run_here(capfd, run_dir, cache))
  assert f"writing {run_dir.absolute() / 'checkpoints' / '20'} (1." in error  # MB needed
  assert error.endswith("free space there, then run the same command again: it resumes from "
                        "its checkpoint of step 10"), error
  assert checkpoint_folders(run_dir) == ["10"] and cu.status(run_dir) == "failed"

  full = []
  with monkeypatch.context() as patch:
    report_full(patch, run_dir, when=lambda: bool(full))
    error = no_space_line(cu.run_here(capfd, run_dir, cache, callbacks=[_At(25, full)]))
  assert f"writing {run_dir.absolute() / 'checkpoints' / '30'} (1." in error
  assert " MB needed, 4.1 kB free)" in error and "checkpoint of step 20" in error
  assert checkpoint_folders(run_dir) == ["10", "20"]

  result = cu.run_here(capfd, run_dir, cache)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 20" in result.stderr
  assert cu.losses(run_dir) == cu.losses(ref)
  assert_same_params(ref, run_dir)


def test_a_metrics_record_without_room_is_taken_back(tmp_path, ref, cache, capfd, monkeypatch):
  """The disk fills after step 12, by fault injection: os.write of metrics.jsonl writes half of
  step 12's record, then fails with ENOSPC. One line naming metrics.jsonl, exit 74; the file
  ends with the last whole record (the half is taken back), and the same command resumes from
  checkpoint 10 and ends where the uninterrupted run ends, bit for bit."""
  run_dir, full, real_write = tmp_path / "run", [], os.write

  def write(fd, data):
    if full and os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl"):
      if len(full) == 1:
        full.append("half written")
        return real_write(fd, bytes(data)[:len(data) // 2])
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real_write(fd, data)

  with monkeypatch.context() as patch:
    patch.setattr(os, "write", write)
    error = no_space_line(cu.run_here(capfd, run_dir, cache, callbacks=[_At(12, full)]))
  assert full == [12, "half written"]
  assert f"writing {run_dir.absolute() / 'metrics.jsonl'} (" in error and " bytes needed, " in error
  text = (run_dir / "metrics.jsonl").read_text()
  steps = [r["step"] for r in map(json.loads, text.splitlines()) if "loss" in r]
  assert text.endswith("\n") and steps == list(range(1, 12))
  assert checkpoint_folders(run_dir) == ["10"] and cu.status(run_dir) == "failed"
  result = cu.run_here(capfd, run_dir, cache)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resumed from checkpoint step 10" in result.stderr
  assert cu.losses(run_dir) == cu.losses(ref)
  assert_same_params(ref, run_dir)


@pytest.fixture
def small_disk(tmp_path, request):
  """A tmpfs of `request.param` (2m unless given), which the tests grow or empty to free space;
  skipped where mounts are not allowed (CI without root): the fault-injected tests above cover
  the same paths there."""
  mount_point = tmp_path / "disk"
  mount_point.mkdir()
  if shutil.which("mount") is None:
    pytest.skip("no mount command to make a small filesystem")
  size = getattr(request, "param", "2m")
  made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                        capture_output=True, text=True, check=False)
  if made.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or made.returncode})")
  try:
    yield mount_point
  finally:
    subprocess.run(["umount", str(mount_point)], check=False)


def _grow(mount_point) -> None:
  subprocess.run(["mount", "-o", "remount,size=16m", str(mount_point)], check=True)


@pytest.mark.slow  # three processes on a real small filesystem (make test-slow)
def test_full_tmpfs_at_a_checkpoint(small_disk, ref, cache, capfd):
  """On a 2 MB tmpfs checkpoint 10 (1.2 MB) fits and checkpoint 20 does not. The first run skips
  the room check (as if the disk filled while the checkpoint was written: TensorStore's writes
  fail part-way in Orbax's threads), the second is refused by it; both end in one line, exit
  74, with nothing printed at exit, checkpoint 10 intact and no partial one left. Once the
  filesystem grows, the same command ends where the uninterrupted run ends, bit for bit."""
  run_dir = small_disk / "run"
  result = cu.run(run_dir, cache, hooks=("--no_room_check",))
  error = no_space_line(result)
  assert f"no space left on tmpfs mounted on {small_disk} writing {run_dir / 'checkpoints' / '20'}" \
      in error, error
  assert checkpoint_folders(run_dir) == ["10"] and cu.status(run_dir) == "failed"
  error = no_space_line(cu.run(run_dir, cache))
  assert "MB needed, " in error and "resumes from its checkpoint of step 10" in error
  assert checkpoint_folders(run_dir) == ["10"]
  _grow(small_disk)
  result = cu.run_here(capfd, run_dir, cache)
  assert result.returncode == 0, result.stderr[-3000:]
  assert cu.losses(run_dir) == cu.losses(ref)
  assert_same_params(ref, run_dir)


@pytest.mark.slow  # two runs on a real small filesystem (make test-slow)
@pytest.mark.parametrize("small_disk", ["8m"], indirect=True)  # room for three checkpoints
def test_full_tmpfs_at_a_metrics_write(small_disk, ref, cache, capfd):
  """Another job fills the disk after step 12: the next metrics record (metrics.jsonl or the
  TensorBoard event file, whichever needs a new block first) finds no room: one line, exit 74;
  the files end with whole records. Once the filler is deleted the same command resumes from
  checkpoint 10 and ends where the uninterrupted run ends, bit for bit."""
  run_dir, filler = small_disk / "run", small_disk / "filler"
  result = cu.run(run_dir, cache, hooks=("--fill_disk_after_step=12", f"--filler={filler}"))
  error = no_space_line(result)
  assert (f"writing {run_dir / 'metrics.jsonl'} (" in error
          or f"writing {run_dir / 'tensorboard'}/events.out.tfevents." in error), error
  text = (run_dir / "metrics.jsonl").read_text()
  assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())
  assert checkpoint_folders(run_dir) == ["10"]
  filler.unlink()
  result = cu.run_here(capfd, run_dir, cache)
  assert result.returncode == 0, result.stderr[-3000:]
  assert cu.losses(run_dir) == cu.losses(ref)
  assert_same_params(ref, run_dir)
