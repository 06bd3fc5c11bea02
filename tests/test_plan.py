"""`axtrain plan`: the real TPU compiler on libtpu topologies, the report, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys

import flax.linen as nn
import jax
import pytest

import configs.llama
import configs.llm_1b
import configs.tiny
from launcher import main as main_lib
from tests.conftest import ROOT, cli
from trainer import config as config_lib, experiment, flops, mesh_rules, meshes
from planner import compiler_output, hlo_collectives, plan, plan_report, plan_sweep, sweep_screen, sweep_space
from trainer.data.packing import PACKED_FIELDS

pytestmark = pytest.mark.share_experiments  # tests/conftest.py
GOLDEN = ROOT / "tests" / "testdata" / "plan" / "tiny_tpu-v5e-8.txt"


def _run(cfg):
  return config_lib.parse(cfg)


@pytest.fixture(scope="module")
def tiny_plan():
  """configs/tiny.py on an 8-chip v5e slice (fsdp=8), compiled once by the TPU compiler."""
  return plan.plan(_run(configs.tiny.get_config()), meshes.lookup("tpu-v5e-8"),
                   config_name="configs/tiny.py", with_eval=False)


def test_tiny_on_tpu_topology_shards_parameters_over_fsdp(tiny_plan):
  assert tiny_plan.compiler == "TPU compiler (libtpu)"
  assert tiny_plan.axes == {"data": 1, "stage": 1, "fsdp": 8, "expert": 1, "context": 1, "model": 1}
  exp = experiment.build(_run(configs.tiny.get_config()), meshes.lookup("cpu"), jax.devices()[:1])
  leaves = jax.tree.leaves(exp.abstract_state.params,
                           is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  total = sum(math.prod(x.value.shape) * x.value.dtype.itemsize for x in leaves)
  norms = sum(math.prod(x.value.shape) * x.value.dtype.itemsize for x in leaves
              if "norm" in x.names)
  # Norm scales (no embed axis) stay whole on every device; everything else is split 8 ways.
  assert tiny_plan.analytic.params == (total - norms) // 8 + norms
  # The compiler's arguments hold the state: parameters + optimizer state, plus the batch.
  assert tiny_plan.train.argument >= tiny_plan.analytic.params + tiny_plan.analytic.opt_state


def test_tiny_compiler_flops_match_the_analytic_count(tiny_plan):
  # tiny unrolls its layers, so the compiler sees every matmul once per step.
  per_device = tiny_plan.model_flops / tiny_plan.devices
  assert tiny_plan.train.flops == pytest.approx(per_device, rel=0.10)
  run = _run(configs.tiny.get_config())
  exp = experiment.build(run, meshes.lookup("cpu"), jax.devices()[:1])
  assert tiny_plan.model_flops == flops.model_flops_per_token(
      run, exp.abstract_state.params) * 8 * 128


# The step's metrics are scalar outputs of it (trainer/train_metrics.py): a metric added or
# dropped moves the compiler's bytes by a scalar's padded size (a few hundred bytes on TPU),
# which can turn the last printed digit of a byte figure (`train outputs` 5.23 -> 5.24 MiB for
# `grad_clipped`). So a byte figure may differ from the golden's by one unit of its last digit;
# all else must be equal.
_BYTES = re.compile(r"(\d+(?:\.(\d+))?) (?=[KMGT]iB)")


def _same_but_last_byte_digits(text: str, golden: str) -> bool:
  if _BYTES.sub("#", text) != _BYTES.sub("#", golden):
    return False
  return all(abs(float(a[0]) - float(b[0])) <= 1.001 * 10.0 ** -len(b[1])
             for a, b in zip(_BYTES.findall(text), _BYTES.findall(golden)))


def test_report_golden_text(tiny_plan):
  text = plan_report.text(tiny_plan, timings=False)
  if os.environ.get("UPDATE_GOLDEN"):
    GOLDEN.write_text(text)
  assert _same_but_last_byte_digits(text, GOLDEN.read_text()), (
      "regenerate: UPDATE_GOLDEN=1 pytest tests/test_plan.py")
  assert "fits" in text and "ESTIMATE" in text


def test_the_golden_text_allows_the_last_digit_of_a_byte_figure_only():
  golden = "outputs 5.23 MiB, peak 25 MiB, 8 devices"
  assert _same_but_last_byte_digits("outputs 5.24 MiB, peak 24 MiB, 8 devices", golden)
  for other in ("outputs 5.25 MiB, peak 25 MiB, 8 devices", "outputs 5.23 GiB, peak 25 MiB, "
                "8 devices", "outputs 5.23 MiB, peak 25 MiB, 9 devices"):
    assert not _same_but_last_byte_digits(other, golden), other


def test_ops_report_names_the_attention_among_its_top_ops_and_the_loss(tiny_plan):
  """`plan --ops`: the compiled step's ops by bytes and by time, named by module."""
  r = tiny_plan.train.ops
  top = r.top("bytes", 10) + r.top("seconds", 10)
  assert any(g.module == "DecoderLM/layers_*/block/attention" for g in top)
  # The loss: the LM head's logits (modules/decoder.py) and the cross-entropy (trainer/step.py),
  # about 20th of tiny's op groups on this slice.
  assert any(g.module in ("DecoderLM/head", "loss") for g in r.top("seconds", 10 ** 6))
  assert {"matmul", "collective", "elementwise", "copy/convert"} <= set(r.totals())
  bytes_share, flops_share = r.coverage()
  # Our per-op sums against the compiler's own totals (tile padding of tiny's small arrays
  # is in its bytes, not ours).
  assert 0.5 < bytes_share < 1.1 and 0.95 < flops_share < 1.05
  text = plan_report.ops_text(tiny_plan)
  assert "top 10 by bytes" in text and "DecoderLM/layers_*/block/attention" in text


@pytest.mark.slow  # a TPU compile of two slices (make test-slow)
def test_tiny_on_two_tpu_slices_is_data_parallel_across_them():
  """Multi-slice: tpu-v5e-8x2 is two 8-chip slices (libtpu's num_slices), data=2 over the
  data-center network, fsdp=8 within a slice; the gradient all-reduce crosses slices."""
  entry = meshes.lookup("tpu-v5e-8x2")
  assert (entry.num_devices, entry.num_slices, entry.num_hosts) == (16, 2, 2)
  cfg = configs.tiny.get_config()
  cfg.data.batch_size = 16  # one sequence per chip
  p = plan.plan(_run(cfg), entry, config_name="configs/tiny.py", with_eval=False)
  assert p.devices == 16 and p.axes == {"data": 2, "stage": 1, "fsdp": 8, "expert": 1, "context": 1,
                                                 "model": 1}
  assert p.train.collectives.cross_host_bytes > 0
  assert "between hosts (or TPU slices)" in plan_report.text(p)
  hw = entry.hardware
  e = p.estimate
  c = p.train.collectives
  assert e.collective_s == pytest.approx((c.total_bytes - c.cross_host_bytes) / hw.link_bandwidth
                                         + c.cross_host_bytes / hw.host_bandwidth)


@pytest.mark.slow  # the Pallas kernel compiled for TPU (make test-slow)
def test_tiny_with_splash_attention_compiles_the_pallas_kernel_for_tpu(monkeypatch):
  """attention.implementation=splash on tpu-v5e-4: the TPU compiler takes the Pallas kernel
  (a tpu_custom_call in the compiled step, not interpret mode's loops)."""
  texts = []
  count = hlo_collectives.collectives
  monkeypatch.setattr(hlo_collectives, "collectives",
                      lambda text, *a, **k: texts.append(text) or count(text, *a, **k))
  cfg = configs.tiny.get_config()
  cfg.model.block.attention.implementation = "splash"
  p = plan.plan(_run(cfg), meshes.lookup("tpu-v5e-4"), config_name="configs/tiny.py",
                with_eval=False)
  assert p.compiler == "TPU compiler (libtpu)" and p.axes == {
      "data": 1, "stage": 1, "fsdp": 4, "expert": 1, "context": 1, "model": 1}
  assert len(texts) == 1 and "tpu_custom_call" in texts[0]


def test_multi_slice_needs_a_dcn_figure(capsys):
  code, out = _main(capsys, "--config=configs/tiny.py", "--mesh=tpu-v4-8x2")
  assert code == 2 and out.err.count("\n") == 1
  assert "no data-center network figure" in out.err


# --- bad input: one line, exit 2 ----------------------------------------------------------

def _main(capsys, *args):
  code = main_lib.main(["axtrain", "plan", *args])
  return code, capsys.readouterr()


def test_unknown_mesh_suggests(capsys):
  code, out = _main(capsys, "--config=configs/tiny.py", "--mesh=tpu-v5e-17")
  assert code == 2
  assert out.err.count("\n") == 1 and "unknown mesh (did you mean 'tpu-v5e-" in out.err


def test_a_mistyped_flag_is_reported_before_a_bad_mesh(capsys):
  """The first mistake on the line, not the mesh: a flag typo is named (with its did-you-mean)
  even where --mesh is wrong too."""
  code, out = _main(capsys, "--config=configs/tiny.py", "--mesh=tpu-v5e-17", "--jsn")
  assert code == 2 and out.err == ("axtrain: error: unknown flag --jsn (did you mean 'json'?); "
                                   "see --help\n"), out.err


def test_ops_top_below_one_is_refused_before_compiling(capsys):
  code, out = _main(capsys, "--config=configs/tiny.py", "--mesh=tpu-v5e-4", "--ops",
                    "--ops_top=0")
  assert code == 2 and out.err == "axtrain: error: plan: --ops_top must be at least 1, got 0\n"


@pytest.mark.parametrize("margin", ["150", "-5", "1", "nan"])
def test_margin_outside_zero_to_one_is_refused_before_compiling(capsys, margin):
  code, out = _main(capsys, "--config=configs/tiny.py", "--mesh=tpu-v5e-4", f"--margin={margin}")
  assert code == 2 and out.err.startswith(f"axtrain: error: plan: --margin={float(margin):g}: "
                                          f"give the fraction of device memory to keep free, "
                                          f"from 0 up to (not including) 1"), out.err


def test_batch_that_cannot_split_over_the_devices(capsys):
  code, out = _main(capsys, "--config=configs/tiny.py", "--mesh=tpu-v5e-16")
  assert code == 2
  assert out.err.count("\n") == 1 and "data.batch_size 8" in out.err


def test_topology_libtpu_does_not_know():
  entry = dataclasses.replace(meshes.lookup("tpu-v5e-8"), topology="v9z:2x4")
  with pytest.raises(plan.ConfigError, match="libtpu cannot make topology 'v9z:2x4'"):
    plan.target_devices(entry)


def test_libtpu_missing_says_how_to_install(monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` raises ImportError
  code, out = _main(capsys, "--config=configs/tiny.py", "--mesh=tpu-v5e-8")
  assert code == 2
  assert out.err.count("\n") == 1 and "pip install 'jax[tpu]==" in out.err


# --- the shipped configs ------------------------------------------------------------------

def _llm_1b(entry_name, *, rules: bool):
  cfg = configs.llm_1b.get_config()
  if rules:
    mesh_rules.apply_rules(cfg, entry_name, set())
  return _run(cfg)


@pytest.mark.slow
def test_llm_1b_fits_tpu_v5e_16_with_its_rule_and_not_without():
  entry = meshes.lookup("tpu-v5e-16")
  fitted = plan.plan(_llm_1b(entry.name, rules=True), entry, config_name="llm_1b",
                     with_eval=False)
  assert fitted.fits and fitted.fit_source == "compiler", plan_report.text(fitted)
  # compiled for the batch a run gets: packed documents, as every corpus source yields
  assert fitted.batch_arrays == {k: str(v) for k, v in PACKED_FIELDS.items()}
  assert "batch (data synthetic, packed documents): " in plan_report.text(fitted)
  bare = _llm_1b(entry.name, rules=False)  # remat none, no accumulation, no chunking
  assert bare.model.remat == "none" and bare.trainer.grad_accum_steps == 1
  p = plan.plan(bare, entry, config_name="llm_1b", with_eval=False)
  assert not p.fits and p.headroom < 0
  assert f"short by {plan_report.gib(-p.headroom)}" in plan_report.text(p)


@pytest.mark.slow
def test_llm_70b_does_not_fit_one_gpu_host():
  result = cli("plan", "--config=configs/llm_70b.py", "--mesh=gpu-h100-8", "--noeval",
               timeout=1800)
  assert result.returncode == 0, result.stderr
  assert "does NOT fit" in result.stdout and "short by" in result.stdout


def test_sweep_candidates_put_experts_on_the_expert_axis():
  import configs.moe_tiny  # pylint: disable=import-outside-toplevel
  moe = sweep_space.candidates(_run(configs.moe_tiny.get_config()), 8)  # 8 experts, batch 16
  assert {c.axes["expert"] for c in moe} == {1, 2, 4, 8}
  assert all(math.prod(c.axes.values()) == 8 for c in moe)
  assert all(16 // c.grad_accum_steps % (c.axes["data"] * c.axes["fsdp"] * c.axes["expert"]) == 0
             for c in moe)
  assert {c.axes["expert"] for c in sweep_space.candidates(_run(configs.tiny.get_config()), 8)
          } == {1}


@pytest.mark.slow
def test_sweep_ranks_fitting_candidates():
  entry = meshes.lookup("tpu-v5e-4")
  result = plan_sweep.sweep(_run(configs.tiny.get_config()), entry, config_name="tiny", limit=3)
  assert len(result.ranked) == 3
  steps = [p.estimate.step_s for _, p in result.ranked]
  assert steps == sorted(steps)
  assert all(p.fits for _, p in result.ranked)
  assert "--config.mesh.fsdp=" in plan_sweep.sweep_text(result).splitlines()[-1]


SINGLE_HOST_TPUS = sorted(n for n, e in meshes.MESHES.items()
                          if e.topology and e.num_hosts == 1 and e.num_slices == 1)


# The quick suite compiles the chip this project measures on (v5e-1) and v4's megacore; `make
# test-slow` the other entries (about 10 s of CPU each).
QUICK_TPUS = ("tpu-v5e-1", "tpu-v4-8")


@pytest.mark.parametrize("name", [n if n in QUICK_TPUS else pytest.param(n, marks=pytest.mark.slow)
                                  for n in SINGLE_HOST_TPUS])
def test_every_single_host_tpu_entry_compiles(name):
  """libtpu makes each single-host slice with that host's chips (a 1-chip or 8-chip host is not
  its default 2x2x1) and one device per chip (v4's megacore): tiny compiles for every one."""
  entry = meshes.lookup(name)
  p = plan.plan(_run(configs.llama.get_config("size=test")), entry, config_name="test",
                with_eval=False)
  assert p.devices == entry.num_devices and p.compiler == plan.TPU_COMPILER
  assert p.train.argument > 0 and p.train.temp > 0


def test_the_compilers_log_becomes_a_note_and_the_rest_passes_through(capfd):
  """XLA logs from C++ to file descriptor 2: a recognised line becomes one plan note, any other
  line reaches stderr unchanged, and the descriptor is restored after the compile."""
  notes = []
  with compiler_output.compiler_log(notes):
    os.write(2, b"W1205 spmd_partitioner.cc:652] [SPMD] Involuntary full rematerialization. "
                b"The compiler was not able to go from sharding {devices=[8,1]} to {replicated}"
                b" ... Contact Shardy or XLA team.\n")
    os.write(2, b"E1205 something else entirely\n")
    os.write(2, b"W1206 03:08:23.664573 4754 hlo_rematerialization.cc:3231] Can't reduce memory "
                b"use below 56.71GiB (60892098988 bytes) by rematerialization; only reduced to "
                b"303.54GiB (325924685188 bytes), down from 303.67GiB (326059197844 bytes) "
                b"originally\n")
  assert len(notes) == 2 and "gathering them whole" in notes[1]
  assert notes[0] == ("the compiler could not rematerialise the step within its memory limit "
                      "(56.71GiB): it got it down to 303.54GiB")
  os.write(2, b"after\n")
  err = capfd.readouterr().err
  assert "something else entirely" in err and "after" in err and "Contact Shardy" not in err
  assert "hlo_rematerialization" not in err


# --- the memory sweep: knobs that keep the run's math, on one chip ------------------------

def _chip(hbm_bytes: int | None = None, name: str = "tpu-v5e-1") -> meshes.Entry:
  """A TPU entry, its HBM replaced by `hbm_bytes` (a smaller chip: what the plan fits against)."""
  entry = meshes.lookup(name)
  if hbm_bytes is None:
    return entry
  return dataclasses.replace(entry, hardware=dataclasses.replace(entry.hardware,
                                                                 hbm_bytes=hbm_bytes))


def _logits_heavy():
  """The `test` model with a 32768-token vocabulary and 16 sequences a step: its logits are
  most of its memory, as in the LLM configs."""
  cfg = configs.llama.get_config("size=test")
  cfg.data.batch_size = 16
  cfg.model.vocab_size = 32768
  return _run(cfg)


@pytest.mark.slow  # a dozen TPU compiles: over a minute on 2 cores
def test_memory_sweep_on_one_chip_finds_settings_that_fit_where_the_config_does_not():
  """One v5e chip with half the memory the compiled train step needs as configured: the sweep
  tries the knobs that keep the batch, and what it ranks fits by the TPU compiler's figures,
  eval step included (its plan, compiled again with the best one's flags, says so)."""
  run = _logits_heavy()
  as_given = plan.plan(run, _chip(), config_name="test", with_eval=False)
  entry = _chip(int(as_given.train.peak / 2))
  assert as_given.train.peak > entry.hardware.hbm_bytes * 0.95  # does not fit as configured
  result = plan_sweep.sweep(run, entry, config_name="test", limit=1)
  assert result.mode == "memory: one device" and result.ranked, plan_sweep.sweep_text(result)
  assert all(p.fits and p.batch == 16 and p.seq_len == run.data.seq_len
             for _, p in result.ranked)
  best = result.best
  assert best.axes is None and best.knobs and not best.recipe_changes()
  assert set(dict(best.knobs)) <= {"trainer.grad_accum_steps", "model.remat",
                                   "trainer.loss_chunk_size", "model.scan_layers",
                                   "model.block.attention.implementation", "eval.microbatch_rows"}
  text = plan_sweep.sweep_text(result)
  assert text.splitlines()[-1] == f"best: {best.flags()}"
  checked = plan.plan(best.apply(run), entry, config_name="test", with_eval=True)
  assert checked.fits and checked.eval.peak <= checked.usable, plan_report.text(checked)
  assert result.eval.fits and result.eval.rows == best.get("eval.microbatch_rows", run)


def test_a_compile_that_does_not_fit_leaves_out_what_holds_no_less():
  """What the compiled results imply: a setting no leaner on any knob than one that did not fit
  need not compile; nor one no less lean (with the same attention) than one that fit."""
  run = _run(configs.llama.get_config("size=test"))
  cand = lambda **k: sweep_space.Candidate(knobs=tuple(
      (sweep_space.ACCUM if n == "accum" else sweep_space.REMAT if n == "remat" else
       sweep_space.CHUNK, v) for n, v in k.items()))
  missed = [cand(accum=2, remat="save_attn_out")]
  assert plan_sweep.implied(cand(accum=2), missed=missed, fitted=[], run=run)
  assert plan_sweep.implied(cand(accum=1, remat="save_attn_out"), missed=missed, fitted=[],
                            run=run)
  assert not plan_sweep.implied(cand(accum=4), missed=missed, fitted=[], run=run)
  assert not plan_sweep.implied(cand(accum=2, chunk=32), missed=missed, fitted=[], run=run)
  fitted = [cand(accum=2, remat="save_attn_out")]
  assert plan_sweep.implied(cand(accum=4, remat="full"), missed=[], fitted=fitted, run=run)
  assert not plan_sweep.implied(cand(accum=4), missed=[], fitted=fitted, run=run)
  splash = cand(accum=4, remat="full").with_knob("model.block.attention.implementation", "splash")
  assert not plan_sweep.implied(splash, missed=[], fitted=fitted, run=run)  # may be faster
  # The other scan_layers is neither: the compiler's memory and estimate may differ.
  scanned = fitted[0].with_knob(sweep_space.SCAN, True)
  assert not plan_sweep.implied(scanned, missed=[], fitted=fitted, run=run)
  assert not plan_sweep.implied(scanned, missed=missed, fitted=[], run=run)
  # It compiles next after its twin fits (else last, where the budget lasts).
  order = sweep_screen.with_scan_twins(run, [fitted[0], cand(accum=4)])
  assert order[2:] == [scanned, cand(accum=4).with_knob(sweep_space.SCAN, True)]
  assert plan_sweep.twin_next(order[1:], fitted[0], run)[:2] == [scanned, cand(accum=4)]
  assert plan_sweep.twin_next(order[1:], cand(accum=8), run) == order[1:]


def test_where_no_layout_fits_the_sweep_turns_to_the_memory_knobs():
  """tpu-v5e-4 with less memory than the analytic model gives any layout of mesh axes, remat and
  accumulation: the sweep searches the memory knobs (loss chunks, splash) too."""
  run = _logits_heavy()
  entry = _chip(name="tpu-v5e-4")
  devices, _ = plan.target_devices(entry)
  layouts, _ = sweep_screen.screen(run, entry, devices, sweep_space.candidates(run, 4, entry),
                                 usable=float("inf"))
  least = min(total for _, total in layouts)
  mode, order, _ = plan_sweep.search(run, entry, devices, usable=least * 0.99)
  assert mode == "memory: no layout fits by the analytic model"
  knobs = {p for c in order for p, _ in c.knobs}
  assert {"trainer.loss_chunk_size", "model.block.attention.implementation"} <= knobs
  assert all(c.axes and math.prod(c.axes.values()) == 4 for c in order)


def test_sweep_recipe_labels_what_changes_the_training_recipe():
  """Only with --sweep_recipe: bfloat16 optimizer state and Adafactor (the learning rate and its
  schedule carried over), each setting that uses them labelled."""
  run = _run(configs.llama.get_config("size=test"))
  plain = sweep_space.memory_candidates(run, 1, _chip(), platform="tpu")
  widened = sweep_space.memory_candidates(run, 1, _chip(), platform="tpu", recipe=True)
  assert not any(c.recipe_changes() for c in plain) and len(widened) == 4 * len(plain)
  both = [c for c in widened if len(c.recipe_changes()) == 2]
  assert both and all(c.get(sweep_space.STATE_DTYPE) == "bfloat16"
                      and c.get(sweep_space.KIND) == "adafactor" for c in both)
  assert plan_sweep.label(both[0]).endswith(
      "[changes the training recipe: optimizer.state_dtype, optimizer.kind]")
  switched = both[0].apply(run).optimizer
  assert (switched.kind, switched.state_dtype) == ("adafactor", "bfloat16")
  assert (switched.learning_rate, switched.schedule) == (run.optimizer.learning_rate,
                                                        run.optimizer.schedule)


@pytest.mark.slow  # the sweep of the test model on one chip, in a process of its own
def test_sweep_through_the_cli_ends_with_the_best_flags(tmp_path):
  result = cli("plan", "--config=configs/llama.py:size=test", "--mesh=tpu-v5e-1", "--sweep",
               "--sweep_limit=1", "--noeval", "--json")
  assert result.returncode == 0, result.stderr[-2000:]
  report = json.loads(result.stdout)
  assert report["mode"] == "memory: one device" and len(report["ranked"]) == 1
  assert report["best"]["flags"] == report["ranked"][0]["flags"] and report["eval"] is None
  assert "  compiled " in result.stderr
  # Each stage and candidate is said as it starts (a sweep of a large model runs for minutes).
  said = [l for l in result.stderr.splitlines() if l.startswith("axtrain: plan: ")]
  assert said[0] == ("axtrain: plan: configs/llama.py:size=test on tpu-v5e-1: screening the "
                     "settings by the analytic model"), said
  assert said[1].startswith("axtrain: plan: sweep (memory: one device): ") and said[2].startswith(
      "axtrain: plan: compiling --config."), said


def test_a_plan_says_what_it_compiles_as_it_goes(capsys):
  """A plan prints nothing on stdout until its report; on stderr it says what compiles, as each
  compile starts and ends (llm_1b on one v5e compiled for 8 minutes in silence)."""
  code = main_lib.main(["axtrain", "plan", "--config=configs/llama.py:size=test",
                        "--mesh=tpu-v5e-1", "--noeval"])  # the eval step's compile says the same
  out, err = capsys.readouterr()
  assert code == 0 and out.startswith("plan: configs/llama.py:size=test on tpu-v5e-1"), err
  said = [l for l in err.splitlines() if l.startswith("axtrain: plan: ")]
  assert [l.split(" in ")[0] for l in said] == [
      "axtrain: plan: configs/llama.py:size=test on tpu-v5e-1: 1 device(s), TPU compiler (libtpu)",
      "axtrain: plan: compiling the train step",
      "axtrain: plan: compiled the train step"], err
  assert said[2].endswith(" s; reading its HLO (ops, collectives)"), said


@pytest.mark.parametrize("args, error", [
    (["--sweep", "--sweep_limit=0"], "plan: --sweep_limit must be at least 1, got 0"),
    (["--sweep_recipe"], "plan: --sweep_recipe widens a sweep; add --sweep"),
])
def test_sweep_flags_are_checked_before_compiling(capsys, args, error):
  code, out = _main(capsys, "--config=configs/tiny.py", "--mesh=tpu-v5e-1", *args)
  assert code == 2 and out.err == f"axtrain: error: {error}\n"


def test_temporaries_above_the_peak_say_why():
  """With the state in host memory (llm_1b on one v5e, stored report) the compiler's
  temporaries (19.5 GiB at 5b11f67) exceed the device peak (14.6 GiB): both lines say what they
  count. Without host-resident state the peak includes the temporaries: no such words."""
  from planner import plan_docs  # pylint: disable=import-outside-toplevel
  offloaded = plan_docs.report_text(plan_docs.BY_NAME["llm_1b@tpu-v5e-1"]).splitlines()
  [temps] = [l for l in offloaded if "train temporaries" in l]
  [peak] = [l for l in offloaded if "train peak" in l]
  temps_gib = re.search(r"\]\s+([\d.]+) GiB \(as the compiler counts them: host transfers' "
                        r"buffers over again, not all live at once; the peak is what device "
                        r"memory holds\)$", temps)
  peak_gib = re.search(r"\s([\d.]+) GiB \(the compiler's peak less its host-memory bytes\)$",
                       peak)
  assert temps_gib and peak_gib, (temps, peak)
  assert float(temps_gib.group(1)) > float(peak_gib.group(1))
  plain = plan_docs.report_text(plan_docs.BY_NAME["llama_125m@tpu-v5e-1"])
  assert "train temporaries" in plain and "host transfers' buffers" not in plain


def test_bytes_in_on_chip_memory_are_timed_apart_from_hbm_where_the_row_measured_them():
  """The v5e row times an op's HBM bytes at `memory` x the bandwidth and all its bytes at no
  more than `alternate_memory` x it: an op wholly on chip is no longer timed as HBM traffic, one
  wholly in HBM is timed as before. A row that does not tell the memories apart (the GPU's)
  times every byte as HBM's."""
  from planner import calibration, hlo_ops  # pylint: disable=import-outside-toplevel
  tpu, gpu = meshes.lookup("tpu-v5e-1").hardware, meshes.lookup("gpu-h100-8").hardware
  v5e, assumed = calibration.for_hardware(tpu), calibration.for_hardware(gpu)
  assert v5e.alternate_memory > v5e.memory and "measured" in v5e.alternate_source
  assert assumed.alternate_memory == 0

  def op(alt):
    return hlo_ops.Op(name="fusion.1", opcode="fusion", category="elementwise", module="",
                      primitive="mul", pass_="forward", count=1, narrow="", bytes=1e9,
                      alt_bytes=alt, flops=0.0, sent=0.0, seconds=0.0)

  hbm = 1e9 / (v5e.memory * tpu.hbm_bandwidth)
  on_chip = 1e9 / (v5e.alternate_memory * tpu.hbm_bandwidth)
  assert v5e.bytes_seconds(op(0.0), tpu.hbm_bandwidth) == pytest.approx(hbm)
  assert v5e.bytes_seconds(op(1e9), tpu.hbm_bandwidth) == pytest.approx(on_chip)
  assert v5e.bytes_seconds(op(0.25e9), tpu.hbm_bandwidth) == pytest.approx(0.75 * hbm)
  assert v5e.bytes_seconds(op(0.75e9), tpu.hbm_bandwidth) == pytest.approx(on_chip)
  assert assumed.bytes_seconds(op(1e9), gpu.hbm_bandwidth) == pytest.approx(
      1e9 / (assumed.memory * gpu.hbm_bandwidth))
