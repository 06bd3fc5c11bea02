"""benchmarks/chip_ops.py: a chip profile joined op by op with the compiled step recovers the
rates the chip achieved, from a profile whose times were made at known rates."""

from __future__ import annotations

import types

import pytest

from benchmarks import chip_ops

# What the made-up chip achieves: FLOPs of bf16 matmuls, HBM bytes of memory-bound ops, and all
# bytes of ops the plan bounds by on-chip memory, each as a share of the datasheet figure.
MATMUL, MEMORY, ALTERNATE = 0.5, 0.6, 1.2
STEPS = 2


@pytest.fixture(scope="module")
def compiled():
  """configs/tiny.py's train step, compiled by libtpu for tpu-v5e-1 (about 10 s on 2 cores)."""
  row = {"argv": ["axtrain", "--config=configs/tiny.py", "--output_dir=/nowhere", "--overwrite"],
         "mesh": {"name": "tpu-v5e-1"}}
  return row, chip_ops.compile_row(row)[:3]


def _profile(ops, cal, hw) -> dict:
  """A row's profile (two steps) whose ops took the time of the rates above, by what the plan
  says bounds each; an op the join leaves out (an attention kernel) took a second."""
  bounds = {j.op.name: j.bound for j in chip_ops.join(ops, {o.name: 1.0 for o in ops}, cal, hw)}
  ms = {}
  for op in ops:
    bound = bounds.get(op.name)
    if bound == "flops":
      seconds = op.flops / (MATMUL * hw.peak_flops(op.narrow))
    elif bound == "hbm":
      seconds = (op.bytes - op.alt_bytes) / (MEMORY * hw.hbm_bandwidth)
    elif bound == "alternate":
      seconds = op.bytes / (ALTERNATE * hw.hbm_bandwidth)
    else:
      seconds = 1.0
    ms[op.name] = [seconds * 1e3 * STEPS, op.count * STEPS]
  return {"/device:TPU:0 | Steps": {"total_ms": 0.0, "top": [["0", 1.0, 1], ["1", 1.0, 1]]},
          "/device:TPU:0 | XLA Ops": {"total_ms": sum(v[0] for v in ms.values()), "top": [],
                                      "ops": ms}}


def test_the_join_recovers_the_rates_the_profile_was_made_at(compiled):
  row, (ops, cal, hw) = compiled
  row = {**row, "setting": "tiny", "step_time_s": 1.0, "profile": _profile(ops, cal, hw)}
  measured = chip_ops.profile_ops(row)
  assert set(measured) == {o.name for o in ops}
  joined = chip_ops.join(ops, measured, cal, hw)
  assert joined and all(j.op.category not in ("kernel", "collective") for j in joined)
  fits = chip_ops.fits(joined, hw)
  assert fits["matmul"][0] == pytest.approx(MATMUL)
  assert fits["memory"][0] == pytest.approx(MEMORY)
  assert fits["alternate_memory"][0] == pytest.approx(ALTERNATE)
  # The plan's own rates against the made-up chip's, per kind: the report says so.
  text = chip_ops.report(row, joined, measured, hw, top=3)
  assert f"achieved matmul: {MATMUL:.3f}" in text and f"achieved memory: {MEMORY:.3f}" in text


def test_the_time_weighted_share_weighs_long_matmuls_more_than_the_median():
  """Three int8 matmuls at 0.9, 0.9 and 0.6 of the int8 peak, the slow one the longest: the median
  says 0.9, the time-weighted share their FLOPs over their summed time."""
  from trainer import meshes  # pylint: disable=import-outside-toplevel
  hw = meshes.lookup("tpu-v5e-1").hardware
  peak = hw.peak_flops("int8")
  op = lambda flops: types.SimpleNamespace(flops=flops, narrow="int8", category="matmul",
                                           alt_bytes=0.0, bytes=1.0)
  made = [(1e12, 0.9), (1e12, 0.9), (6e12, 0.6)]  # (FLOPs, share of the peak)
  joined = [chip_ops.Joined(op(f), f / (share * peak), 0.0, "flops") for f, share in made]
  want = sum(f for f, _ in made) / sum(f / share for f, share in made)  # 8 / 12.22...
  assert chip_ops.fits(joined, hw)["int8 matmul"][0] == pytest.approx(0.9)
  assert chip_ops.time_weighted(joined, hw) == {"int8 matmul": pytest.approx(want)}
  assert want == pytest.approx(0.6545, abs=1e-4)


def test_rows_of_before_every_op_was_kept_are_read_from_their_longest_ops():
  """A row written before `ops` was kept names its ops by their whole HLO line, in `top`."""
  row = {"profile": {
      "/device:TPU:0 | Steps": {"total_ms": 6.0, "top": [["0", 2.0, 1], ["1", 2.0, 1],
                                                         ["2", 2.0, 1]]},
      "/device:TPU:0 | XLA Ops": {"total_ms": 6.0, "top": [
          ["%fusion.12 = bf16[8]{0} fusion(bf16[8]{0} %p), kind=kLoop", 4.5, 3],
          ["%copy-done.2 = f32[8]{0} copy-done(...)", 1.5, 3]]}}}
  assert chip_ops.profile_ops(row) == {"fusion.12": pytest.approx(1.5e-3),
                                       "copy-done.2": pytest.approx(0.5e-3)}


def test_a_profiled_op_is_kept_by_its_hlo_name():
  """benchmarks/chip.py keeps every XLA op's time under the name the compiled HLO gives it (the
  name chip_ops joins on), from the event's whole HLO line."""
  from benchmarks import chip  # pylint: disable=import-outside-toplevel
  line = ("%round-nearest-even_convert_fusion.16 = (s8[4,2048,2048]{2,1,0:T(32,128)(4,1)}) "
          "fusion(bf16[4,2048,2048]{2,1,0:T(8,128)(2,1)S(1)} %get-tuple-element.885), kind=kLoop")
  assert chip.op_name(line) == "round-nearest-even_convert_fusion.16"
  assert chip.op_name("copy-done.2") == "copy-done.2"


def test_the_attention_kernels_figures_come_from_their_calls():
  """attention: one forward call's FLOPs over its time at peak; attention_backward: a backward
  call's time over a forward call's (12 layers, each call timed alone in the profile)."""
  from planner import calibration, hlo_ops  # pylint: disable=import-outside-toplevel
  from trainer import meshes  # pylint: disable=import-outside-toplevel
  hw = meshes.lookup("tpu-v5e-1").hardware
  cal = calibration.for_hardware(hw, attention="pallas_hd64")

  def kernel(name):
    return hlo_ops.Op(name=name, opcode="custom-call", category="kernel", module="",
                      primitive="attention._attend pallas_call", pass_="forward", count=12,
                      narrow="", bytes=0.0, flops=0.0, sent=0.0, seconds=0.0)

  flops, forward_s = 25.8e9, 0.5e-3  # a call's FLOPs; a forward call's time
  ops = [kernel("flash_hd64_fwd_transposed.3"), kernel("flash_hd64_bwd_transposed.7")]
  measured = {ops[0].name: 12 * forward_s, ops[1].name: 12 * 1.5 * forward_s}
  joined = chip_ops.join(ops, measured, cal, hw, flops)
  assert [j.bound for j in joined] == ["kernel", "kernel"]
  assert joined[0].planned == pytest.approx(12 * flops / (cal.attention * hw.peak_flops()))
  fits = chip_ops.fits(joined, hw, flops)
  assert fits["attention"] == (pytest.approx(flops / (forward_s * hw.peak_flops())), 1)
  assert fits["attention_backward"] == (pytest.approx(1.5), 1)
