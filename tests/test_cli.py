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
