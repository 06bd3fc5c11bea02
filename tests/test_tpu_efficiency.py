"""An efficiency regression check: the bytes the TPU compiler's step of `tiny` accesses per chip.

tiny (layers unrolled) on v5e:2x2, windowed einsum off, as `benchmarks/tpu_step.py` measures
LLaMA-1B. A change that moves the figure by more than 5% fails here; when it is meant to,
record the new figures with:

    UPDATE_GOLDEN=1 python -m pytest tests/test_tpu_efficiency.py
"""

from __future__ import annotations

import json
import os

import pytest

import configs.tiny
from tests.conftest import ROOT
from trainer import config as config_lib, meshes

from planner import plan

RECORD = ROOT / "tests" / "testdata" / "tpu_efficiency" / "tiny_v5e-4.json"


@pytest.mark.slow  # TPU compiles of the recorded settings (make test-slow)
def test_tiny_step_bytes_per_chip_stay_within_5_percent_of_the_record():
  cfg = configs.tiny.get_config()
  assert not cfg.model.scan_layers  # the cost model sees every layer
  p = plan.plan(config_lib.parse(cfg), meshes.lookup("tpu-v5e-4"), config_name="tiny",
                with_eval=False, compiler_options=plan.WINDOWED_EINSUM_OFF)
  got = {"bytes_accessed_per_chip": p.train.bytes_accessed, "flops_per_chip": p.train.flops,
         "cost_model_step_s": p.train.cost_model_s, "temporaries": p.train.temp}
  if os.environ.get("UPDATE_GOLDEN"):
    RECORD.write_text(json.dumps(got, indent=1) + "\n")
  recorded = json.loads(RECORD.read_text())
  assert got["bytes_accessed_per_chip"] == pytest.approx(
      recorded["bytes_accessed_per_chip"], rel=0.05), (
      f"the tiny step now accesses {got['bytes_accessed_per_chip']:.4g} bytes per chip, "
      f"recorded {recorded['bytes_accessed_per_chip']:.4g}; if meant, rerun with "
      f"UPDATE_GOLDEN=1 (module docstring)")
  # The same compile's FLOPs: a moved byte count with unchanged FLOPs is the efficiency change.
  assert got["flops_per_chip"] == pytest.approx(recorded["flops_per_chip"], rel=0.05)
