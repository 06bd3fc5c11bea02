"""The command line's paths: an output directory that cannot be written (a file in the way, no
permission, a read-only mount), the process flags of a cluster, tokenize's folders and a disk
that fills under it (tests/test_cli.py: the rest of the command line)."""

from __future__ import annotations

import pathlib

import pytest

from launcher import main as main_lib
from tests.conftest import ROOT
from tests.test_cli import run_main

pytestmark = pytest.mark.share_experiments  # tests/conftest.py


def _refused_in_process(capsys, *args):
  code, out, err = run_main(capsys, "--config=configs/tiny.py", *args)
  assert code == 2, (code, err)
  assert err.count("\n") == 1 and err.startswith("axtrain: error: "), err
  assert "Traceback" not in err
  return err


def test_output_dir_that_cannot_be_written(capsys, tmp_path):
  regular = tmp_path / "file"
  regular.write_text("x")
  err = _refused_in_process(capsys, f"--output_dir={regular / 'run'}")
  assert f"{regular} is a file, not a directory" in err
  assert regular.read_text() == "x"
  err = _refused_in_process(capsys, f"--output_dir={regular}")
  assert f"{regular} is a file, not a directory" in err
  for pseudo in ("/proc/axtrain_run", "/sys/axtrain_run", "/proc/self/axtrain/run"):
    err = _refused_in_process(capsys, f"--output_dir={pseudo}")
    assert "filesystem; choose a directory on a disk" in err
    assert not __import__("os").path.exists(pseudo)


def test_output_dir_without_write_permission(capsys, tmp_path):
  import os  # pylint: disable=import-outside-toplevel
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o500)
  try:
    if os.access(locked, os.W_OK):
      pytest.skip("running as root: permissions do not stop writes")
    err = _refused_in_process(capsys, f"--output_dir={locked / 'run'}")
    assert "is not writable by this user" in err
  finally:
    locked.chmod(0o700)
  assert not (locked / "run").exists()


def test_output_dir_on_a_read_only_mount_says_so_even_as_root(tmp_path):
  """A read-only mount refuses every user, root included: said as such, not as a permission.
  The mount is made in a user and mount namespace of its own (`unshare -rm`: root there)."""
  import shutil as sh  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  if sh.which("unshare") is None:
    pytest.skip("no unshare(1) here to make a read-only mount")
  ro = tmp_path / "ro"
  ro.mkdir()
  check = ("from launcher import run_dir, errors\n"
           "try:\n"
           f"  run_dir.check_writable(__import__('pathlib').Path('{ro}/run'))\n"
           "except errors.UserError as e:\n"
           "  print(e)\n")
  done = subprocess.run(
      ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o ro none {ro} && exec \"$0\" -c \"$1\"",
       sys.executable, check], cwd=ROOT, capture_output=True, text=True, check=False)
  if "mount" in done.stderr or "unshare" in done.stderr:
    pytest.skip(f"no mount namespace here: {done.stderr.strip()[:200]}")
  assert done.stdout == (f"--output_dir {ro}/run: {ro} is on a read-only filesystem (tmpfs "
                         f"mounted on {ro}); choose a directory on a writable disk\n"), done


@pytest.mark.parametrize("args,message", [
    (["--num_processes=2"], "--num_processes needs --coordinator_address"),
    (["--process_id=1"], "--process_id needs --coordinator_address"),
    (["--num_processes=2", "--process_id=0"], "--num_processes and --process_id need"),
    (["--num_processes=0"], "--num_processes=0: must be at least 1"),
    (["--coordinator_address=127.0.0.1:1", "--num_processes=2", "--process_id=2"],
     "--process_id=2: must be below --num_processes=2 (0 to 1)"),
])
def test_process_flags_need_a_cluster(capsys, monkeypatch, tmp_path, args, message):
  for name in ("SLURM_NTASKS", "SLURM_STEP_ID", "JAX_COORDINATOR_ADDRESS"):
    monkeypatch.delenv(name, raising=False)
  err = _refused_in_process(capsys, *args, f"--output_dir={tmp_path / 'run'}")
  assert message in err
  assert not (tmp_path / "run").exists()


def test_tokenize_into_a_folder_under_a_file(capsys, tmp_path):
  (tmp_path / "afile").write_text("x")
  code = main_lib.main(["axtrain", "tokenize", "--input=configs/tiny.py",
                        f"--output_dir={tmp_path / 'afile' / 'tok'}"])
  err = capsys.readouterr().err
  assert code == 2 and err == (f"axtrain: error: --output_dir {tmp_path / 'afile' / 'tok'}: "
                               f"{tmp_path / 'afile'} is a file, not a directory\n"), err
  assert (tmp_path / "afile").read_text() == "x"


def test_tokenize_help_lists_every_flag(capsys):
  assert main_lib.main(["axtrain", "tokenize", "--help"]) == 0
  out = capsys.readouterr().out
  for flag in ("--input", "--kind", "--field", "--tokenizer", "--tokenizer_path", "--format",
               "--shard_tokens", "--add_bos", "--add_eos", "--on_error", "--output_dir"):
    assert flag in out, flag




def test_a_full_disk_under_tokenize_names_what_it_writes(capsys, tmp_path, monkeypatch):
  """The disk fills as tokenize writes a shard (fault injection: the write of its tokens
  raises ENOSPC half-way; numpy's own np.save reported that as `N requested and M written`,
  a traceback): one line naming the device and --output_dir, exit 74, and tokenize's partial
  folder removed."""
  from launcher.errors import EXIT_NO_SPACE  # pylint: disable=import-outside-toplevel
  from tests.conftest import fill_disk_at  # pylint: disable=import-outside-toplevel
  from trainer import disk  # pylint: disable=import-outside-toplevel
  corpus, out = tmp_path / "c.jsonl", tmp_path / "tok"
  corpus.write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(20)))
  fill_disk_at(monkeypatch, ".tokens.npy.tmp")
  code, _, err = run_main(capsys, "tokenize", f"--input={corpus}", "--kind=jsonl",
                          f"--output_dir={out}")
  assert code == EXIT_NO_SPACE, err
  head = f"axtrain: error: no space left on {disk.device_text(tmp_path)} writing {out} ("
  assert err.startswith(head) and err.count("\n") == 1, err  # what is free: the disk's own
  assert err.endswith(" free); free space there, then run the same command again\n"), err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_a_librarys_full_disk_told_only_in_its_text_is_no_space():
  """Libraries in other languages report a full disk only in the OS's words: safetensors
  (`convert --to_hf`) and ArrayRecord (`tokenize --format=arrayrecord`), as each reported it on
  a 64 kB tmpfs. Both are a full disk (exit 74 under any command), naming the file where the
  text does not."""
  from safetensors import SafetensorError  # pylint: disable=import-outside-toplevel
  from trainer import disk  # pylint: disable=import-outside-toplevel
  rust = SafetensorError("Error while serializing: I/O error: No space left on device "
                         "(os error 28)")
  riegeli = RuntimeError("write() failed: No space left on device; writing /x/shard.array_record;"
                         " at byte 65536; Failed to close chunk_writer")
  quota = RuntimeError("write() failed: Disk quota exceeded; writing /x/shard.array_record")
  for error, path in ((rust, "/x/model.safetensors"), (riegeli, "/x/tok"), (quota, "/x/tok")):
    full = disk.as_no_space(error, path=path)
    assert full is not None and full.path == pathlib.Path(path), error
    assert full.quota == (error is quota)
  assert disk.as_no_space(RuntimeError("write() failed: Permission denied")) is None
