"""The command line: --help, --print_config, overrides, and one-line errors for bad input."""

from __future__ import annotations

import pytest

from launcher import main as main_lib
from tests.conftest import cli


def run_main(capsys, *args):
  code = main_lib.main(["axtrain", *args])
  out, err = capsys.readouterr()
  return code, out, err


def test_help_in_a_subprocess():
  result = cli("--help")
  assert result.returncode == 0, result.stderr
  for flag in ("--config", "--output_dir", "--overwrite", "--print_config", "--mesh"):
    assert flag in result.stdout
  assert "axtrain convert" in result.stdout


def test_print_config_is_flat_sorted_and_counts_parameters(capsys):
  code, out, _ = run_main(capsys, "--config=configs/llm_1b.py", "--print_config")
  assert code == 0
  lines = [line for line in out.splitlines() if not line.startswith("#")]
  keys = [line.split(": ", 1)[0] for line in lines]
  assert keys == sorted(keys) and len(keys) == len(set(keys))
  assert "model.dim: 2048" in lines and "model.block.attention.num_kv_heads: 8" in lines
  # LLaMA-3.2-1B: 1,235,814,400 parameters (sum of the tensor sizes in its safetensors).
  assert "# parameters: 1,235,814,400 (1.24B)" in out


def test_overrides_reach_the_built_model(capsys):
  code, out, _ = run_main(capsys, "--config=configs/tiny.py", "--print_config",
                          "--config.model.dim=96", "--config.model.block.attention.num_heads=3",
                          "--config.model.block.attention.num_kv_heads=1",
                          "--config.model.block.ffn.hidden_dim=256")
  assert code == 0
  assert "model.dim: 96" in out
  # Count from the dims: embedding + head 2*256*96; per layer q,o 2*96*96, k,v 2*96*32,
  # gated MLP 3*96*256, two norms 2*96; final norm 96.
  per_layer = 2 * 96 * 96 + 2 * 96 * 32 + 3 * 96 * 256 + 2 * 96
  expected = 2 * 256 * 96 + 4 * per_layer + 96
  assert f"# parameters: {expected:,}" in out


BAD_INPUTS = [
    ([], "--config is required"),
    (["--config=missing.py"], "config file 'missing.py' not found"),
    (["--config=configs/base.py"], "defines no get_config"),
    (["--config=configs/tiny.py:size=1"], "unknown key 'size'"),
    (["--config=configs/tiny.py:oops"], "expected key=value"),
    (["--config=configs/tiny.py", "--config.optimizer.learnig_rate=1e-3"],
     "did you mean 'learning_rate'"),
    (["--config=configs/tiny.py", "--config.trainer.max_steps=ten"], "expected a value of type int"),
    (["--config=configs/tiny.py", "--config.model.kind=decoder"], "registered: decoder_lm"),
    (["--config=configs/tiny.py", "--config.model.block.ffn.kind=mpl"], "did you mean 'mlp'"),
    (["--config=configs/tiny.py", "--config.model.dim=100"], "not divisible by num_heads 6"),
    (["--config=configs/tiny.py", "--config.trainer.max_steps=0"], "max_steps must be positive"),
    (["--config=configs/tiny.py", "--config.trainer.max_steps=-5"], "max_steps must be positive"),
    (["--config=configs/tiny.py", "--outptu_dir=x"], "did you mean 'output_dir'"),
    (["--config=configs/tiny.py", "train"], "unexpected argument 'train'"),
    (["--config=configs/tiny.py", "--config.model.block.attention.implementation=flash"],
     "not one of xla, dot_product"),
    (["--config=configs/gpt2.py", "--config.data.seq_len=2048"],
     "exceeds the 1024 learned positions; set --config.model.position_embedding.max_length=2048"),
    (["--config=configs/llama.py:size=9b"], "config argument size=9b: unknown"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, args, message):
  code, out, err = run_main(capsys, *args, f"--output_dir={tmp_path / 'run'}")
  assert code == 2
  assert err.count("\n") == 1 and err.startswith("axtrain: error: "), err
  assert message in err
  assert not (tmp_path / "run").exists()


def test_broken_config_file(capsys, tmp_path):
  bad = tmp_path / "broken.py"
  bad.write_text("def get_config(:\n")
  code, _, err = run_main(capsys, f"--config={bad}")
  assert code == 2 and err.startswith("axtrain: error: ") and "line 1" in err
  raising = tmp_path / "raising.py"
  raising.write_text("def get_config(arg=None):\n  raise ValueError('no such variant')\n")
  code, _, err = run_main(capsys, f"--config={raising}")
  assert code == 2 and "no such variant" in err and err.count("\n") == 1


def test_bad_input_in_a_subprocess_has_no_traceback(tmp_path):
  result = cli("--config=configs/tiny.py", "--config.model.dim=100",
               f"--output_dir={tmp_path / 'run'}")
  assert result.returncode == 2
  assert result.stderr.startswith("axtrain: error: ") and result.stderr.count("\n") == 1
  assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


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


def test_tokenize_help_lists_every_flag(capsys):
  assert main_lib.main(["axtrain", "tokenize", "--help"]) == 0
  out = capsys.readouterr().out
  for flag in ("--input", "--kind", "--field", "--tokenizer", "--tokenizer_path", "--format",
               "--shard_tokens", "--add_bos", "--add_eos", "--on_error", "--output_dir"):
    assert flag in out, flag
