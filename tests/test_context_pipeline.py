"""Context parallelism and pipeline stages on 8 fake CPU devices: each equals one device (losses
over 6 steps of packed documents, float32 gradients), really splits the work, restores a
pipelined checkpoint into a mesh without stages and back, and refuses bad input in one line.

The 8-device work runs once, in tests/context_pipeline_worker.py (a subprocess: fake devices
must be configured before jax is imported), the CLI's bad-input runs included: about two minutes
of CPU on 2 cores, so the module is `slow` (`make test-slow`; the quick suite keeps context
parallelism's one-device equality in tests/test_attention_impls.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_sharding import REL_TOL, max_rel_diff

pytestmark = pytest.mark.slow

GRAD_TOL = 1e-5  # float32 gradients: the meshes only reorder sums
CASES = ("context=8", "fsdp=2,context=4 (chunked)", "stage=4,data=2", "stage=2,fsdp=4 (remat)")


def _worker(*args: str) -> dict:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  env.pop("XLA_FLAGS", None)
  done = subprocess.run([sys.executable, str(ROOT / "tests" / "context_pipeline_worker.py"),
                         *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout)


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> dict:
  tmp = tmp_path_factory.mktemp("context_pipeline")
  out = _worker(str(tmp))
  out["tmp"] = tmp
  return out


def test_worker_saw_eight_devices(worker):
  assert worker["device_count"] == 8


@pytest.mark.parametrize("case", CASES)
def test_losses_equal_one_device(worker, case):
  losses = worker["equality"]["losses"][case]
  assert len(losses["mesh"]) == 6
  assert losses["one"][-1] < losses["one"][0] - 0.5  # runs that train
  assert max_rel_diff(losses["mesh"], losses["one"]) <= REL_TOL


@pytest.mark.parametrize("case", [*CASES, "context=8 (dot_product)", "stage=2,context=2,fsdp=2",
                                  "stage=2,data=4 (dense, moe group)",
                                  "stage=2,data=4 (group, remainder)"])
def test_gradients_equal_one_device(worker, case):
  grads = worker["equality"]["grads"][case]
  assert grads["max_abs"] > 0.1  # gradients worth comparing
  assert grads["max_abs_diff"] <= GRAD_TOL


@pytest.mark.parametrize("case", ["stage=2,data=4 (dense, moe group)",
                                  "stage=2,data=4 (group, remainder)"])
def test_router_statistics_equal_one_device(worker, case):
  """Means over the MoE layers, the stages' and a remainder's after them each weighed once."""
  router = worker["equality"]["router"][case]
  assert router["one"] and router["mesh"].keys() == router["one"].keys()
  for name, value in router["one"].items():
    assert router["mesh"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("case", CASES)
def test_each_device_holds_a_share_of_the_activations(worker, case):
  """The compiler's temporaries per device (activations, logits) against one device's."""
  temp = worker["equality"]["temp_bytes"][case]
  assert temp["mesh"] < temp["one"] / 3, temp


def test_context_gathers_keys_and_stages_pass_activations(worker):
  temp = worker["equality"]["temp_bytes"]
  assert temp["context=8"]["all_gathers"] > 0
  assert temp["context=8"]["collective_permutes"] == 0
  for case in ("stage=4,data=2", "stage=2,fsdp=4 (remat)"):
    assert temp[case]["collective_permutes"] > 0


@pytest.mark.parametrize("case", ["stage=4,data=2", "stage=2,fsdp=4 (remat)",
                                  "stage=2,data=4 (dense, moe group)",
                                  "stage=2,data=4 (group, remainder)"])
def test_each_stage_holds_its_share_of_the_layers(worker, case):
  held = worker["equality"]["layer_bytes"][case]
  share = held["total"] / (held["stages"] * held["fsdp"])
  # Only the norm scales (a few hundred floats) are not split over fsdp.
  assert all(b == pytest.approx(share, rel=0.02) for b in held["per_device"]), held


def test_pipelined_checkpoint_restores_without_stages_and_back(worker):
  """Steps 1-2 on stage=2,fsdp=4, 3-4 restored on fsdp=8, 5-6 restored on stage=4,data=2,
  against one device's uninterrupted run (the 4-layer model of the cases above)."""
  moved, ref = worker["restore"], worker["equality"]["one"]['{"num_layers": 4}']
  assert sorted(moved, key=int) == [str(s) for s in range(1, 7)]
  assert max_rel_diff([moved[str(s)] for s in range(1, 7)], ref) <= REL_TOL


BAD = ("context does not divide length", "splash block does not fit",
       "stage without scanned layers", "stage does not divide layers",
       "microbatches do not divide the batch", "negative microbatches",
       "stage and context too many devices")


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_writes_nothing(worker, case):
  result = worker["bad"][case]
  assert result["code"] == 2, result["stderr"][-2000:]
  lines = result["stderr"].splitlines()
  assert len(lines) == 1 and lines[0].startswith("axtrain: error: "), result["stderr"][-2000:]
  assert result["message"] in lines[0]
  assert not result["left"]


def test_plan_shows_the_bubble_per_stage_memory_and_context(worker):
  """The `test` model (4 layers) on gpu-h100-8: stage=2 x context=2 x fsdp=2, 4 microbatches."""
  piped, flat = worker["plans"]["stage=2,context=2,fsdp=2"], worker["plans"]["fsdp=8"]
  assert piped["json"]["bubble"] == pytest.approx((2 - 1) / (4 + 2 - 1))
  assert flat["json"]["bubble"] == 0
  text = piped["text"]
  assert "pipeline: 2 stages, 4 microbatches (GPipe): bubble (S - 1) / (M + S - 1) = 1/5 = 20.0%" \
      in text
  assert "per stage: 2 layers on 4 devices; parameters" in text
  assert "context: each sequence over 2 devices, 16 positions each" in text
  assert "pipeline" not in flat["text"] and "context:" not in flat["text"]
  # The bubble's idle ticks are counted as executed work: (M + S - 1) / M of the stages' work.
  # The LM head stands outside the stages (the stage axes split its batch, no bubble): its
  # matmuls, 2 flops a multiply-add forward and 4 backward, over the 8 devices.
  from modules import llama  # pylint: disable=import-outside-toplevel
  size = llama.SIZES["test"]
  head = 6 * piped["json"]["batch"] * piped["json"]["seq_len"] * size.dim * size.vocab_size / 8
  assert piped["json"]["executed_flops"] == pytest.approx(
      (flat["json"]["executed_flops"] - head) * 5 / 4 + head, rel=1e-6)


def test_splash_under_context_parallelism_equals_xla():
  """Pallas interpret mode: 4 rows of 512 positions, context=2 x data=4 (a process of its own)."""
  got = _worker("--splash")
  assert got["value"] <= 1e-5 * got["value_scale"]
  assert max(got["grads"]) <= 1e-5 * got["grad_scale"]


# --- the layout and the schedule's arithmetic (in this process) ---------------------------

def test_zigzag_layout_is_a_permutation_that_balances_causal_work():
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from modules import context  # pylint: disable=import-outside-toplevel
  order = context.zigzag_order(64, 4)
  assert sorted(order.tolist()) == list(range(64))
  # Shard i holds chunks i and 7 - i of 8 chunks of 8 positions.
  assert order[:16].tolist() == [*range(0, 8), *range(56, 64)]
  # Keys visible to a shard's queries under the causal mask: the same on every shard.
  visible = [int(np.sum(order[i * 16:(i + 1) * 16] + 1)) for i in range(4)]
  assert len(set(visible)) == 1 and sum(visible) == 64 * 65 // 2
  x = jnp.arange(2 * 64).reshape(2, 64)
  np.testing.assert_array_equal(context.unzigzag(context.zigzag(x, 4), 4), x)
  with pytest.raises(Exception, match="must be a multiple of 8"):
    context.zigzag_order(60, 4)


def test_gpipe_bubble():
  from modules import pipeline  # pylint: disable=import-outside-toplevel
  assert pipeline.bubble(1, 8) == 0
  assert pipeline.bubble(4, 12) == pytest.approx(3 / 15)
  assert pipeline.bubble(2, 4) == pytest.approx(1 / 5)
