"""About 200 random mutations of valid command lines: never a traceback, only exit 0 or 2.

In-process (launcher.main.main), each with --print_config or a mutation that fails
before training, so nothing trains and nothing is written. A fixed seed makes a
failure reproducible: the assertion message carries the command line.
"""

from __future__ import annotations

import random

import pytest

from launcher import config_loading, flat, main as main_lib
from tests.conftest import ROOT

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

SEED = 20261203
CASES = 200
BASES = ["configs/tiny.py", "configs/llama.py:size=test", "configs/moe_tiny.py",
         "configs/gpt2.py:size=small", "configs/tiny_mixture.py:path=corpus.jsonl"]
VALUES = ["0", "-1", "1", "2", "3", "7", "1e9", "1e-3", "-0.5", "0.999", "1.0", "nan", "inf",
          "-inf", "abc", "", " ", "True", "false", "None", "()", "(1, 2)", "[1]", "{}", "1.5",
          "x" * 300, "'", '"', "\\", "%s", "--", "=", "../up", "/proc/x", "\u00e9\u4e2d",
          "rmsnorm", "layernorm", "mlp", "moe", "rope", "learned", "none", "adamw", "sgd",
          "synthetic", "stdlib", "jsonl", "float16", "bfloat16", "full", "auto", "cpu", "0x10"]
FLAGS = ["--mesh=cpu", "--mesh=auto", "--mesh=gpu-h100-8", "--mesh=cpux2", "--mesh=",
         "--mesh=tpu-v4-8", "--num_processes=2", "--process_id=1", "--num_processes=-1",
         "--coordinator_address=", "--outptu_dir=x", "--config", "--config.", "--config..a=1",
         "--config.model..dim=1", "train", "-h", "--helpfull", "--print_config=maybe",
         "--progress=2", "--overwrite=yes", "--config.model=foo", "--config.model.dim",
         "--config.trainer=3", "--nonexistent"]
BAD_DIRS = ["/proc/axtrain_fuzz", "/sys/axtrain_fuzz/run"]


def _keys(base: str) -> dict:
  """{key: its value as a command line writes it} of a config."""
  return {k: flat.flat_text({k: v}).split(": ", 1)[1].strip()
          for k, v in flat.flatten(config_loading.load(base)).items()}


def _mutate_key(rng: random.Random, key: str) -> str:
  parts = key.split(".")
  how = rng.randrange(5)
  if how == 0 and len(key) > 2:  # drop a character
    i = rng.randrange(len(key))
    return key[:i] + key[i + 1:]
  if how == 1:  # swap in a sibling section's name
    parts[rng.randrange(len(parts))] = rng.choice(["model", "data", "kind", "block", "x", ""])
    return ".".join(parts)
  if how == 2:  # one level too deep
    return key + ".inner"
  if how == 3:  # a parent instead of the leaf
    return ".".join(parts[:-1]) or key
  return key.upper()


def _case(rng: random.Random, keys: dict) -> list[str]:
  base = rng.choice(BASES)
  argv = ["axtrain", f"--config={base}", "--print_config"]
  for _ in range(rng.randint(1, 2)):
    kind = rng.randrange(7)
    key = rng.choice(sorted(keys[base]))
    if kind == 6:  # a valid line: the key set to its own value
      argv.append(f"--config.{key}={keys[base][key]}")
    elif kind <= 1:
      argv.append(f"--config.{key}={rng.choice(VALUES)}")
    elif kind == 2:
      argv.append(f"--config.{_mutate_key(rng, key)}={rng.choice(VALUES)}")
    elif kind == 3:
      argv.append(rng.choice(FLAGS))
    elif kind == 4:
      path = rng.choice([base.split(":")[0] + ":size=" + rng.choice(VALUES), "configs/",
                         "configs/missing.py", "/dev/null", "configs/base.py", "README.md",
                         base + ",size=test", base.split(":")[0] + ":" + rng.choice(VALUES)])
      argv[1] = f"--config={path}"
    else:  # no --print_config: only with an output directory that must be refused first
      if "--print_config" in argv:
        argv.remove("--print_config")
      argv.append(f"--output_dir={rng.choice(BAD_DIRS)}")
  return argv


def test_random_command_lines_never_crash(capsys, monkeypatch):
  monkeypatch.chdir(ROOT)
  for name in ("SLURM_NTASKS", "SLURM_STEP_ID", "JAX_COORDINATOR_ADDRESS"):
    monkeypatch.delenv(name, raising=False)
  rng = random.Random(SEED)
  keys = {base: _keys(base) for base in BASES}
  codes = []
  for _ in range(CASES):
    argv = _case(rng, keys)
    if "--print_config" not in argv:
      assert any(a.startswith("--output_dir=") for a in argv)
    try:
      code = main_lib.main(argv)
    except SystemExit as e:  # --help
      code = e.code
    except Exception as e:  # pylint: disable=broad-except
      pytest.fail(f"{argv}: traceback {type(e).__name__}: {e}")
    _, err = capsys.readouterr()
    assert code in (0, 2, 75), (argv, code, err)
    if code == 2:
      assert err.startswith("axtrain: error: ") and err.count("\n") == 1, (argv, err)
      assert "Traceback (most recent call last)" not in err, (argv, err)
      assert "<ast." not in err and " object at 0x" not in err, (argv, err)
    codes.append(code)
  assert codes.count(2) > CASES // 4 and codes.count(0) > CASES // 10, codes
