"""Host offload (trainer.state_memory="host", trainer/offload.py) is placement: the same losses
as the state on the device, for every optimizer kind, and checkpoints cross between the two.

On CPU (float32) an offloaded run is the device run bit for bit where each parameter is updated
whole (every parameter of the `test` model at the production thresholds): AdamW, Lion, SGD and
Adafactor; Muon within float32 rounding (docs/offload.md). A parameter updated in pieces (rows
moved one piece at a time; exercised with smaller thresholds than the production 64 MiB / 1 MiB,
so that the `test` model's parameters take that path) differs first by one rounding of a
multiply-add: XLA's CPU code fuses a product into the add (an FMA) by the fusion it is in, and a
piece's fusion is not the whole parameter's. On a TPU chip (the `tpu` lane) the runs are bfloat16
with the state in pinned host memory.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from launcher import config_loading
from planner import plan as plan_lib, plan_docs
from tests import ckpt_util as cu
from tests.conftest import ROOT
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
  monkeypatch.setattr(offload, "WHOLE_BYTES", 1000)


def _leaves(tree) -> list[np.ndarray]:
  import jax  # pylint: disable=import-outside-toplevel
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


# AdamW (the recipes' optimizer) and Adafactor in the quick tier; the other kinds' compiles cost
# ~9 s each on 2 cores: make test-slow. Muon's Adam part is optax's own adamw, which divides by
# its bias corrections: XLA rounds that by how many parameters share them (docs/offload.md).
QUICK_OPTIMIZERS = ("adamw", "adafactor")
NOT_BITWISE = {"muon": 1e-6}


@pytest.mark.parametrize("optimizer", [
    k if k in QUICK_OPTIMIZERS else pytest.param(k, marks=pytest.mark.slow)
    for k in OPTIMIZERS.kinds()])
def test_offloaded_runs_are_the_device_runs_bit_for_bit(optimizer):
  """20 steps of AdamW (the recipes' optimizer), 3 of each other kind, every parameter updated
  whole: the same losses, gradient norms and final state, bit for bit."""
  steps = STEPS if optimizer == "adamw" else 3
  want, want_metrics, want_state = _run("device", optimizer, steps=steps)
  want_leaves = _leaves((want_state.params, want_state.opt_state))  # before the next run
  got, got_metrics, state = _run("host", optimizer, steps=steps)
  if optimizer in NOT_BITWISE:
    assert np.max(np.abs(got - want) / np.abs(want)) <= NOT_BITWISE[optimizer], (got, want)
  else:
    np.testing.assert_array_equal(got, want)
    assert float(got_metrics["grad_norm"]) == float(want_metrics["grad_norm"])
    for a, b in zip(want_leaves, _leaves((state.params, state.opt_state))):
      np.testing.assert_array_equal(b, a)
  # Sums of squares over the parameters in another order.
  for name in ("param_norm", "update_norm"):
    assert float(got_metrics[name]) == pytest.approx(float(want_metrics[name]), rel=1e-5), name
  # Between steps the parameters and optimizer state stay in host memory.
  import jax  # pylint: disable=import-outside-toplevel
  kinds = {x.sharding.memory_kind for x in jax.tree.leaves((state.params, state.opt_state))}
  assert kinds == {offload.HOST_MEMORY}


def _two_adamw_updates():
  """([state after update 1, after update 2] of the device update, the same of the streamed
  update of host-resident state, the optimizer's config, the learning rate of update 2) for the
  `test` model's parameters and two made-up gradients large enough to be clipped. The
  optimizer alone is compiled: a few seconds."""
  import jax  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  exps = {memory: experiment_lib.build(config_lib.parse(config_loading.load(
      "configs/llama.py:size=test", f"--config.trainer.state_memory={memory}")),
      meshes.lookup("cpu")) for memory in offload.STATE_MEMORY}
  exp, opt = exps["host"], exps["host"].optimizer
  host = exp.state_shardings
  with exp.context():
    state = exps["device"].init()
    keys = iter(jax.random.split(jax.random.key(1), 1000))
    grads = [jax.tree.map(lambda p: 0.01 * jax.random.normal(next(keys), p.shape), state.params)
             for _ in range(2)]

    def on_device(g, params, opt_state):
      updates, opt_state = opt.tx.update(g, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    def streamed(g, params, opt_state):
      return offload.streamed_update(opt, exp.axes, g, params, opt_state)[:2]

    runs = {"device": (jax.jit(on_device), (state.params, state.opt_state)),
            "host": (jax.jit(streamed, in_shardings=(None, host.params, host.opt_state),
                             out_shardings=(host.params, host.opt_state)),
                     jax.device_put((state.params, state.opt_state),
                                    (host.params, host.opt_state)))}
    out = {}
    for memory, (fn, carry) in runs.items():
      out[memory] = []
      for g in grads:
        carry = fn(g, *carry)
        out[memory].append(jax.tree.map(np.asarray, carry))
  return out["device"], out["host"], exp.run.optimizer, float(opt.schedule(1))


def test_a_parameter_in_pieces_differs_first_by_one_rounding_of_a_multiply_add(small_pieces):
  """The streamed update of parameters in pieces against the device update, from the same state:
  the first update is the same bit for bit (its moments start at 0 and its learning rate is 0);
  the second, the first that can differ, differs at most by one float32 rounding in a
  multiply-add of each moment (an FMA or not), carried into the parameter through the Adam
  direction: nowhere near what a wrong piece, dtype or order would make (2^-8 for bfloat16)."""
  want, got, cfg, lr = _two_adamw_updates()
  for a, b in zip(_leaves(want[0]), _leaves(got[0])):
    np.testing.assert_array_equal(b, a)
  (p1, s1), (p2, s2), (q2, t2) = want[0], want[1], got[1]
  adam1, adam2, adam_got = s1[1], s2[1], t2[1]
  assert int(adam_got.count) == int(adam2.count) == 2
  ulp = 2.0 ** -23  # float32: 1 ulp of x is at most ulp * |x|
  c1, c2 = 1 / (1 - cfg.b1 ** 2), 1 / (1 - cfg.b2 ** 2)
  import jax  # pylint: disable=import-outside-toplevel
  for path, mu2 in jax.tree_util.tree_flatten_with_path(adam2.mu)[0]:
    name = jax.tree_util.keystr(path)
    get = lambda tree, path=path: np.asarray(functools.reduce(lambda t, k: t[k.key], path, tree),
                                              np.float64)
    mu1, nu1, nu2, pp1, pp2 = (get(adam1.mu), get(adam1.nu), get(adam2.nu), get(p1), get(p2))
    mu2 = np.asarray(mu2, np.float64)
    mu_bound = ulp * (np.abs(mu2) + 2 * cfg.b1 * np.abs(mu1))
    nu_bound = ulp * (np.abs(nu2) + 2 * cfg.b2 * np.abs(nu1))
    direction = mu2 * c1 / (np.sqrt(nu2 * c2) + cfg.eps)
    p_bound = lr * (c1 * mu_bound / (np.sqrt(nu2 * c2) + cfg.eps)
                    + 2 * ulp * (np.abs(direction) + cfg.weight_decay * np.abs(pp1))) \
        + 2 * ulp * np.abs(pp2)
    for what, a, b, bound in (("mu", mu2, get(adam_got.mu), mu_bound),
                              ("nu", nu2, get(adam_got.nu), nu_bound),
                              ("param", pp2, get(q2), p_bound)):
      excess = np.abs(b - a) - bound
      assert excess.max() <= 0, (what, name, float(excess.max()))


def _pieces_without_fma():
  """Run in a process whose XLA emits no FMA instructions (tests below): the streamed update of
  parameters in pieces is the device update bit for bit."""
  # as small_pieces
  offload.PIECE_BYTES, offload.SMALL_BYTES, offload.WHOLE_BYTES = 16384, 1000, 1000
  want, got, _, _ = _two_adamw_updates()
  for a, b in zip(_leaves(want), _leaves(got)):
    np.testing.assert_array_equal(b, a)


@pytest.mark.slow  # 19 s on 2 cores: a process of its own (XLA's flags are set at its start)
def test_without_fma_a_parameter_in_pieces_is_updated_bit_for_bit():
  """The cause of the difference above: the same two updates in a process whose XLA emits no FMA
  (--xla_cpu_max_isa=AVX: AVX2 brings FMA) are the same bit for bit."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_max_isa=AVX",
             PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
  result = subprocess.run(
      [sys.executable, "-c", "from tests import test_offload; test_offload._pieces_without_fma()"],
      env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]


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


def test_pieces_cover_a_parameter_in_order(monkeypatch):
  """A parameter of at most WHOLE_BYTES is one piece (each piece is instructions of the compiled
  step, which a cache entry loads one by one); a larger one rows of an axis in two or more
  pieces of at most PIECE_BYTES, in order, none missing."""
  import jax  # pylint: disable=import-outside-toplevel
  x = jax.ShapeDtypeStruct((1000, 300), np.float32)  # 1.2 MB, rows on the sublanes
  assert offload._pieces(x, (0, 8)) == [(0, 1000)]  # pylint: disable=protected-access
  monkeypatch.setattr(offload, "WHOLE_BYTES", 1_000_000)
  monkeypatch.setattr(offload, "PIECE_BYTES", 300_000)  # 250 rows; 248, a multiple of 8
  pieces = offload._pieces(x, (0, 8))  # pylint: disable=protected-access
  assert pieces[0][0] == 0 and len(pieces) == 5  # 4 x 248 rows and the last 8
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


def _computations(hlo: str, *, layouts: bool) -> collections.Counter:
  """The computations of a compiled program but its entry, each as its sorted instructions
  without names, metadata, tiling, memory spaces and (unless `layouts`) layouts: what each
  computes, and (with `layouts`) in what order its reductions add."""
  out = collections.Counter()
  for body in re.findall(r"\n%(?!main)[\w.\-]+ \([^\n]*\{\n(.*?)\n\}", hlo, re.S):
    lines = []
    for line in body.splitlines():
      line = re.sub(r", (sharding|metadata|backend_config|frontend_attributes)=.*", "", line)
      line = re.sub(r":T\([^)]*\)(\([^)]*\))?|S\(\d\)", "", line)
      line = re.sub(r"\{[\d,]*\}", "{}", line) if not layouts else line
      lines.append(re.sub(r"%[\w.\-]+|param_[\d.]+", "%", line.strip()))
    out["\n".join(sorted(lines))] += 1
  return out


def _tpu_programs(*overrides: str) -> dict[str, str]:
  """The checkpoint model's compiled step for one v5e chip (libtpu, compile-only), per
  state_memory."""
  entry = meshes.lookup("tpu-v5e-1")
  devices, _ = plan_lib.target_devices(entry)
  out = {}
  for memory in offload.STATE_MEMORY:
    cfg = config_loading.load(cu.CONFIG, f"--config.trainer.state_memory={memory}", *overrides)
    exp = experiment_lib.build(config_lib.parse(cfg), entry, devices)
    state, batch = plan_lib.abstract_inputs(exp, exp.source.batch_size)
    with exp.context():
      out[memory] = exp.step_fn.lower(state, batch).compile().as_text()
  return out


@pytest.mark.slow  # 35 s on 2 cores: libtpu compiles four steps
def test_the_tpu_compiler_gives_both_placements_the_same_arithmetic():
  """What the chip equality below rests on. With the model 128 wide, the TPU programs of the two
  placements hold the same computations in the same layouts. As shipped (64 wide), the same
  computations; the embedding table's arrays (256 x 64) alone are laid out otherwise: its rows
  minor where it lives in HBM, as the gradient comes where it is streamed from host memory. Its
  elementwise update is the same either way; the sum of squares of its gradient, a term of the
  global norm that scales every gradient (clip_norm), adds in another order."""
  wide = _tpu_programs("--config.model.dim=128")
  assert (_computations(wide["device"], layouts=True)
          == _computations(wide["host"], layouts=True))
  shipped = _tpu_programs()
  assert (_computations(shipped["device"], layouts=False)
          == _computations(shipped["host"], layouts=False))
  device, host = (_computations(shipped[m], layouts=True) for m in offload.STATE_MEMORY)
  differ = list((device - host) + (host - device))
  assert differ and all("[256,64]" in c for c in differ), differ
  assert any("reduce(" in c for c in differ)


def _chip_records(tmp_path, cache, *overrides: str) -> dict[str, dict[int, dict]]:
  """{state_memory: {step: record}} of the checkpoint model's 30 steps on the chip (bfloat16
  compute), the state in HBM and in pinned host memory."""
  out = {}
  for memory in offload.STATE_MEMORY:
    run_dir = tmp_path / "-".join([memory, *overrides]).replace("/", "_")
    result = cu.run(run_dir, cache, f"--config.trainer.state_memory={memory}", *overrides,
                    platform="tpu")
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out[memory] = {r["step"]: r for r in records if "loss" in r}
  assert sorted(out["device"]) == sorted(out["host"]) == list(range(1, 31))
  return out


@pytest.mark.tpu
def test_offloaded_run_on_the_chip_is_the_device_run(tmp_path, cache):
  """With the model 128 wide (the same layouts in both placements, the test above), the 30 steps
  on the chip with the state in pinned host memory are those with the state in HBM, bit for bit:
  losses and gradient norms. Passed on the lent v5e (2026-12-06, main f9cb278)."""
  runs = _chip_records(tmp_path, cache, "--config.model.dim=128")
  for step, want in runs["device"].items():
    got = runs["host"][step]
    assert (got["loss"], got["grad_norm"]) == (want["loss"], want["grad_norm"]), step


@pytest.mark.tpu
def test_on_the_chip_a_64_wide_model_parts_at_the_gradient_norm(tmp_path, cache):
  """The checkpoint model as shipped: step 1's loss (before any update) is the same; its gradient
  norm differs at float32 rounding (the embedding's term adds in another order, the test above);
  every step clips (norms 1-4 against clip_norm 1), so every gradient is scaled by a factor a
  rounding apart, and the bfloat16 casts of the weights carry it on. On the lent v5e
  (2026-12-06, main f9cb278): step 1's gradient norms 6.5e-8 apart (relative), the losses at most
  1.17e-4 by step 30 (6.9e-5 that morning, before AdamW's bias corrections became factors);
  without the clip the 30 steps were the same bit for bit (passed)."""
  runs = _chip_records(tmp_path, cache)
  want, got = runs["device"], runs["host"]
  assert got[1]["loss"] == want[1]["loss"]
  first = abs(got[1]["grad_norm"] - want[1]["grad_norm"]) / want[1]["grad_norm"]
  worst = max(abs(got[s]["loss"] - want[s]["loss"]) / abs(want[s]["loss"]) for s in want)
  print(f"step 1 gradient norm: {first:.3g} relative; largest loss difference: {worst:.3g}")
  assert first <= 2.0 ** -21  # 4 float32 ulps
  unclipped = _chip_records(tmp_path, cache, "--config.optimizer.clip_norm=None")
  for step, record in unclipped["device"].items():
    assert unclipped["host"][step]["loss"] == record["loss"], step


@pytest.mark.parametrize("name", [r.name for r in plan_docs.OFFLOADED])
def test_the_recipes_that_need_host_memory_fit_their_chips_by_the_stored_plans(name):
  """llm_1b on one v5e chip and llm_7b on one v5e host of 8 (their mesh rules put the state in
  host memory): the TPU compiler's stored plans (tests/testdata/plans, `python -m
  planner.plan_docs NAME` compiles them again) fit the chips' HBM and the hosts' RAM."""
  plan, rule = plan_docs.load(plan_docs.BY_NAME[name])
  assert plan.train.host > 0 and plan.fit_source == "compiler", name
  assert plan.needed <= plan.usable and plan.host_needed <= plan.host_ram, name
  assert plan.fits and rule and "max_hbm_gb=20" in rule, (name, rule)


@pytest.mark.parametrize("given,want", [("offload_dots", "offload_dots_with_no_batch_dims"),
                                        ("offload_attn", "offload_attn_out"),
                                        ("ful", "full")])
def test_a_remat_policy_cut_short_or_misspelt_is_named(given, want):
  """One line naming the policy meant: the one a name cut short starts (difflib alone took
  'offload_dots' for 'offload_attn_out'), else the closest spelling."""
  from core.registry import ConfigError  # pylint: disable=import-outside-toplevel
  from modules import llama  # pylint: disable=import-outside-toplevel
  from modules.decoder import MODELS  # pylint: disable=import-outside-toplevel
  node = llama.model_node("test")
  node.remat = given
  with pytest.raises(ConfigError, match=f"unknown policy '{given}' \\(did you mean '{want}'\\?\\)"):
    MODELS.parse(node, "model").check()
