"""The plan's host RAM verdict for a train state in host memory (planner/host_ram.py): each
phase of a run (steps, a save, a restore, a first run's steps) against the host's RAM.

The chip's figures (issue 45, the lent TPU v5e host of 40 GiB, 2026-12-07; the machine's RAM
in use) that llm_1b's stored plan (tests/testdata/plans, `python -m planner.plan_docs
llm_1b@tpu-v5e-1`) must meet within 10%; a setting whose save does not fit its host, though
its steps do, is refused; the analytic parts on a TPU topology without a compile.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import pytest

import configs.tiny
from planner import calibration, host_ram, memory_model, plan as plan_lib, plan_docs, plan_report
from trainer import checkpoint_blocks as blocks, checkpoint_bounded, config as config_lib, experiment
from trainer import meshes

GB = 1e9
# llm_1b as shipped on one v5e chip (benchmarks/whole_run.py at e2ced50, 2026-12-07; BENCHMARKS.md):
# RAM in use in the steps of a run whose programs came from the compilation cache (the resumed
# run's), at the peak of a save (the stopped run's, its record's host_ram_in_use_peak_bytes), at
# the peak of a restore (the resumed run's, read beside its compile); and in the steps of a run
# that compiled its programs itself (the stopped run's).
CHIP_GB = {"in steps": 22.11, "a save": 22.89, "a restore": 22.63, "a first run's steps": 22.71}


def _stored(name: str):
  return plan_docs.load(plan_docs.BY_NAME[name])[0]


def test_llm_1b_on_one_chip_needs_the_host_ram_measured_there():
  p = _stored("llm_1b@tpu-v5e-1")
  assert p.host_needed == pytest.approx(max(CHIP_GB.values()) * GB, rel=0.10)
  for phase, measured in CHIP_GB.items():
    assert p.host.phases()[phase] == pytest.approx(measured * GB, rel=0.10), phase
  # float32 parameters and AdamW's two moments of 1.24B parameters (and its step counters)
  assert 0 <= p.host.state - 12 * p.num_params < 2**20
  assert p.host_fits and p.fits


def test_llm_7b_on_one_v5e_host_streams_its_largest_arrays():
  """The host's 8 chips hold every shard of the scanned MLP matrices (32 layers x 4096 x 11008
  float32, 5.8 GB, FSDP-split over 4096: shards of 32 x 512 x 11008, rows of 22.5 MB). A save
  streams them a block of rows at a time, all its streamed arrays sharing a few blocks, so it
  holds at most those blocks, not the whole array Orbax would copy; a restore reads each of the
  8 shards (721 MB) a block at a time, under HOST_STATE_READ_BYTES at once for all of them."""
  p = _stored("llm_7b@tpu-v5e-8")
  assert p.host.devices == 8
  assert (checkpoint_bounded.HOST_STATE_SAVE_GB * GB <= p.host.save_batch
          <= blocks.blocks_at_once() * blocks.HOST_STATE_BLOCK_BYTES < 32 * 4096 * 11008 * 4 / 8)
  assert p.host.restore_batch == blocks.HOST_STATE_READ_BYTES
  # FSDP splits every parameter over the 8 chips but the 65 norm scales of 4096, which each
  # chip holds whole (7 copies more); 12 bytes a parameter (and the step counters).
  assert 0 <= p.host.state - 12 * (p.num_params + 7 * 65 * 4096) < 2**10
  assert p.host.ram == 8 * meshes.lookup("tpu-v5e-8").hardware.host_memory_bytes


def test_a_setting_whose_save_does_not_fit_its_host_is_refused():
  p = _stored("llm_1b@tpu-v5e-1")
  h = p.host
  ram = (h.steps + h.save) // 2  # the cached steps fit, a save does not
  short = dataclasses.replace(p, host=dataclasses.replace(h, ram=ram))
  assert h.steps < ram and not short.host_fits and not short.fits
  verdict = plan_report.host_verdict(short)
  assert "does NOT fit" in verdict and "a save" in verdict and "in steps" not in verdict
  assert "memory: fits" in plan_report.text(short)  # the device's verdict alone still fits
  roomy = dataclasses.replace(p, host=dataclasses.replace(h, ram=h.needed))
  assert roomy.fits and "does NOT fit" not in plan_report.host_verdict(roomy)


def test_a_platform_without_host_figures_counts_only_the_exact_parts():
  assert calibration.host_ram_for(meshes.lookup("gpu-h100-8").hardware) is None
  assert calibration.host_ram_for(meshes.lookup("neuron-trn1-32").hardware) is None
  assert calibration.host_ram_for(meshes.lookup("tpu-v5p-8").hardware).source.startswith("v5e's")
  p = _stored("llm_1b@tpu-v5e-1")
  h = dataclasses.replace(p.host, platform="gpu", process=0, save_over=0, restore_over=0,
                          compile_heap=0, source="")
  assert h.needed == h.state + max(h.save_batch, h.restore_batch)
  text = plan_report.text(dataclasses.replace(p, host=h))
  assert "process            not counted: unmeasured on gpu" in text
  assert f"needs {plan_report.gib(h.needed)} or more" in text


@pytest.fixture(scope="module")
def tiny_on_one_chip():
  """configs/tiny.py with its state in host memory, built for a v5e chip (nothing compiled)."""
  cfg = configs.tiny.get_config()
  cfg.trainer.state_memory = "host"
  entry = meshes.lookup("tpu-v5e-1")
  devices, _ = plan_lib.target_devices(entry)
  return experiment.build(config_lib.parse(cfg), entry, devices), entry


def test_the_host_need_counts_the_process_the_state_and_a_save(tiny_on_one_chip):
  exp, entry = tiny_on_one_chip
  abstract = nn.meta.unbox(exp.abstract_state)
  leaves = jax.tree.leaves((abstract.params, abstract.opt_state))
  state = sum(math.prod(a.shape) * a.dtype.itemsize for a in leaves)
  batch = min(state, max(int(checkpoint_bounded.HOST_STATE_SAVE_GB * GB),
                         max(math.prod(a.shape) * a.dtype.itemsize for a in leaves)))
  figures = calibration.host_ram_for(entry.hardware)
  # RAM for the steps (the process and the state, a MiB beside) but not for a save's batch
  ram = int(figures.process) + state + 2**20
  small = dataclasses.replace(entry, hardware=dataclasses.replace(
      entry.hardware, host_memory_bytes=ram))
  need = host_ram.host_need(exp, small, devices=1, step_host=state, code=0)
  # no array of tiny's is larger than a block: a save and a restore take the same batch
  assert (need.state, need.save_batch, need.restore_batch, need.ram) == (state, batch, batch, ram)
  assert need.steps <= ram < need.save and not need.fits
  assert need.save == ram - 2**20 + batch + int(figures.save_over_batch)


def test_a_save_holds_blocks_of_a_large_array_and_a_restore_reads_blocks_off_cpu():
  """configs/tiny.py with a vocabulary of 2^20 (its embedding and LM head, 0.8 GB of float32
  each): a save streams them, holding three blocks of at most 32 MiB at once (or its 0.1 GB
  batch of small arrays), not an array; a restore reads blocks of at most 64 MiB,
  fewer than 256 MiB of them at once, on a TPU host, and the whole array on CPU (Orbax's
  read there)."""
  cfg = configs.tiny.get_config()
  cfg.trainer.state_memory = "host"
  cfg.model.vocab_size = 2**20
  entry = meshes.lookup("tpu-v5e-1")
  devices, _ = plan_lib.target_devices(entry)
  exp = experiment.build(config_lib.parse(cfg), entry, devices)
  abstract = nn.meta.unbox(exp.abstract_state)
  largest = max(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(abstract.params))
  assert largest == 2**20 * cfg.model.dim * 4 > 2 * blocks.HOST_STATE_READ_BYTES
  save, restore = memory_model.checkpoint_batches(exp, 1, "tpu")
  assert (checkpoint_bounded.HOST_STATE_SAVE_GB * GB <= save
          <= blocks.blocks_at_once() * blocks.HOST_STATE_BLOCK_BYTES < largest)
  assert blocks.HOST_STATE_READ_BYTES // 2 < restore <= blocks.HOST_STATE_READ_BYTES
  assert memory_model.checkpoint_batches(exp, 1, "cpu") == (save, largest)
