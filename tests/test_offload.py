"""Host offload (trainer.state_memory="host", trainer/offload.py) is placement: the same losses
as the state on the device, for every optimizer kind, and checkpoints cross between the two.

On CPU the compute dtype is float32, so offloaded and not must agree to float32 rounding
(<= 1e-6 relative over 20 steps). The pieces path (a parameter moved in rows, each piece fetched
after the one before) is exercised with smaller piece thresholds than the production 64 MiB /
1 MiB, so that the `test` model's parameters take it too. On a TPU chip (the `tpu` lane) the
same 20 steps run in bfloat16 with the state in pinned host memory.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from launcher import config_loading
from planner import plan as plan_lib, plan_docs
from tests import ckpt_util as cu
from trainer import config as config_lib, experiment as experiment_lib, meshes, offload
from trainer.optimizer import OPTIMIZERS

STEPS = 20


def _run(state_memory: str, optimizer: str, *overrides: str, steps: int = STEPS,
         nan_at: int | None = None):
  """(losses of `steps` steps, last metrics, final state) of the `test` model, 2 microbatches a
  step, with the train state in `state_memory`; step `nan_at`'s batch weighs its tokens NaN."""
  cfg = config_loading.load("configs/llama.py:size=test",
                            f"--config.trainer.state_memory={state_memory}",
                            f"--config.optimizer.kind={optimizer}",
                            "--config.trainer.grad_accum_steps=2", *overrides)
  exp = experiment_lib.build(config_lib.parse(cfg), meshes.lookup("cpu"))
  data = exp.source.train_iterator(process_index=0, process_count=1)
  losses = []
  with exp.context():
    state = exp.init()
    for step in range(1, steps + 1):
      batch = next(data)
      if step == nan_at:
        batch = dict(batch, weights=np.full_like(batch["weights"], np.nan))
      state, metrics = exp.step_fn(state, exp.global_batch(batch))
      losses.append(float(metrics["loss"]))
  return np.array(losses), metrics, state


@pytest.fixture(name="small_pieces")
def fixture_small_pieces(monkeypatch):
  """Pieces of at most 16 KB for parameters over 1 KB: the `test` model's matrices move in two
  or more pieces."""
  monkeypatch.setattr(offload, "PIECE_BYTES", 16384)
  monkeypatch.setattr(offload, "SMALL_BYTES", 1000)


# AdamW (the recipes' optimizer, pieces) and Adafactor (whole parameters) in the quick tier; the
# other kinds take the same two paths (their compiles cost ~9 s each on 2 cores): make test-slow.
QUICK_OPTIMIZERS = ("adamw", "adafactor")


@pytest.mark.parametrize("optimizer", [
    k if k in QUICK_OPTIMIZERS else pytest.param(k, marks=pytest.mark.slow)
    for k in OPTIMIZERS.kinds()])
def test_offloaded_losses_equal_the_device_run_for_every_optimizer(optimizer, small_pieces):
  """20 steps of AdamW (the recipes' optimizer), 3 of each other kind."""
  steps = STEPS if optimizer == "adamw" else 3
  want, want_metrics, _ = _run("device", optimizer, steps=steps)
  got, got_metrics, state = _run("host", optimizer, steps=steps)
  assert np.max(np.abs(got - want) / np.abs(want)) <= 1e-6, (got, want)
  for name in ("grad_norm", "param_norm", "update_norm"):
    assert float(got_metrics[name]) == pytest.approx(float(want_metrics[name]), rel=1e-5), name
  # Between steps the parameters and optimizer state stay in host memory.
  import jax  # pylint: disable=import-outside-toplevel
  kinds = {x.sharding.memory_kind for x in jax.tree.leaves((state.params, state.opt_state))}
  assert kinds == {offload.HOST_MEMORY}


def test_scanned_stack_and_skipped_steps_agree(small_pieces):
  """A scanned layer stack (its parameters stacked over `layers`) and a non-finite step skipped
  (its batch's weights NaN) move through the device alike."""
  overrides = ("--config.model.scan_layers=true", "--config.trainer.skip_nonfinite=true")
  want, _, want_state = _run("device", "adamw", *overrides, steps=6, nan_at=3)
  got, _, got_state = _run("host", "adamw", *overrides, steps=6, nan_at=3)
  np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
  assert not np.isfinite(want).all()  # the case under test happened
  import jax  # pylint: disable=import-outside-toplevel
  for a, b in zip(jax.tree.leaves(want_state.params), jax.tree.leaves(got_state.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("remat", ["offload_attn_out", "offload_dots_with_no_batch_dims"])
def test_activations_saved_to_host_give_the_same_losses(remat):
  """model.remat's offloading policies keep their activations in host memory between the
  forward and backward passes: the losses of recomputing nothing."""
  want, _, _ = _run("device", "adamw", steps=3)
  got, _, _ = _run("device", "adamw", f"--config.model.remat={remat}", steps=3)
  assert np.max(np.abs(got - want) / np.abs(want)) <= 1e-6, (got, want)


def test_pieces_cover_a_parameter_in_order():
  """Rows of an axis in two or more pieces of at most PIECE_BYTES, in order, none missing."""
  import jax  # pylint: disable=import-outside-toplevel
  x = jax.ShapeDtypeStruct((1000, 300), np.float32)  # 1.2 MB, rows on the sublanes
  pieces = offload._pieces(x, (0, 8))  # pylint: disable=protected-access
  assert pieces[0][0] == 0 and len(pieces) >= 2
  assert all(a[0] + a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
  assert all(size % 8 == 0 for _, size in pieces[:-1])
  assert pieces[-1][0] + pieces[-1][1] == 1000
  assert max(size for _, size in pieces) * 300 * 4 <= offload.PIECE_BYTES


@pytest.mark.slow
def test_checkpoints_cross_between_offloaded_and_device_runs(tmp_path, cache):
  """A run that saved with its state on the device (10 steps) extends to 20 offloaded, and one
  that saved offloaded extends on the device: the losses of extending it on the device."""
  def run(run_dir, steps: int, memory: str) -> dict[int, float]:
    result = cu.run(run_dir, cache, f"--config.trainer.max_steps={steps}",
                    f"--config.trainer.state_memory={memory}")
    assert result.returncode == 0, result.stderr[-3000:]
    return cu.losses(run_dir)

  first = tmp_path / "first"
  run(first, 10, "device")
  shutil.copytree(first, tmp_path / "device")
  want = run(tmp_path / "device", 20, "device")
  shutil.copytree(first, tmp_path / "crossed")
  got = run(tmp_path / "crossed", 20, "host")  # device checkpoint -> host memory
  assert sorted(got) == sorted(want) == list(range(1, 21))
  assert max(abs(got[s] - want[s]) / abs(want[s]) for s in want) <= 1e-6
  back = run(tmp_path / "crossed", 25, "device")  # offloaded checkpoint -> device memory
  want = run(tmp_path / "device", 25, "device")
  assert sorted(back) == sorted(want) == list(range(1, 26))
  assert max(abs(back[s] - want[s]) / abs(want[s]) for s in want) <= 1e-6


def _host_slices(hlo: str) -> list[tuple[str, str]]:
  """(shape, 'lane' or 'outer') of every slice the program copies out of host memory, by the
  axis it cuts: 'lane' when that is the array's innermost axis in its layout."""
  out = []
  for line in hlo.splitlines():
    if "dynamic-slice-start(" not in line or "S(5)" not in line:
      continue
    m = re.search(r"\(\(\w+\[([\d,]+)\]\{([\d,]+):T\([\d,]+\)S\(5\)\}", line)
    sizes = re.search(r"dynamic_slice_sizes=\{([\d,]+)\}", line)
    if m and sizes:
      shape, layout = [int(x) for x in m[1].split(",")], [int(x) for x in m[2].split(",")]
      cut = [i for i, (a, b) in enumerate(zip(shape, sizes[1].split(","))) if a != int(b)]
      out.append((m[1], "lane" if layout[0] in cut else "outer"))
  return out


@pytest.mark.slow  # 34 s on 2 cores: libtpu compiles a 2-layer 125m step
def test_the_tpu_program_fetches_pieces_along_outer_axes_only():
  """The TPU compiler (libtpu, compile-only) lays out the 125m model's offloaded state (two of
  its layers; its
  embedding, MLP and attention weights over 1 MiB each: cut in pieces); every piece the step
  copies out of host memory is cut along an outer axis. A cut along the lane (innermost) axis
  compiles, then halts the chip ('Async slices in the lane dimension must start on chunk
  boundaries', seen on the lent v5e)."""
  entry = meshes.lookup("tpu-v5e-1")
  devices, _ = plan_lib.target_devices(entry)
  cfg = config_loading.load("configs/llama.py:size=125m", "--config.trainer.state_memory=host",
                            "--config.data.batch_size=8", "--config.data.seq_len=128",
                            "--config.model.scan_layers=false", "--config.model.num_layers=2",
                            "--config.trainer.grad_accum_steps=2")
  exp = experiment_lib.build(config_lib.parse(cfg), entry, devices)
  state, batch = plan_lib.abstract_inputs(exp, exp.source.batch_size)
  with exp.context():
    hlo = exp.step_fn.lower(state, batch).compile().as_text()
  slices = _host_slices(hlo)
  assert slices and not [s for s in slices if s[1] == "lane"], slices


@pytest.mark.tpu
@pytest.mark.xfail(strict=True, reason="issue 37 item 5 on the chip: measured 6.9e-5 relative "
                   "on the lent v5e, 2026-12-06 (bound 1e-6); CPU meets it")
def test_offloaded_run_on_the_chip_follows_the_device_run(tmp_path, cache):
  """The checkpoint model's 30 steps on the chip (bfloat16 compute), state in pinned host
  memory against state in HBM: the same losses within TPU_LOSS_RTOL."""
  runs = {}
  for memory in offload.STATE_MEMORY:
    run_dir = tmp_path / memory
    result = cu.run(run_dir, cache, f"--config.trainer.state_memory={memory}", platform="tpu")
    assert result.returncode == 0, result.stderr[-3000:]
    runs[memory] = cu.losses(run_dir)
  want, got = runs["device"], runs["host"]
  worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
  print(f"largest relative loss difference over {len(want)} steps: {worst:.3g}")
  assert worst <= TPU_LOSS_RTOL


# Issue 37's bound for an offloaded run against the same run on the device (item 5). On the lent
# v5e (2026-12-06, `pytest -m tpu tests/test_offload.py`) the largest difference was 6.9e-5
# relative: the chip's update of the host-resident state does not round exactly as the device
# run's (where, is not found yet; one fp32 ulp of a master weight can flip its bfloat16 copy, and
# the runs part from there). Held at the bound, marked xfail until it is met.
TPU_LOSS_RTOL = 1e-6


@pytest.mark.parametrize("name", [r.name for r in plan_docs.OFFLOADED])
def test_the_recipes_that_need_host_memory_fit_their_chips_by_the_stored_plans(name):
  """llm_1b on one v5e chip and llm_7b on one v5e host of 8 (their mesh rules put the state in
  host memory): the TPU compiler's stored plans (tests/testdata/plans, `python -m
  planner.plan_docs NAME` compiles them again) fit the chips' HBM and the hosts' RAM."""
  plan, rule = plan_docs.load(plan_docs.BY_NAME[name])
  assert plan.train.host > 0 and plan.fit_source == "compiler", name
  assert plan.needed <= plan.usable and plan.host_needed <= plan.host_ram, name
  assert plan.fits and rule and "max_hbm_gb=20" in rule, (name, rule)
