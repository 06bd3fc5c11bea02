"""Run directories that hold more than a trained run: one converted from Hugging Face, one with
`axtrain launch`'s folder, one whose first start a full disk cut short (split from
tests/test_run_dirs.py)."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

import configs.base  # noqa: F401  (every registry, as in a run: its config is diffed by them)
from launcher import run_dir
from trainer import run_files


def _orbax_step(path: pathlib.Path, text: str) -> None:
  """A stand-in of an Orbax step folder: its metadata file and a state."""
  path.mkdir(parents=True)
  (path / "_CHECKPOINT_METADATA").write_text(json.dumps({"item_handlers": {}}))
  (path / "state").write_text(text)


def test_overwrite_of_a_converted_directory_keeps_what_convert_wrote(tmp_path):
  out = tmp_path / "converted"
  _orbax_step(out / "checkpoints" / "0", "weights")
  _orbax_step(out / "checkpoints" / "5", "trained")
  (out / "superseded_checkpoints").mkdir()
  for name, text in (("config.py", "py"), ("hf_config.json", "{}"), ("metrics.jsonl", "{}\n")):
    (out / name).write_text(text)
  config = {"trainer": {"max_steps": 10}, "checkpoint": {"restore_step": 0}}
  (out / "config.json").write_text(json.dumps(config))
  info = {"status": "converted", "converted_from": "/hf", "hf_dtype": "BF16",
          "command": "axtrain convert --from_hf=/hf", "versions": {}}
  (out / "run.json").write_text(json.dumps(info))
  run_files.Manifest(out).add(*(out / n for n in ("config.json", "run.json", "config.py",
                                                 "hf_config.json", "metrics.jsonl")))
  rd = run_dir.RunDir(out)
  # restore_step chooses where to resume; it does not make another run.
  assert rd.prepare({**config, "checkpoint": {"restore_step": 3}}, overwrite=False) == "incomplete"
  # Never trained: its first run may set anything but the model.
  assert rd.prepare({**config, "trainer": {"max_steps": 2}}, overwrite=False) == "incomplete"
  with pytest.raises(run_dir.UserError, match="converted from Hugging Face; this config changes "
                                               "its model.dim"):
    rd.prepare({**config, "model": {"dim": 8}}, overwrite=True)
  (out / "run.json").write_text(json.dumps({**info, "status": "completed"}))
  with pytest.raises(run_dir.UserError, match="trainer.max_steps 2 is below the run's 10"):
    rd.prepare({**config, "trainer": {"max_steps": 2}}, overwrite=False)
  assert rd.prepare({**config, "trainer": {"max_steps": 2}}, overwrite=True) == "overwrite"
  rd.start({**config, "trainer": {"max_steps": 2}}, argv=["axtrain"], fresh=True, extra={})
  assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.json", "config.py",
                                                   "hf_config.json", "manifest.json", "run.json"]
  assert [p.name for p in (out / "checkpoints").iterdir()] == ["0"]
  assert (out / "checkpoints" / "0" / "state").read_text() == "weights"
  assert (out / "config.py").read_text() == "py"
  info = json.loads((out / "run.json").read_text())
  assert info["converted_from"] == "/hf" and info["hf_dtype"] == "BF16"
  assert info["status"] == "running"
  # Once checkpoint.keep has rotated the converted weights out, --overwrite would lose them.
  shutil.rmtree(out / "checkpoints" / "0")
  with pytest.raises(run_dir.UserError, match="rotated out"):
    rd.prepare(config, overwrite=True)


def test_the_launch_folder_is_kept_like_the_lock(tmp_path):
  """What `axtrain launch` writes before the run (launch/) is the run's and outlives --overwrite."""
  out = tmp_path / "run"
  (out / "launch").mkdir(parents=True)
  (out / "launch" / "job.sh").write_text("#!/bin/sh\n")
  config = {"trainer": {"max_steps": 1}}
  rd = run_dir.RunDir(out)
  assert rd.prepare(config, overwrite=False) == "new"
  rd.start(config, argv=["axtrain"], fresh=True, extra={})
  assert rd.prepare({"trainer": {"max_steps": 2}}, overwrite=True) == "overwrite"
  rd.start({"trainer": {"max_steps": 2}}, argv=["axtrain"], fresh=True, extra={})
  assert (out / "launch" / "job.sh").read_text() == "#!/bin/sh\n"


def test_a_first_start_cut_short_by_a_full_disk_is_started_again(tmp_path, monkeypatch):
  """The disk fills as a new run writes config.json (fault injection: its write raises ENOSPC
  after half the bytes): NoSpace names the file, nothing half-written is left (no temporary
  file; manifest.json already lists the files), and the same command then starts the run as a
  new one rather than refusing a directory without config.json."""
  from tests.conftest import fill_disk_at  # pylint: disable=import-outside-toplevel
  from trainer import disk  # pylint: disable=import-outside-toplevel
  out, config = tmp_path / "run", {"trainer": {"max_steps": 1}}
  rd = run_dir.RunDir(out)
  assert rd.prepare(config, overwrite=False) == "new"
  fill_disk_at(monkeypatch, "/config.json.tmp")
  with pytest.raises(disk.NoSpace, match=f"writing {out / 'config.json'} \\("):
    rd.start(config, argv=["axtrain"], fresh=True, extra={})
  monkeypatch.undo()
  assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
  assert rd.prepare(config, overwrite=False) == "new"
  rd.start(config, argv=["axtrain"], fresh=True, extra={})
  assert json.loads((out / "config.json").read_text()) == config
  assert sorted(p.name for p in out.iterdir()) == ["config.json", "manifest.json", "run.json"]
