"""The step's memory, checked on its one compile before a run writes anything."""

from __future__ import annotations

import re

import jax
import pytest

import configs.llama
from core.registry import ConfigError
from launcher import main as main_lib
from planner import compiler_output, plan, plan_report, step_memory, sweep_screen, sweep_space
from tests.test_run_dirs import QUICK, snapshot
from trainer import config as config_lib, experiment, host_memory, meshes, metrics

pytestmark = pytest.mark.share_experiments  # tests/conftest.py


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


def _test_exp(**changes):
  """The `test` model on one CPU device, with `changes` ({config path: value}) made."""
  cfg = configs.llama.get_config("size=test")
  for path, value in changes.items():
    *parents, name = path.split(".")
    node = cfg
    for parent in parents:
      node = node[parent]
    node[name] = value
  return experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"), jax.devices("cpu")[:1])


def test_check_compares_the_compiled_bytes_with_the_device():
  exp = _test_exp()
  memory = step_memory.DeviceMemory(bytes=3 * step_memory.GiB, source="test")
  step_memory.check({"total_bytes": 3 * step_memory.GiB}, exp=exp, what="train step",
                    memory=memory)
  with pytest.raises(ConfigError, match=r"^the train step needs 3\.5 GiB per device, the device "
                                        r"has 3 GiB \(test\); what would fit"):
    step_memory.check({"total_bytes": 3.5 * step_memory.GiB}, exp=exp, what="train step",
                      memory=memory)
  step_memory.check({}, exp=exp, what="train step", memory=memory)  # no analysis: no check
  step_memory.check({"total_bytes": 10 ** 15}, exp=exp, what="eval step", memory=None)


def test_the_train_step_is_traced_alone_before_the_other_compiles_start():
  """Tracing is Python: a trace beside another thread's trace or lowering shares the interpreter
  (llm_1b's train step traced in 20.9-23.6 s in runs on a v5e host, 6.7 s alone). check_train
  traces and lowers the train step first, calls `on_lowered` (where the run starts its init's
  compile), and only then starts the eval step's compile beside the train step's."""
  import time  # pylint: disable=import-outside-toplevel
  from jax import monitoring  # pylint: disable=import-outside-toplevel
  exp = _test_exp()
  traces, called = [], []

  def listen(event, seconds, fun_name=None, **_):
    if event == "/jax/core/compile/jaxpr_trace_duration":
      traces.append((fun_name, time.perf_counter() - seconds, time.perf_counter()))

  process = dict(process_index=0, process_count=1)
  train_batch = next(exp.source.train_iterator(**process))
  eval_batch = exp.source.eval_batches(batch_size=exp.run.eval.batch_size, num_batches=1,
                                       **process)[0]
  monitoring.register_event_duration_secs_listener(listen)
  try:
    step_memory.check_train(exp, train_batch=train_batch, eval_batch=eval_batch,
                            on_lowered=lambda: called.append(time.perf_counter()))
  finally:
    monitoring.unregister_event_duration_listener(listen)
  (_, start, end), = [t for t in traces if t[0] == "train_step"]
  evals = [t for t in traces if t[0] == "eval_step"]
  assert evals and len(called) == 1, (traces, called)
  assert end <= called[0] <= min(t[1] for t in evals), (traces, called)
  assert all(t[2] <= start or t[1] >= end for t in traces if t[0] != "train_step"), traces


def _refusal(exp, *, share: float, what: str = "train step", entry=None, least: int = 0) -> str:
  """The refusal of `exp`'s compiled step on a device with `share` of the memory it needs (at
  least `least` bytes)."""
  if what == "train step":
    fn, args = exp.step_fn, (exp.abstract_state_inputs(), _abstract_batch(exp, exp.source.batch_size))
  else:
    fn, args = exp.eval_fn, (exp.abstract_state_inputs().params,
                             _abstract_batch(exp, exp.run.eval.batch_size))
  stats = metrics.compiled_stats(step_memory.compile_step(fn, args, exp=exp, what=what))
  memory = step_memory.DeviceMemory(bytes=max(int(stats["total_bytes"] * share), least),
                                    source="test")
  with pytest.raises(ConfigError) as refused:
    step_memory.check(stats, exp=exp, what=what, memory=memory, entry=entry)
  text = str(refused.value)
  assert "\n" not in text and text.startswith(f"the {what} needs "), text
  return text


def _abstract_batch(exp, rows: int) -> dict:
  return {name: jax.ShapeDtypeStruct((rows, exp.source.seq_len), dtype,
                                     sharding=exp.batch_sharding)
          for name, dtype in exp.source.fields().items()}


def _listed(text: str) -> list[dict]:
  """The refusal's options: {config path: value as written} each (compiled or, where none
  compiled within the device, the analytic model's)."""
  listed = re.split(r"what fits by the compiler: |on that scale; none of these compiled within "
                    r"the device\): ", text, maxsplit=1)[1].split("; `axtrain plan")[0]
  return [dict(re.findall(r"--config\.(\S+)=(\S+)", option))
          for option in re.split(r" \((?:compiled|model): [^)]*\),? ?", listed) if option]


def _unchanged(exp, options: list[dict]) -> list[str]:
  """Listed changes that the run already has (none should be)."""
  return [f"{path}={value}" for option in options for path, value in option.items()
          if str(sweep_space.get_path(exp.run, path)).lower() == value.lower()]


def test_refusal_lists_accumulation_first_for_a_plain_step_and_never_a_change_made():
  """The `test` model as configured (no accumulation, remat or chunking), on a device with half
  the memory its compiled train step needs: each listed option is a change of the run, the
  analytic model's figure with it, at most three, one change each (fewest first)."""
  exp = _test_exp()
  text = _refusal(exp, share=0.5, entry=meshes.lookup("tpu-v5e-1"))
  options = _listed(text)
  assert 1 <= len(options) <= 3 and not _unchanged(exp, options), text
  assert any("trainer.grad_accum_steps" in o for o in options), text
  assert text.count("(compiled: ") == len(options), text
  assert text.endswith("; `axtrain plan --sweep --mesh=tpu-v5e-1` compiles and ranks them")


def test_refusal_lists_remat_and_chunks_once_accumulation_is_used_up():
  """The batch already one sequence per microbatch (8 of 8): remat, a shorter loss chunk or
  chunked attention are what is left, never accumulation again nor a setting already made."""
  exp = _test_exp(**{"trainer.grad_accum_steps": 8, "data.seq_len": 512})
  options = _listed(_refusal(exp, share=0.8))
  assert options and not _unchanged(exp, options)
  assert not any("trainer.grad_accum_steps" in o for o in options)
  assert any(set(o) & {"model.remat", "trainer.loss_chunk_size",
                       "model.block.attention.implementation"} for o in options), options
  assert all(o.get("model.block.attention.implementation") != "splash" for o in options)


def test_refusal_lists_loss_chunks_where_the_logits_are_what_is_left():
  """Accumulation used up and remat full already set, a large vocabulary: the loss chunk."""
  exp = _test_exp(**{"trainer.grad_accum_steps": 8, "model.remat": "full",
                     "model.vocab_size": 32768})
  text = _refusal(exp, share=0.7)
  options = _listed(text)
  assert options and not _unchanged(exp, options), text
  assert "model.remat=full" not in text
  assert any("trainer.loss_chunk_size" in o for o in options), text


def test_eval_refusal_lists_eval_rows_per_pass():
  exp = _test_exp(**{"eval.batch_size": 64, "model.vocab_size": 32768})
  options = _listed(_refusal(exp, share=0.5, what="eval step"))
  assert options and not _unchanged(exp, options)
  assert any("eval.microbatch_rows" in o for o in options)


def test_nothing_to_change_says_the_recipe_changes_that_remain():
  """Every knob at its leanest: the refusal names the last resort, which changes the recipe."""
  exp = _test_exp(**{"trainer.grad_accum_steps": 8, "model.remat": "full",
                     "trainer.loss_chunk_size": 8,
                     "model.block.attention.implementation": "chunked",
                     "model.block.attention.query_chunk_size": 32})
  params = sweep_screen.state_bytes(exp, eval_step=True)  # the device holds them, at least
  text = _refusal(exp, share=0.05, least=2 * params)
  assert "no change of gradient accumulation, remat, loss chunks or attention fits" in text
  assert text.endswith("lower data.batch_size or data.seq_len, or optimizer.state_dtype="
                       "bfloat16, or optimizer.kind=adafactor (these change the training recipe)")
  entry = meshes.lookup("tpu-v5e-1")
  assert _refusal(exp, share=0.05, entry=entry, least=2 * params).endswith(
      "; `axtrain plan --sweep --sweep_recipe --mesh=tpu-v5e-1` compiles them")


def test_parameters_larger_than_the_device_get_no_recipe_that_cannot_fit():
  """A device smaller than the parameters alone (model.dim=49152 on a CPU's host memory: 617 GiB
  against 21 GiB): no batch, sequence, accumulation or optimizer change can fit, so none is
  offered; the refusal says why and names what can (a smaller model, more devices)."""
  exp = _test_exp()
  params = sweep_screen.state_bytes(exp, eval_step=True)
  assert params == 4 * exp.num_params  # float32, one device: independent of the model's count
  text = _refusal(exp, share=0.0, least=params // 2, entry=meshes.lookup("tpu-v5e-1"))
  assert text.endswith(f"; its parameters alone take {plan_report.gib(params)} per device "
                       f"(float32), more than the device has, so no setting of this run fits: "
                       f"a smaller model (model.dim, model.num_layers), or more devices to "
                       f"shard them over (mesh.fsdp)"), text
  assert "data.batch_size" not in text and "--config." not in text


def test_lean_attention_is_the_platforms_own_and_not_one_already_set():
  """splash is offered on TPU only, and never where it is set; chunked where it chunks;
  pallas_hd64 too on TPU where the heads are 64 wide and pair up (the `test` model's are 16)."""
  run = _test_exp(**{"data.seq_len": 256}).run
  path = sweep_space.attention_path(run)
  assert path == "model.block.attention.implementation"
  assert sweep_space.knob_values(run, platform="tpu", shards=1)[path] == ["xla", "splash"]
  assert sweep_space.knob_values(run, platform="cpu", shards=1)[path] == ["xla"]  # 256 <= 512
  short = _test_exp(**{"data.seq_len": 256, "model.block.attention.query_chunk_size": 64}).run
  assert sweep_space.knob_values(short, platform="cpu", shards=1)[path] == ["xla", "chunked"]
  splash = _test_exp(**{"model.block.attention.implementation": "splash"}).run
  assert sweep_space.knob_values(splash, platform="tpu", shards=1)[path] == ["splash"]
  wide = _test_exp(**{"data.seq_len": 256, "model.block.attention.head_dim": 64}).run
  assert sweep_space.knob_values(wide, platform="tpu", shards=1)[path] == [
      "xla", "pallas_hd64", "splash"]
  odd = _test_exp(**{"data.seq_len": 256, "model.block.attention.head_dim": 64,
                     "model.block.attention.num_heads": 3,
                     "model.block.attention.num_kv_heads": 1}).run
  assert sweep_space.knob_values(odd, platform="tpu", shards=1)[path] == ["xla", "splash"]


def test_the_tpu_compilers_refusal_is_read_in_any_unit():
  message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
             "temporaries (1.23T) exceeds available HBM (15.75G).")
  assert compiler_output.refused_bytes(message) == (int(1.23 * 1024 ** 4), int(15.75 * 1024 ** 3))
  assert compiler_output.refused_bytes("RESOURCE_EXHAUSTED: something else") == (None, None)


@pytest.mark.slow  # 88 s on 2 cores: libtpu compiles the refused step and each suggestion
def test_a_tpu_step_the_compiler_refuses_is_one_line_with_what_would_fit():
  """The TPU compiler (libtpu, compile-only: no TPU here) refuses the `test` model at 8 x 16384
  positions on one v5e chip; the refusal reads its figures and lists what would fit."""
  entry = meshes.lookup("tpu-v5e-1")
  devices, _ = plan.target_devices(entry)
  cfg = configs.llama.get_config("size=test")
  cfg.data.seq_len = 16384
  exp = experiment.build(config_lib.parse(cfg), entry, devices)
  args = (exp.abstract_state_inputs(), _abstract_batch(exp, exp.source.batch_size))
  with pytest.raises(ConfigError) as refused:
    step_memory.compile_step(exp.step_fn, args, exp=exp, what="train step", entry=entry)
  text = str(refused.value)
  assert text.startswith("the train step needs ") and " of temporaries: the compiler ran out of "
  assert "device memory (15.8 GiB available); what fits by the compiler: " in text
  options = _listed(text)
  assert options and not _unchanged(exp, options), text
  # Each listed change was compiled by the TPU compiler within the chip's memory.
  compiled = [float(x) for x in re.findall(r"\(compiled: ([\d.]+) GiB\)", text)]
  assert len(compiled) == len(options) and all(0 < x <= 15.8 for x in compiled), text


def test_cpu_devices_share_the_host_memory_available():
  cpus = jax.devices("cpu")
  one = step_memory.device_memory(cpus[:1])
  assert one is not None and one.source == "host memory available"
  assert 0 < one.bytes <= host_memory.available() * 1.01 + 2 ** 30


def test_a_run_that_sets_rows_per_device_is_told_rows_per_device():
  """A recipe that sets trainer.microbatch_rows (the accumulation follows from the device
  count) is told more accumulation as fewer rows, never as grad_accum_steps (which it refuses
  beside the rows)."""
  exp = _test_exp(**{"trainer.microbatch_rows": 4})  # 8 rows on one device: 2 microbatches
  options = _listed(_refusal(exp, share=0.5))
  assert options and not any("trainer.grad_accum_steps" in o for o in options), options
  rows = [int(o["trainer.microbatch_rows"]) for o in options if "trainer.microbatch_rows" in o]
  assert rows and all(r < 4 for r in rows)


def test_the_first_change_a_refusal_names_fits_when_applied_alone():
  """The refusal's first change, applied to the config and compiled as a run would compile it,
  needs no more than the device the refusal was about (issue 37: advice that works)."""
  exp = _test_exp()
  stats = metrics.compiled_stats(step_memory.compile_step(
      exp.step_fn, (exp.abstract_state_inputs(), _abstract_batch(exp, exp.source.batch_size)),
      exp=exp, what="train step"))
  memory = step_memory.DeviceMemory(bytes=int(stats["total_bytes"] * 0.5), source="test")
  with pytest.raises(ConfigError) as refused:
    step_memory.check(stats, exp=exp, what="train step", memory=memory,
                      entry=meshes.lookup("cpu"))
  first = _listed(str(refused.value))[0]
  changed = _test_exp(**{path: int(v) if v.isdigit() else v for path, v in first.items()})
  again = metrics.compiled_stats(step_memory.compile_step(
      changed.step_fn, (changed.abstract_state_inputs(),
                        _abstract_batch(changed, changed.source.batch_size)),
      exp=changed, what="train step"))
  assert again["total_bytes"] <= memory.bytes < stats["total_bytes"], (first, again)
  step_memory.check(again, exp=changed, what="train step", memory=memory)  # not refused
