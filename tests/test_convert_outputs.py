"""`axtrain convert`'s command line and what it writes: bad arguments, the converted run's
config, a full disk, a stop, a killed convert's staging folder, the umask, and output folders it
cannot or must not write (split from tests/test_convert.py, whose GPT-2 directory it uses)."""

import pathlib

import numpy as np
import pytest

from launcher import main as main_lib
from tests.test_convert import D, V, _convert, _gpt2_tensors, _write_hf

pytestmark = pytest.mark.share_experiments  # tests/conftest.py


@pytest.fixture(scope="module")
def tensors():
  return _gpt2_tensors(np.random.default_rng(0))


def test_bad_arguments(capsys):
  code, err = _convert(capsys, "--from_hf=x")
  assert code == 2 and "give exactly one of --from_hf / --to_hf, and --output_dir" in err
  code, err = _convert(capsys, "--form_hf=x", "--output_dir=y")
  assert code == 2 and "did you mean 'from_hf'" in err


def test_cli_resumes_from_run_dir_and_refuses_bad_configs(tmp_path, capsys, tensors):
  """The converted run's config.py, and two incompatible compositions (in this process)."""
  hf = _write_hf(tmp_path / "hf", tensors)
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  code = main_lib.main(["axtrain", f"--config={run}/config.py", f"--output_dir={run}",
                        "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0, err
  # The tensors, plus the zero rows that pad the 16-id embedding to 128 (model.vocab_multiple).
  expected = sum(v.size for v in tensors.values()) + (128 - V) * D
  assert f"# parameters: {expected:,}" in out

  for args, message in (
      (["--config=configs/tiny.py", "--config.model.block.attention.num_kv_heads=4"],
       "attention: num_heads 6 is not a multiple of num_kv_heads 4"),
      (["--config=configs/moe_tiny.py", "--config.model.block.ffn.top_k=9"],
       "moe: top_k 9 must be between 1 and num_experts 8"),
  ):
    code = main_lib.main(["axtrain", *args, "--print_config"])
    assert code == 2
    assert capsys.readouterr().err == f"axtrain: error: {message}\n"


def test_a_full_disk_is_one_line_and_leaves_nothing_both_ways(tmp_path, capsys, tensors,
                                                               monkeypatch):
  """convert on a disk without room. --from_hf: the disk fills as it writes config.py (fault
  injection: that write raises ENOSPC half-way). --to_hf: the disk has less room than the
  model's tensors (os.statvfs reports one 4 kB block free), which it checks before writing (a
  write that fails anyway, in safetensors' Rust, is a full disk too: tests/test_cli.py). Each
  is one line naming the device and --output_dir, not the hidden folder it stages in, exit 74,
  and nothing is left; the same commands then succeed."""
  from launcher.errors import EXIT_NO_SPACE  # pylint: disable=import-outside-toplevel
  from tests.conftest import fill_disk_at, report_full  # pylint: disable=import-outside-toplevel
  from trainer import disk  # pylint: disable=import-outside-toplevel
  hf, run, back = _write_hf(tmp_path / "hf", tensors), tmp_path / "run", tmp_path / "back"
  head = f"axtrain: error: no space left on {disk.device_text(tmp_path)} writing "
  for flags, out, full in (([f"--from_hf={hf}"], run, lambda p: fill_disk_at(p, "/config.py.tmp")),
                           ([f"--to_hf={run}"], back, lambda p: report_full(p, tmp_path))):
    with monkeypatch.context() as patch:
      full(patch)
      code, err = _convert(capsys, *flags, f"--output_dir={out}")
    assert code == EXIT_NO_SPACE and err.count("\n") == 1, err
    assert err.startswith(f"{head}{out} (") and " needed, " in err, err
    assert err.endswith(" free); free space there, then run the same command again\n"), err
    assert not out.exists() and not list(tmp_path.glob(f".{out.name}.*")), "something was left"
    assert _convert(capsys, *flags, f"--output_dir={out}")[0] == 0
  assert (back / "model.safetensors").is_file()


def test_a_stopped_convert_leaves_no_partial_output_both_ways(tmp_path, capsys, tensors):
  """Ctrl-C as --from_hf writes run.json, SIGTERM as --to_hf writes config.json, each into its
  hidden staging folder (tests/signal_at_write.py): the stop line says it removed that folder,
  which is gone (before, a half checkpoint stayed in `.NAME.XXXXXXXX.tmp`, unmentioned)."""
  from tests.conftest import cli  # pylint: disable=import-outside-toplevel
  hf, run, back = _write_hf(tmp_path / "hf", tensors), tmp_path / "run", tmp_path / "back"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  for signame, code, at, flags, out in (
      ("SIGINT", 130, "/run.json.tmp", [f"--from_hf={hf}"], tmp_path / "again"),
      ("SIGTERM", 75, "/config.json.tmp", [f"--to_hf={run}"], back)):
    done = cli(signame, at, "--", "convert", *flags, f"--output_dir={out}",
               module="tests.signal_at_write", timeout=300)
    assert done.returncode == code, done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"axtrain: {signame}: stopped; removed its partial output "
                           f"{tmp_path}/.{out.name}.") and last.endswith(f".tmp (exit {code})"), last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]


def test_a_killed_converts_staging_folder_is_removed_by_the_next(tmp_path, capsys, tensors):
  """Hidden staging folders beside --output_dir: one a killed convert left (no process holds its
  lock) is removed with a note by the next convert to that folder; one a live convert is
  writing (its lock held) and a folder that is no staging folder are left alone."""
  import fcntl  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  hf, out = _write_hf(tmp_path / "hf", tensors), tmp_path / "out"
  stale, live, other = (tmp_path / n for n in (".out.k3_9zq0a.tmp", ".out.live0001.tmp",
                                               ".out.backup.tmp"))
  for folder in (stale, live, other):
    folder.mkdir()
    (folder / "config.json").write_text("{}")
  fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={out}")
  finally:
    os.close(fd)
  assert code == 0, err
  assert (f"axtrain: note: convert: removed {stale}, the partial output of an earlier convert "
          f"to {out} that was stopped before it could clean up\n") in err
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      ["hf", "out", live.name, other.name])


def test_convert_uses_the_umask(tmp_path, capsys, tensors):
  import os  # pylint: disable=import-outside-toplevel
  hf = _write_hf(tmp_path / "hf", tensors)
  old = os.umask(0o027)
  try:
    assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={tmp_path / 'run'}")[0] == 0
    assert _convert(capsys, f"--to_hf={tmp_path / 'run'}", f"--output_dir={tmp_path / 'back'}")[0] == 0
  finally:
    os.umask(old)
  for root in (tmp_path / "run", tmp_path / "back"):
    for path in [root, *root.rglob("*")]:
      want = 0o750 if path.is_dir() else 0o640
      assert path.stat().st_mode & 0o777 == want, (path, oct(path.stat().st_mode))


def test_output_dir_that_cannot_be_written(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", tensors)
  regular = tmp_path / "file"
  regular.write_text("x")
  for out, message in ((regular / "run", "is a file, not a directory"),
                       (pathlib.Path("/proc/axtrain_convert"), "filesystem; choose a directory")):
    code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={out}")
    assert code == 2 and err.count("\n") == 1 and message in err, err
  assert regular.read_text() == "x" and not list(tmp_path.glob(".*.tmp"))


def test_output_inside_a_run_is_refused_and_the_run_left_alone(tmp_path, capsys, tensors):
  """Either direction's output inside a run directory would be a folder that run did not write
  (from_hf: a run nested in a run), after which the run can no longer be resumed or extended;
  both are refused before anything is written."""
  hf = _write_hf(tmp_path / "hf", tensors)
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  before = sorted(p.relative_to(run) for p in run.rglob("*"))
  for args in ([f"--from_hf={hf}", f"--output_dir={run / 'sub'}"],
               [f"--to_hf={run}", f"--output_dir={run / 'checkpoints' / 'hf'}"]):
    code, err = _convert(capsys, *args)
    assert code == 2 and err.count("\n") == 1, err
    assert f"is inside the run directory {run}" in err and "choose a path outside it" in err
  assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
