"""On a TPU chip (the `tpu` lane): the Pallas kernels (splash and pallas_hd64), native there, and
every other attention implementation against `xla`, in value and gradient, plain and packed rows, at the default matmul precision and
at `highest`, within the chip's tolerances (tests/tpu_tolerances.py).

The errors are measured by `python -m tests.tpu_tolerances` in one subprocess on the chip (this
process keeps JAX on CPU: tests/conftest.py), which compiles each case once.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import ckpt_util as cu
from tests import tpu_tolerances as tol
from tests.conftest import ROOT

pytestmark = pytest.mark.tpu


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
  done = subprocess.run([sys.executable, "-m", "tests.tpu_tolerances"], cwd=ROOT,
                        env=cu.env(tmp_path_factory.mktemp("jax_cache"), platform="tpu"),
                        capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_measured_on_the_chip_with_the_kernels_native(measured):
  assert measured["platform"] == "tpu", measured["device_kind"]
  assert measured["native"] == {"splash": True, "pallas_hd64": True}  # not interpret mode
  assert sorted(measured["errors"]) == sorted(tol.keys())


@pytest.mark.parametrize("name", sorted(tol.TOLERANCES))
def test_errors_within_the_chip_tolerance(measured, name):
  """Every error of the group `name` is within that constant; the message lists those over it
  and the group's largest (the figure to set it from, doubled)."""
  group = {k: e for k, e in measured["errors"].items() if tol.group(k) == name}
  assert group, f"no error of {name} was measured"
  over = {k: e for k, e in group.items() if e > tol.TOLERANCES[name]}
  assert not over, (f"{name}={tol.TOLERANCES[name]:.3g} (tests/tpu_tolerances.py); over it: "
                    f"{over}; largest of the group {max(group.values()):.3g} on "
                    f"{measured['device_kind']}, jax {measured['jax']}, libtpu {measured['libtpu']}")
