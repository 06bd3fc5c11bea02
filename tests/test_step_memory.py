"""The step's memory, checked on its one compile before a run writes anything."""

from __future__ import annotations

import jax
import pytest

from core.registry import ConfigError
from launcher import main as main_lib
from tests.test_run_dirs import QUICK, snapshot
from planner import step_memory


@pytest.fixture
def quick(tmp_path, monkeypatch):
  (tmp_path / "quick.py").write_text(QUICK)
  monkeypatch.chdir(tmp_path)
  return tmp_path


def axtrain(capsys, *args) -> tuple[int, str]:
  code = main_lib.main(["axtrain", *args, "--noprogress"])
  return code, capsys.readouterr().err


def test_each_step_compiles_once_checked_and_run_and_eval_checks_too(quick, capsys):
  compiled: list[str] = []

  def listener(event, duration, **kwargs):
    del duration
    if event == "/jax/core/compile/backend_compile_duration":
      compiled.append(kwargs.get("fun_name", ""))

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    code, err = axtrain(capsys, "--config=quick.py", "--output_dir=run")
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert code == 0, err
  # The check before the run compiled them; the run found them in jit's cache.
  assert sum("train_step" in name for name in compiled) == 1, compiled
  assert sum("eval_step" in name for name in compiled) == 1, compiled
  # `axtrain eval` of that run checks its eval step the same way, before reading a checkpoint.
  before = snapshot(quick / "run")
  code = main_lib.main(["axtrain", "eval", "--run_dir=run", "--config.data.seq_len=100000"])
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("axtrain: error: eval: the eval step needs ") and (
      "lower eval.batch_size or data.seq_len" in err), err
  assert snapshot(quick / "run") == before


@pytest.mark.parametrize("command", [
    ["--config=quick.py", "--config.data.seq_len=100000", "--output_dir=big"],
    ["--config=quick.py", "--config.data.kind=synthetic", "--config.eval.batch_size=2048",
     "--config.data.seq_len=2048",
     "--config.model.block.attention.implementation=xla", "--output_dir=big"],
], ids=["train", "eval"])
def test_a_step_larger_than_the_device_is_refused_before_writing(quick, capsys, command):
  code, err = axtrain(capsys, *command)
  assert code == 2 and err.count("\n") == 1, err
  what = "train" if "--config.data.seq_len=100000" in command else "eval"
  assert err.startswith(f"axtrain: error: the {what} step needs "), err
  assert " GiB per device, the device has " in err and "(host memory available)" in err
  assert not (quick / "big").exists()


def test_check_compares_the_compiled_bytes_with_the_device():
  memory = step_memory.DeviceMemory(bytes=3 * step_memory.GiB, source="test")
  step_memory.check({"total_bytes": 3 * step_memory.GiB}, what="train step", memory=memory)
  with pytest.raises(ConfigError, match=r"^the train step needs 3\.5 GiB per device, the device "
                                        r"has 3\.0 GiB \(test\); lower data.batch_size"):
    step_memory.check({"total_bytes": 3.5 * step_memory.GiB}, what="train step", memory=memory)
  step_memory.check({}, what="train step", memory=memory)  # no analysis: nothing to check
  step_memory.check({"total_bytes": 10 ** 15}, what="eval step", memory=None)  # unknown device


def test_cpu_devices_share_the_host_memory_available():
  cpus = jax.devices("cpu")
  one = step_memory.device_memory(cpus[:1])
  assert one is not None and one.source == "host memory available"
  assert 0 < one.bytes <= step_memory._host_available() * 1.01 + 2 ** 30  # pylint: disable=protected-access
