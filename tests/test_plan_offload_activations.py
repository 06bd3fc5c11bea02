"""Activations saved to host memory (model.remat=offload_*): the plan counts their trips over
the host link (planner/plan.py:offloaded_activations, from the compiled program's copies to
host memory, planner/hlo_ops.py) and times them; the memory sweep tries those policies where
devices hold arrays in host memory (planner/sweep_space.py:REMAT_OFFLOAD)."""

from __future__ import annotations

import pytest

import configs.llama
from planner import hlo_ops, plan, plan_report, sweep_space
from trainer import config as config_lib, meshes


@pytest.mark.parametrize("out_type,want", [
    ("(bf16[8,2048,8,64]{3,1,2,0:T(8,128)(2,1)S(5)}, bf16[8,2048,8,64]{3,1,2,0:T(8,128)(2,1)}, "
     "u32[]{:S(2)})", "to_host"),
    ("(f32[8,256]{1,0:T(8,128)}, f32[8,256]{1,0:T(8,128)S(5)}, u32[]{:S(2)})", "to_device"),
    # TPU's vector memory (S(1)) is on the chip: no host trip
    ("(bf16[8,256,2048]{1,2,0:T(8,128)(2,1)}, bf16[8,256,2048]{1,2,0:T(8,128)(2,1)S(1)}, "
     "u32[]{:S(2)})", ""),
])
def test_a_copy_s_direction_is_read_from_its_memory_spaces(out_type, want):
  assert hlo_ops._host_direction(out_type) == want  # pylint: disable=protected-access


def _plan(remat: str, layers: int):
  cfg = configs.llama.get_config("size=test")
  cfg.model.remat, cfg.model.num_layers = remat, layers
  return plan.plan(config_lib.parse(cfg), meshes.lookup("tpu-v5e-1"), config_name="test",
                   with_eval=False)


def test_offloaded_activations_are_counted_per_layer_and_timed():
  """The test model on one v5e (TPU compiler, compile-only): saving every matmul output to host
  memory moves bytes that double with the layers; recomputing moves none."""
  one, two = (_plan("offload_dots_with_no_batch_dims", n) for n in (1, 2))
  assert one.estimate.offloaded > 0
  assert two.estimate.offloaded == pytest.approx(2 * one.estimate.offloaded, rel=0.05)
  cal = two.estimate.calibration
  # the state stays on the device: the activations are all that crosses
  assert (two.estimate.to_device, two.estimate.to_host) == (0, 0)
  assert two.estimate.transfer_s == pytest.approx(2 * two.estimate.offloaded / cal.host_to_device)
  kept = _plan("none", 2)
  assert kept.estimate.offloaded == 0 and kept.estimate.transfer_s == 0
  assert "offloaded activations" in plan_report.text(two)


def test_the_memory_sweep_tries_offloading_where_devices_hold_host_memory():
  run = config_lib.parse(configs.llama.get_config("size=test"))
  for platform, offloads in (("tpu", True), ("gpu", True), ("cpu", False)):
    remats = sweep_space.knob_values(run, platform=platform, shards=1)[sweep_space.REMAT]
    assert set(sweep_space.REMAT_OFFLOAD) <= set(remats) if offloads else not (
        set(sweep_space.REMAT_OFFLOAD) & set(remats)), (platform, remats)
