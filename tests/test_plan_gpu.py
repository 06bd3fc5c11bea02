"""`axtrain plan` on GPU entries: XLA's GPU compiler (the jax-cuda12 plugin's compile-only GPUs),
the target descriptions, GPU HLO's collectives, the layout sweep's candidates, bad input."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys

import pytest

import configs.llm_70b
import configs.tiny
from launcher import main as main_lib
from launcher.plan import GPU_PLUGIN_DIR
from tests.conftest import ROOT, cli, gpu_compiler_missing
from trainer import config as config_lib, experiment, meshes
from planner import gpu_targets, hlo_collectives, plan, sweep_screen, sweep_space

GPU_ENTRIES = [e for e in meshes.MESHES.values()
               if e.hardware.platform == "gpu" and e.num_devices is not None]
needs_plugin = pytest.mark.skipif(gpu_compiler_missing() is not None,
                                  reason=gpu_compiler_missing() or "")


# --- target descriptions --------------------------------------------------------------------

@pytest.mark.parametrize("entry", GPU_ENTRIES, ids=lambda e: e.name)
def test_each_gpu_row_describes_its_chip_whose_name_its_device_kind_matches(entry):
  chip, limits = gpu_targets.for_entry(entry)
  assert re.search(entry.hardware.device_kind, chip.cuda_name, re.IGNORECASE)
  text = gpu_targets.target_config(entry)
  field = lambda name: re.search(rf"\b{name}: ([\d.]+)", text)[1]
  # Memory comes from the mesh row (the datasheet figures the estimate uses), the chip from
  # its GpuChip, the limits from its compute capability.
  assert int(field("device_memory_size")) == entry.hardware.hbm_bytes
  assert int(field("memory_bandwidth")) == entry.hardware.hbm_bandwidth
  assert int(field("core_count")) == chip.sm_count
  assert int(field("fpus_per_core")) == limits.fp32_cores_per_sm
  major, minor = chip.compute_capability
  assert f"cuda_compute_capability {{ major: {major} minor: {minor} }}" in text
  assert f'device_description_str: "{chip.cuda_name}"' in text
  assert gpu_targets.topology(meshes.lookup(f"{entry.name}x4")) == (
      f"1x4x{entry.hardware.devices_per_host}")


def test_a_gpu_row_without_its_chip_or_of_an_unknown_capability_is_one_line():
  row = meshes.lookup("gpu-h100-8")
  bare = dataclasses.replace(row, hardware=dataclasses.replace(row.hardware, gpu=None))
  with pytest.raises(plan.ConfigError, match=r"--mesh=gpu-h100-8: no GPU chip description in "
                     r"its mesh row .*trainer/meshes.py:_GPU$"):
    plan.target_devices(bare)
  chip = dataclasses.replace(row.hardware.gpu, compute_capability=(6, 0))
  old = dataclasses.replace(row, hardware=dataclasses.replace(row.hardware, gpu=chip))
  with pytest.raises(plan.ConfigError, match=r"no limits for compute capability 6.0 \(known: "
                     r"7.0, 8.0, .*planner/gpu_targets.py:CAPABILITIES$"):
    plan.target_devices(old)


@needs_plugin
def test_target_versions_are_what_the_plugin_was_built_with():
  """The CUDA runtime and cuDNN versions of the target config, against the plugin's own."""
  code = ("import jax_cuda12_plugin._versions as v; "
          "print(v.cuda_runtime_build_version(), v.cudnn_build_version())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": str(GPU_PLUGIN_DIR), "JAX_PLATFORMS": "cpu"},
                       check=True).stdout.split()
  runtime, cudnn = int(out[0]), int(out[1])
  major, minor, _ = gpu_targets.CUDA_RUNTIME
  assert runtime == major * 1000 + minor * 10
  major, minor, patch = gpu_targets.CUDNN
  assert cudnn == major * 10000 + minor * 100 + patch


# --- the GPU compiler end to end ------------------------------------------------------------

@pytest.mark.slow  # 16-46 s on 2 cores (make test-slow)
@needs_plugin
def test_tiny_compiles_with_the_gpu_compiler():
  """tiny on one 8-GPU H100 host: the GPU compiler's figures, its fit, its reduce-scatters
  (the CPU stand-in all-reduced the gradients), and --ops reading the GPU HLO; nothing about
  the missing CUDA driver on stderr."""
  result = cli("plan", "--config=configs/tiny.py", "--mesh=gpu-h100-8", "--noeval", "--json",
               "--ops", timeout=900)
  assert result.returncode == 0, result.stderr
  assert "cuda drivers" not in result.stderr and "absl::InitializeLog" not in result.stderr
  report = json.loads(result.stdout)
  assert report["compiler"] == plan.GPU_COMPILER and report["fit_source"] == "compiler"
  assert report["fits"] is True and report["needed"] == report["train_peak"] > 0
  assert report["train"]["temp"] > 0 and report["analytic_total"] > 0
  kinds = report["train"]["collectives"]["bytes_by_kind"]
  assert kinds["reduce-scatter"] > 0 and kinds["all-gather"] > 0
  # fsdp=8: every step gathers each layer's weights; in bfloat16 they are half of the
  # float32 parameters; gathered at least for the forward and the backward pass.
  assert kinds["all-gather"] >= 2 * (7 / 8) * report["analytic"]["params"] / 2 * 0.9
  ops = report["ops"]["totals"]
  assert ops["matmul"]["flops"] > 0 and ops["collective"]["ops"] > 0
  # The matmuls the GPU compiler kept (its gemm fusions) hold the model's FLOPs.
  assert ops["matmul"]["flops"] == pytest.approx(report["model_flops"] / 8, rel=0.15)


@pytest.mark.slow  # 20-60 s a row on 2 cores (make test-slow)
@needs_plugin
@pytest.mark.parametrize("entry", GPU_ENTRIES, ids=lambda e: e.name)
def test_every_gpu_row_plans_a_small_config_with_the_gpu_compiler(entry):
  """A row (and its chip) that the GPU compiler accepts: LLaMA's `test` size compiles for one
  host of it, with the compiler's own figures and verdict."""
  result = cli("plan", "--config=configs/llama.py:size=test", f"--mesh={entry.name}", "--noeval",
               "--json", timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout)
  assert report["compiler"] == plan.GPU_COMPILER and report["fit_source"] == "compiler"
  assert report["fits"] is True and report["train_peak"] > 0
  assert report["devices"] == entry.num_devices


@needs_plugin
def test_a_layout_that_puts_tensor_parallelism_across_hosts_is_refused():
  """The GPU topology has hosts: model=16 over two 8-GPU hosts does not divide into them."""
  result = cli("plan", "--config=configs/tiny.py", "--mesh=gpu-h100-8x2", "--noeval",
               "--config.mesh.data=1", "--config.mesh.fsdp=1", "--config.mesh.model=16")
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
  assert "cannot be laid over 2 hosts of 8 devices" in result.stderr


@needs_plugin
def test_a_plugin_at_another_version_is_one_line(tmp_path):
  """A jax-cuda12-plugin that is not jaxlib's version: say which and how to install it."""
  (tmp_path / "jax_cuda12_plugin").mkdir()
  (tmp_path / "jax_cuda12_plugin" / "__init__.py").write_text("")
  info = tmp_path / "jax_cuda12_plugin-0.9.0.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax-cuda12-plugin\n"
                                 "Version: 0.9.0\n")
  result = cli("plan", "--config=configs/tiny.py", "--mesh=gpu-h100-8", "--noeval",
               env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
  assert "jax-cuda12-plugin 0.9.0 does not match jaxlib 0.10.2" in result.stderr
  assert "pip install 'jax-cuda12-plugin==0.10.2'" in result.stderr


def test_without_the_plugin_the_planner_says_how_to_install_it():
  if importlib.util.find_spec("jax_cuda12_plugin") is not None:
    pytest.skip("the plugin is importable in this process")
  with pytest.raises(plan.ConfigError, match=r"jax-cuda12-plugin is not installed.*"
                     r"pip install 'jax-cuda12-plugin==0.10.2'"):
    plan.target_devices(meshes.lookup("gpu-h100-8"))


def test_an_unknown_gpu_kind_suggests_a_known_one(capsys):
  code = main_lib.main(["axtrain", "plan", "--config=configs/tiny.py", "--mesh=gpu-h300-8"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1 and "did you mean 'gpu-h" in err


# --- GPU HLO -------------------------------------------------------------------------------

def test_gpu_collectives_combined_starts_and_mesh_groups_with_device_ids():
  """XLA:GPU's asynchronous collectives return (operands, results); several may be combined
  into one; replica groups may be a mesh over an iota of device ids."""
  hlo = """HloModule m

ENTRY %main (a: bf16[4,8]) -> bf16[32,8] {
  %ag = ((bf16[4,8]{1,0}, bf16[2]{0}), (bf16[32,8]{1,0}, bf16[16]{0})) all-gather-start(%a, %b), replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_0'}, dimensions={0}
  %agd = (bf16[32,8]{1,0}, bf16[16]{0}) all-gather-done(%ag)
  %rs = ((bf16[32,8]{1,0}), bf16[4,8]{1,0}) reduce-scatter-start(%c), replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_0'}, dimensions={0}, to_apply=%add
  %ar = f32[100]{0} all-reduce-start(%d), replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_2'}, to_apply=%add
}
"""
  c = hlo_collectives.collectives(hlo, 16, per_host=8)
  # Groups along axis_0 are devices 0..7 (one host); along axis_2, {i, i + 8} (two hosts).
  assert c.bytes_by_kind["all-gather"] == (32 * 8 + 16) * 2 * 7 / 8
  assert c.bytes_by_kind["reduce-scatter"] == 32 * 8 * 2 * 7 / 8
  assert c.bytes_by_kind["all-reduce"] == 2 * 100 * 4 / 2
  assert c.cross_host_bytes == c.bytes_by_kind["all-reduce"]


# --- layouts ---------------------------------------------------------------------------------

def test_sweep_candidates_keep_tensor_parallelism_inside_a_host_and_include_hsdp():
  run = config_lib.parse(configs.llm_70b.get_config())  # batch 1024
  entry = meshes.lookup("gpu-h100-8x16")
  cands = sweep_space.candidates(run, 128, entry)
  assert cands and all(8 % c.axes["model"] == 0 for c in cands)
  # HSDP: FSDP inside each host, data parallel across the 16.
  hsdp = [c for c in cands if c.axes == {"data": 16, "fsdp": 8, "expert": 1, "model": 1}]
  assert hsdp and all(sweep_space.hosts_spanned(c.axes, entry) == 1 for c in hsdp)
  assert sweep_space.hosts_spanned({"data": 1, "fsdp": 16, "model": 8}, entry) == 16
  # From one microbatch down to one sequence per batch shard (1024 / 128 = 8 accumulation
  # steps at most with 128 shards, 64 with 16).
  assert {c.grad_accum_steps for c in hsdp} == {1, 2, 4, 8}
  tp = {c.grad_accum_steps for c in cands
        if c.axes == {"data": 1, "fsdp": 16, "expert": 1, "model": 8}}
  assert tp == {1, 2, 4, 8, 16, 32, 64}
  # Every candidate keeps the global batch over its batch shards.
  assert all((1024 // c.grad_accum_steps) % (c.axes["data"] * c.axes["fsdp"]) == 0
             for c in cands)


def test_the_sweeps_order_puts_network_traffic_where_the_layout_puts_it():
  """screen_estimate (the order in which the sweep compiles) on two 8-GPU hosts: HSDP sends
  only the data-parallel gradient reduction over the network, FSDP across both hosts its
  gathers too, and those grow with the number of microbatches."""
  cfg = configs.tiny.get_config()
  cfg.data.batch_size = 64
  run = config_lib.parse(cfg)
  entry = meshes.lookup("gpu-h100-8x2")
  # Sixteen compile-only TPU devices give the mesh its shape (the order reads only that).
  devices, _ = plan.target_devices(meshes.lookup("tpu-v5e-16"))

  def estimate(data, fsdp, accum):
    cand = sweep_space.Candidate.layout({"data": data, "fsdp": fsdp, "model": 1}, remat="full",
                                       grad_accum_steps=accum)
    exp = experiment.build(cand.apply(run), entry, devices)
    return sweep_screen.screen_estimate(exp, entry, compute_bytes=2)

  hsdp, across = estimate(2, 8, 1), estimate(1, 16, 1)
  assert hsdp[1] < across[1]  # serial: the same compute, less network time
  assert estimate(1, 16, 4)[1] - across[1] > estimate(2, 8, 4)[1] - hsdp[1] > 0
