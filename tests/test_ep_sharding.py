"""Expert parallelism and vocabulary padding on 8 fake CPU devices (tests/ep_sharding_worker.py).

A MoE model on meshes with an `expert` axis (alone, with FSDP, with FSDP and tensor
parallelism) equals the one-device run in losses and gradients, really routes tokens with
all-to-alls and holds E / expert experts per device; GPT-2's 50,257 ids split over `model` once
padded; an expert axis that does not divide the experts is one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.test_sharding import REL_TOL, max_rel_diff

# One worker process compiles eleven steps on 8 fake devices: about two minutes of the suite on
# 2 cores. `make test-slow` runs it; `make test` (CI) skips it.
pytestmark = pytest.mark.slow

GRAD_TOL = 1e-5  # float32: the meshes move tokens and reorder sums, nothing else


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("ep")


@pytest.fixture(scope="module")
def worker(output_dir) -> dict:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  env.pop("XLA_FLAGS", None)
  done = subprocess.run([sys.executable, str(ROOT / "tests" / "ep_sharding_worker.py"),
                         str(output_dir)], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=900, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout)


def test_gradients_compared_with_fsdp_and_with_tensor_parallelism(worker):
  assert {m for m, r in worker["capacity"].items() if "grads" in r} == {
      "1", "fsdp=2,expert=4", "fsdp=2,expert=2,model=2", "expert=2,context=4"}


def test_worker_saw_eight_devices(worker):
  assert worker["device_count"] == 8
  assert worker["capacity"]["fsdp=2,expert=4"]["mesh"] == {
      "data": 1, "stage": 1, "fsdp": 2, "expert": 4, "context": 1, "model": 1}


def test_one_device_moe_run_learns_and_reports_router_metrics(worker):
  one = worker["capacity"]["1"]
  assert one["losses"][-1] < one["losses"][0] - 0.5
  shares = [one["metrics"][f"moe_tokens_per_expert/{e}"] for e in range(8)]
  assert sum(shares) == pytest.approx(1.0)
  assert 0 < one["metrics"]["moe_dropped_fraction"] < 1  # capacity 1.25: some tokens dropped


@pytest.mark.parametrize("mesh", ["expert=8", "fsdp=2,expert=4", "fsdp=2,expert=2,model=2",
                                  "expert=2,context=4", "stage=2,expert=2"])
def test_expert_parallel_matches_one_device(worker, mesh):
  one = worker["capacity"]["1 (no aux loss)" if mesh.startswith("stage=") else "1"]
  got = worker["capacity"][mesh]
  assert max_rel_diff(got["losses"], one["losses"]) <= REL_TOL
  if "grads" in got:  # the first batch's, where the worker compiled them (WITH_GRADS)
    for a, b in zip(got["grads"], one["grads"], strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=GRAD_TOL, atol=GRAD_TOL)
  for key, value in one["metrics"].items():
    assert got["metrics"][key] == pytest.approx(value, rel=REL_TOL, abs=1e-6), key


@pytest.mark.parametrize("mesh,experts", [("expert=8", 1), ("fsdp=2,expert=4", 2),
                                          ("fsdp=2,expert=2,model=2", 4),
                                          ("expert=2,context=4", 4)])
def test_tokens_travel_to_the_devices_that_hold_their_experts(worker, mesh, experts):
  run = worker["capacity"][mesh]
  assert run["experts_per_device"] == [experts]  # of 8: whole experts, split over `expert`
  assert run["all_to_alls"] >= 4  # there and back, forward and backward, per layer body
  assert worker["capacity"]["1"]["all_to_alls"] == 0


def test_tensor_parallel_with_gpt2_vocabulary(worker):
  g = worker["gpt2"]
  assert g["embedding_shape"][0] == 50_304  # 50,257 ids padded to 393 x 128
  assert max_rel_diff(g["fsdp=4,model=2"]["losses"], g["1"]["losses"]) <= REL_TOL
  assert "dimension 50257 is not divisible by mesh axes model=2" in g["unpadded_error"]


def test_expert_axis_that_does_not_divide_the_experts(worker, output_dir):
  bad = worker["bad_expert_axis"]
  assert bad["code"] == 2, bad["stderr"][-2000:]
  lines = bad["stderr"].splitlines()
  assert len(lines) == 1 and lines[0].startswith("axtrain: error: "), bad["stderr"][-2000:]
  assert "dimension 6 is not divisible by mesh axes expert=8" in lines[0]
  assert not (output_dir / "bad").exists()


def test_context_parallel_moe_gathers_keys_and_drops_the_tokens_one_device_drops(worker):
  """Expert and context parallel at once: keys and values gathered over `context`, tokens
  sent to their experts over `expert`, and the router's capacity queues filled in the
  original token order (the sequence arrives zig-zagged), so the same tokens are dropped."""
  one, got = worker["capacity"]["1"], worker["capacity"]["expert=2,context=4"]
  assert got["mesh"]["context"] == 4 and got["mesh"]["expert"] == 2
  assert got["all_gathers"] > 0 and got["all_to_alls"] >= 4
  assert 0 < one["metrics"]["moe_dropped_fraction"]
  assert got["metrics"]["moe_dropped_fraction"] == pytest.approx(
      one["metrics"]["moe_dropped_fraction"], rel=REL_TOL)
