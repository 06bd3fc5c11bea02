"""The mesh registry, mesh selection and mesh rules; mesh mistakes through the CLI."""

from __future__ import annotations

import dataclasses
import math
import types

import pytest

from configs import tiny
from core.registry import ConfigError
from tests.conftest import ROOT, cli_batch
from trainer import mesh_rules, meshes, sharding
from planner import registry_docs
from trainer.config import MeshConfig


# --- registry ----------------------------------------------------------------------------

def test_issue_names_exist():
  for name in ("cpu", "gpu-a100-8", "gpu-h100-8", "gpu-h200-8", "gpu-b200-8", "tpu-v4-8",
               "tpu-v5e-8", "tpu-v5p-8", "tpu-v6e-8", "neuron-trn1-32", "neuron-trn2-64"):
    assert meshes.lookup(name).name == name


@pytest.mark.parametrize("name,devices,hosts", [
    ("tpu-v4-8", 4, 1),  # v4 names count TensorCores; one jax device per 2-core chip
    ("tpu-v4-32", 16, 4),
    ("tpu-v5p-128", 64, 16),
    ("tpu-v5e-8", 8, 1),  # v5e / v6e names count chips; 8 on one host
    ("tpu-v5e-16", 16, 4),  # larger slices are 4-chip hosts
    ("tpu-v6e-256", 256, 64),
    ("gpu-h100-8", 8, 1),
    ("neuron-trn1-32", 32, 1),
])
def test_devices_and_hosts(name, devices, hosts):
  entry = meshes.lookup(name)
  assert (entry.num_devices, entry.num_hosts) == (devices, hosts)


def test_host_suffix_puts_data_across_hosts():
  entry = meshes.lookup("gpu-h100-8x4")
  assert entry.name == "gpu-h100-8x4"
  assert (entry.num_devices, entry.num_hosts) == (32, 4)
  assert dict(entry.axes) == {"data": 4, "fsdp": -1, "model": 1}
  assert sharding.resolve_axes(entry, MeshConfig(), 32) == {
      "data": 4, "stage": 1, "fsdp": 8, "expert": 1, "context": 1, "model": 1}


@pytest.mark.parametrize("name,message", [
    ("gpu-h100", "did you mean 'gpu-h100-8'"),
    ("tpu-v4-8x2", "no data-center network figure"),  # no multislice without a DCN figure
    ("tpu-v5e-8x0", "slice count must be at least 1"),
    ("gpu-h100-8x0", "at least 1"),
])
def test_lookup_errors(name, message):
  with pytest.raises(ConfigError, match=message):
    meshes.lookup(name)


@pytest.mark.parametrize("platform,kind,count,processes,name", [
    ("cpu", "cpu", 8, 1, "cpu"),
    ("gpu", "NVIDIA H100 80GB HBM3", 8, 1, "gpu-h100-8"),
    ("gpu", "NVIDIA H100 80GB HBM3", 16, 2, "gpu-h100-8x2"),
    ("gpu", "NVIDIA H200", 8, 1, "gpu-h200-8"),
    ("gpu", "NVIDIA GH200 480GB", 1, 1, "gpu"),  # Grace Hopper is not an H200 host
    ("tpu", "TPU v5 lite", 8, 1, "tpu-v5e-8"),
    ("tpu", "TPU v4", 16, 4, "tpu-v4-32"),
    ("tpu", "TPU v5", 4, 1, "tpu-v5p-8"),
])
def test_auto(platform, kind, count, processes, name):
  assert meshes.auto(platform, kind, count, processes).name == name


def test_auto_partial_host_keeps_the_hardware_facts():
  entry = meshes.auto("gpu", "NVIDIA H100 80GB HBM3", 4, 1)
  assert entry.name == "gpu" and entry.num_devices is None
  assert entry.hardware.hbm_bytes == meshes.lookup("gpu-h100-8").hardware.hbm_bytes


# The device kind JAX reports for each family's chips (a GPU row's is its chip's CUDA name).
DEVICE_KINDS = {"tpu-v4": "TPU v4", "tpu-v5e": "TPU v5 lite", "tpu-v5p": "TPU v5",
                "tpu-v6e": "TPU v6 lite", "neuron-trn1": "NC_v2", "neuron-trn2": "NC_v3"}


def _device_kind(entry) -> str:
  if entry.hardware.gpu is not None:
    return entry.hardware.gpu.cuda_name
  return DEVICE_KINDS[entry.name.rsplit("-", 1)[0]]


@pytest.mark.parametrize("entry", [e for e in meshes.MESHES.values() if e.num_devices],
                         ids=lambda e: e.name)
def test_auto_finds_each_entry_on_its_own_devices(entry):
  """No two entries claim the same devices: --mesh=auto on an entry's devices (one process per
  host) is that entry, and on twice as many GPU or Trainium hosts that entry x 2."""
  kind = _device_kind(entry)
  hw = entry.hardware
  assert meshes.auto(hw.platform, kind, entry.num_devices, entry.num_hosts) == entry
  if hw.platform in meshes.MULTI_HOST_PLATFORMS:
    assert meshes.auto(hw.platform, kind, 2 * entry.num_devices, 2).name == f"{entry.name}x2"


def test_auto_finds_the_lent_tpu_chip():
  """The one TPU v5e chip this project borrows, by the device kind it reported
  (tests/testdata/tpu_tolerances_v5e.json, written there): tpu-v5e-1."""
  import json  # pylint: disable=import-outside-toplevel
  seen = json.loads((ROOT / "tests" / "testdata" / "tpu_tolerances_v5e.json").read_text())
  assert seen["device_kind"] == "TPU v5 lite"
  assert meshes.auto(seen["platform"], seen["device_kind"], 1, 1).name == "tpu-v5e-1"


def _twins(monkeypatch):
  """Two GPU rows of one made-up GPU (SXM and NVL parts), the first one's regex matching the
  second one's devices too."""
  h100 = meshes.MESHES["gpu-h100-8"].hardware
  for name, kind, bandwidth in (("gpu-x100-8", r"\bX100", 3350),
                                ("gpu-x100-nvl-8", r"X100 NVL", 3900)):
    monkeypatch.setitem(meshes.MESHES, name, meshes.Entry(name=name, hardware=dataclasses.replace(
        h100, device_kind=kind, hbm_bandwidth=bandwidth * meshes.GBps)))


def test_auto_refuses_two_entries_that_match_the_devices(monkeypatch):
  _twins(monkeypatch)
  for count, processes, names in ((8, 1, "gpu-x100-8 and gpu-x100-nvl-8"),
                                  (16, 2, "gpu-x100-8x2 and gpu-x100-nvl-8x2")):
    with pytest.raises(ConfigError, match=rf"--mesh=auto: {count} gpu device\(s\) of kind 'NVIDIA "
                       rf"X100 NVL' match 2 mesh entries, {names}; pick one with --mesh=NAME"):
      meshes.auto("gpu", "NVIDIA X100 NVL", count, processes)
  # The other part still matches one entry.
  assert meshes.auto("gpu", "NVIDIA X100 SXM", 8, 1).name == "gpu-x100-8"


def test_auto_refuses_a_partial_host_of_two_kinds_of_hardware(monkeypatch):
  _twins(monkeypatch)
  with pytest.raises(ConfigError, match=r"4 gpu device\(s\) of kind 'NVIDIA X100 NVL' match "
                     r"the hardware of gpu-x100-8 and gpu-x100-nvl-8, which differ.*--mesh=gpu "):
    meshes.auto("gpu", "NVIDIA X100 NVL", 4, 1)
  # Entries of one chip in several host sizes are one kind of hardware (a v5e chip).
  assert meshes.auto("tpu", "TPU v5 lite", 2, 1).hardware.hbm_bytes == 16 * meshes.GiB


def test_an_ambiguous_auto_mesh_is_one_line_through_the_cli(monkeypatch, capsys):
  """Two entries of this process's one CPU device: `axtrain` stops before anything is
  written, naming both and --mesh=NAME."""
  from launcher import main as main_lib  # pylint: disable=import-outside-toplevel
  cpu = meshes.MESHES["cpu"].hardware
  for name in ("cpu-box-1", "cpu-laptop-1"):
    monkeypatch.setitem(meshes.MESHES, name, meshes.Entry(
        name=name, hardware=dataclasses.replace(cpu, devices_per_host=1)))
  code = main_lib.main(["axtrain", "--config=configs/tiny.py", "--print_config"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert err == ("axtrain: error: --mesh=auto: 1 cpu device(s) of kind 'cpu' match 2 mesh "
                 "entries, cpu-box-1 and cpu-laptop-1; pick one with --mesh=NAME (e.g. "
                 "--mesh=cpu-box-1)\n")


def test_auto_unknown_platform():
  with pytest.raises(ConfigError, match="no mesh for platform 'metal'"):
    meshes.auto("metal", "Apple M3", 1, 1)


def test_named_mesh_must_fit_the_devices():
  meshes.check_devices(meshes.lookup("gpu-h100-8"), 8)
  meshes.check_devices(meshes.lookup("cpu"), 3)
  with pytest.raises(ConfigError, match="is 8 devices .* JAX sees 4"):
    meshes.check_devices(meshes.lookup("gpu-h100-8"), 4)


def test_docs_table_is_generated_from_the_registry():
  text = (ROOT / "docs" / "meshes.md").read_text()
  assert registry_docs.render(text) == text, (
      "docs/meshes.md is stale: run python -m planner.registry_docs")
  for name in meshes.MESHES:
    assert f"| `{name}` |" in text


# --- axis sizes and device layout --------------------------------------------------------

def test_resolve_axes_fill_and_overrides():
  cpu = meshes.lookup("cpu")
  assert sharding.resolve_axes(cpu, MeshConfig(), 8) == {
      "data": 8, "stage": 1, "fsdp": 1, "expert": 1, "context": 1, "model": 1}
  assert sharding.resolve_axes(cpu, MeshConfig(model=2), 8) == {
      "data": 4, "stage": 1, "fsdp": 1, "expert": 1, "context": 1, "model": 2}
  assert sharding.resolve_axes(cpu, MeshConfig(data=2, fsdp=-1, model=2), 8) == {
      "data": 2, "stage": 1, "fsdp": 2, "expert": 1, "context": 1, "model": 2}
  assert sharding.resolve_axes(cpu, MeshConfig(data=1, fsdp=2, expert=4), 8) == {
      "data": 1, "stage": 1, "fsdp": 2, "expert": 4, "context": 1, "model": 1}
  assert sharding.resolve_axes(cpu, MeshConfig(stage=2, context=2), 8) == {
      "data": 2, "stage": 2, "fsdp": 1, "expert": 1, "context": 2, "model": 1}


@pytest.mark.parametrize("cfg,message", [
    (MeshConfig(data=3), "data=3,stage=1,fsdp=1,expert=1,context=1,model=1 needs 3 devices but 8"
                                      " are available"),
    (MeshConfig(expert=3), "8 is not divisible by 3"),
    (MeshConfig(data=-1, fsdp=-1), "at most one -1"),
    (MeshConfig(model=0), "must be positive"),
    (MeshConfig(model=3), "8 is not divisible by 3"),
])
def test_resolve_axes_errors(cfg, message):
  with pytest.raises(ConfigError, match=message):
    sharding.resolve_axes(meshes.lookup("cpu"), cfg, 8)


def fake_devices(hosts: int, per_host: int, *, shuffle: bool = False):
  devices = [types.SimpleNamespace(id=i, process_index=i // per_host, platform="gpu",
                                   device_kind="fake", slice_index=0)
             for i in range(hosts * per_host)]
  return devices[::-1] if shuffle else devices


def hosts_of(grid):
  return [[d.process_index for d in row] for row in grid.reshape(grid.shape[0], -1)]


# Shapes in AXES order: data, stage, fsdp, context, model.

def test_device_grid_puts_hosts_on_the_data_axis():
  grid = sharding.device_grid((2, 1, 4, 1, 1, 1), fake_devices(2, 4, shuffle=True))
  assert hosts_of(grid) == [[0, 0, 0, 0], [1, 1, 1, 1]]


def test_device_grid_fsdp_across_hosts_keeps_model_inside_one():
  grid = sharding.device_grid((1, 1, 4, 1, 1, 2), fake_devices(2, 4))
  assert [[d.process_index for d in row] for row in grid.reshape(4, 2)] == [
      [0, 0], [0, 0], [1, 1], [1, 1]]
  with pytest.raises(ConfigError, match="cannot be laid over 2 hosts of 4 devices"):
    sharding.device_grid((1, 1, 1, 1, 1, 8), fake_devices(2, 4))


def test_device_grid_puts_pipeline_stages_across_hosts_before_fsdp():
  grid = sharding.device_grid((1, 2, 2, 1, 1, 2), fake_devices(2, 4, shuffle=True))
  assert [sorted({d.process_index for d in grid[0, s].flat}) for s in range(2)] == [[0], [1]]


def test_make_mesh_single_process():
  import jax  # pylint: disable=import-outside-toplevel
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "expert": 1, "model": 1}, jax.devices()[:1])
  assert dict(mesh.shape) == {"data": 1, "stage": 1, "fsdp": 1, "expert": 1, "context": 1,
                              "model": 1}
  assert all(str(t) == "AxisType.Auto" for t in mesh.axis_types)


# --- mesh rules --------------------------------------------------------------------------

RULES = (
    ("gpu-h100-.*", {"mesh.data": 2, "mesh.fsdp": -1, "trainer.grad_accum_steps": 2}),
    ("gpu-.*", {"mesh.model": 2, "model.remat": "full"}),
    ("cpu", {"mesh.data": 1}),
)


def rules_config():
  cfg = tiny.get_config()
  cfg.mesh.rules = RULES
  return cfg


def test_first_matching_rule_wins():
  cfg = rules_config()
  assert mesh_rules.apply_rules(cfg, "gpu-h100-8x2", set()) == "gpu-h100-.*"
  assert (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model) == (2, -1, None)
  assert cfg.trainer.grad_accum_steps == 2 and cfg.model.remat == "none"

  cfg = rules_config()
  assert mesh_rules.apply_rules(cfg, "gpu-a100-8", set()) == "gpu-.*"
  assert (cfg.mesh.data, cfg.mesh.model, cfg.model.remat) == (None, 2, "full")


def test_rule_regex_must_match_the_whole_name_and_explicit_overrides_win():
  cfg = rules_config()
  assert mesh_rules.apply_rules(cfg, "tpu-v4-8", set()) is None  # "cpu" is not a substring
  cfg = rules_config()
  assert mesh_rules.apply_rules(cfg, "gpu-h100-8", {"mesh.data"}) == "gpu-h100-.*"
  assert (cfg.mesh.data, cfg.mesh.fsdp) == (None, -1)


def _b300(monkeypatch) -> meshes.Entry:
  """A GPU entry added after the configs were written (a B300 host: 288 GB per GPU)."""
  hw = dataclasses.replace(meshes.MESHES["gpu-b200-8"].hardware, device_kind=r"\bB300",
                           hbm_bytes=288 * meshes.GB)
  entry = meshes.Entry(name="gpu-b300-8", hardware=hw)
  monkeypatch.setitem(meshes.MESHES, entry.name, entry)
  return entry


def test_a_new_gpu_entry_takes_the_rule_of_its_hardware(monkeypatch):
  """Rules match what the hardware is: a new 8-GPU entry with 80 GB or more takes llm_1b's
  recipe (and two such hosts llm_7b's) with no edit to the recipes."""
  from configs import llm_1b, llm_7b
  entry = _b300(monkeypatch)
  cfg = llm_1b.get_config()
  assert mesh_rules.apply_rules(cfg, entry, set()) == (
      "platform=gpu, devices_per_host=8, num_hosts=1, min_hbm_gb=80")
  assert (cfg.model.remat, cfg.trainer.grad_accum_steps, cfg.trainer.loss_chunk_size) == (
      "full", 8, 256)
  cfg = llm_7b.get_config()
  assert mesh_rules.apply_rules(cfg, "gpu-b300-8x2", set()) is not None
  assert cfg.trainer.grad_accum_steps == 8
  small = dataclasses.replace(entry, name="gpu-l4-8", hardware=dataclasses.replace(
      entry.hardware, hbm_bytes=24 * meshes.GB))
  assert mesh_rules.apply_rules(llm_1b.get_config(), small, set()) is None  # 24 GB: not this recipe
  generic = meshes.auto("gpu", "NVIDIA B300", 4, 1)  # half a host: the generic entry
  assert mesh_rules.apply_rules(llm_1b.get_config(), generic, set()) is None


def test_rules_by_facts_bounds_and_names():
  cfg = tiny.get_config()
  cfg.mesh.rules = (({"platform": "tpu", "max_hbm_gb": 20}, {"mesh.model": 2}),
                    ({"name": "gpu-h.*", "min_num_devices": 16}, {"mesh.data": 2}),
                    ({"platform": "gpu"}, {"mesh.fsdp": 4}))
  assert mesh_rules.apply_rules(cfg, "tpu-v5e-16", set()) == "platform=tpu, max_hbm_gb=20"
  cfg.mesh.model = None
  assert mesh_rules.apply_rules(cfg, "tpu-v5p-8", set()) is None  # 95 GiB
  assert mesh_rules.apply_rules(cfg, "gpu-h100-8", set()) == "platform=gpu"
  assert mesh_rules.apply_rules(cfg, "gpu-h200-8x2", set()) == "name=gpu-h.*, min_num_devices=16"


def test_bad_rule():
  cfg = tiny.get_config()
  cfg.mesh.rules = (("gpu-(", {"mesh.data": 2}),)
  with pytest.raises(ConfigError, match="bad regex 'gpu-\\('"):
    mesh_rules.apply_rules(cfg, "cpu", set())
  cfg.mesh.rules = (("cpu", {"mesh.dta": 2}),)
  with pytest.raises(ConfigError, match="did you mean 'mesh.data'|did you mean 'data'"):
    mesh_rules.apply_rules(cfg, "cpu", set())
  cfg.mesh.rules = (({"platfrom": "gpu"}, {"mesh.data": 2}),)
  with pytest.raises(ConfigError, match="unknown fact 'platfrom' \\(did you mean 'platform'"):
    mesh_rules.apply_rules(cfg, "cpu", set())
  cfg.mesh.rules = (({"min_hbm_gb": "80"}, {"mesh.data": 2}),)
  with pytest.raises(ConfigError, match="min_hbm_gb='80' must be a number"):
    mesh_rules.apply_rules(cfg, "cpu", set())
  cfg.mesh.rules = (({}, {"mesh.data": 2}),)
  with pytest.raises(ConfigError, match="must be \\(regex or"):
    mesh_rules.apply_rules(cfg, "cpu", set())


def test_select_mesh_in_process():
  assert meshes.select("auto").name == "cpu"
  assert meshes.select("cpu").name == "cpu"
  with pytest.raises(ConfigError, match="JAX sees 1"):
    meshes.select("gpu-h100-8")


# --- through the CLI (8 fake devices) ----------------------------------------------------

MESH_ERRORS = [
    (["--config.mesh.data=3"], "data=3,stage=1,fsdp=1,expert=1,context=1,model=1 needs 3 devices but 8"
                                      " are available"),
    (["--config.data.batch_size=12"], "data.batch_size 12 is not divisible by the 8 batch shards"
                                      " of the mesh (data=8 x stage=1 x fsdp=1 x expert=1)"),
    (["--config.mesh.model=8", "--config.mesh.data=1"],
     "dimension 6 is not divisible by mesh axes model=8"),
    (["--mesh=gpu-h100"], "unknown mesh (did you mean 'gpu-h100-8'?)"),
]


@pytest.fixture(scope="module")
def cli8(tmp_path_factory) -> dict:
  """{command: result} of every command below, run in one process with 8 fake CPU devices."""
  config = tmp_path_factory.mktemp("meshes") / "ruled.py"
  config.write_text("from configs import tiny\n\n\ndef get_config(arg=None):\n"
                    "  cfg = tiny.get_config(arg)\n"
                    f"  cfg.mesh.rules = {RULES!r}\n  return cfg\n")
  commands = [("--config=configs/tiny.py", "--print_config"),
              (f"--config={config}", "--mesh=gpu-h100-8", "--config.mesh.data=4",
               "--config.data.batch_size=16", "--print_config"),
              ("--config=configs/llm_1b.py", "--mesh=tpu-v6e-8", "--print_config"),
              *(("--config=configs/tiny.py", *args, "--print_config") for args, _ in MESH_ERRORS)]
  results = cli_batch([list(c) for c in commands], devices=8)
  return {"auto": results[0], "ruled": results[1], "elsewhere": results[2],
          **{tuple(args): r for (args, _), r in zip(MESH_ERRORS, results[3:])}}


def test_cli_auto_and_rules_with_explicit_override(cli8):
  result = cli8["auto"]
  assert result.returncode == 0, result.stderr
  assert "# mesh: cpu {'data': 8, 'stage': 1, 'fsdp': 1, 'expert': 1, 'context': 1, 'model': 1}\n" in result.stdout

  result = cli8["ruled"]
  assert result.returncode == 0, result.stderr
  assert ("# mesh: gpu-h100-8 {'data': 4, 'stage': 1, 'fsdp': 2, 'expert': 1, 'context': 1, 'model': 1} "
          "(rule 'gpu-h100-.*')\n"
          in result.stdout)
  assert "trainer.grad_accum_steps: 2\n" in result.stdout


def test_print_config_names_the_rule_of_an_entry_whose_devices_are_elsewhere(cli8):
  """--print_config --mesh=NAME on a machine without NAME's devices: the config that entry gets
  (its rule, its axes), and a line saying where its shardings are checked."""
  result = cli8["elsewhere"]
  assert result.returncode == 0, result.stderr
  assert ("# mesh: tpu-v6e-8 {'data': 1, 'stage': 1, 'fsdp': 8, 'expert': 1, 'context': 1, "
          "'model': 1} (rule 'platform=tpu')\n") in result.stdout
  assert "trainer.microbatch_rows: 4\n" in result.stdout
  assert "axtrain plan --mesh=tpu-v6e-8" in result.stdout


@pytest.mark.parametrize("args,message", MESH_ERRORS)
def test_cli_mesh_errors_are_one_line(cli8, args, message):
  result = cli8[tuple(args)]
  assert result.returncode == 2, result.stderr[-2000:]
  lines = result.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("axtrain: error: "), result.stderr[-2000:]
  assert message in lines[0]


# --- logical names -> mesh axes ----------------------------------------------------------

def test_rules_give_megatron_tensor_parallel_and_fsdp():
  import functools  # pylint: disable=import-outside-toplevel

  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel

  from modules import llama  # pylint: disable=import-outside-toplevel
  from modules.decoder import MODELS  # pylint: disable=import-outside-toplevel
  from core.registry import registry  # pylint: disable=import-outside-toplevel

  model = MODELS.build(registry("model").parse(llama.model_node("test").to_dict(), "model"))
  abstract = jax.eval_shape(functools.partial(model.init, tokens_BxL=jax.numpy.zeros(
      (1, 8), jax.numpy.int32)), jax.random.key(0))["params"]
  specs = nn.logical_to_mesh(nn.get_partition_spec(abstract), meshes.DEFAULT_RULES)
  layer = specs["layers"]["block"]
  # Scanned layers lead with the layer axis (pipeline stages); the `embed` side is split like
  # FSDP over fsdp, expert and context.
  embed = ("fsdp", "expert", "context")
  for name in ("q", "k", "v"):  # [layers, embed, heads, head_dim]: split by output (column)
    assert tuple(layer["attention"][name]) == ("stage", embed, "model", None)
  assert tuple(layer["attention"]["o"]) == ("stage", "model", None, embed)  # by input (row)
  for name in ("wi", "wu"):
    assert tuple(layer["ffn"][name]) == ("stage", embed, "model")
  assert tuple(layer["ffn"]["wo"]) == ("stage", "model", embed)
  assert tuple(specs["embedding"]["embedding"]) == ("model", embed)
  assert tuple(specs["head"]) == (embed, "model")
  assert tuple(nn.logical_to_mesh_axes(("batch", None), meshes.DEFAULT_RULES)) == (
      ("data", "stage", "fsdp", "expert"), None)


def test_rules_put_whole_experts_on_the_expert_axis():
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  rules = meshes.DEFAULT_RULES
  # Expert weights [experts, embed, mlp]: experts over `expert`, so `embed` falls back to
  # fsdp and context.
  assert tuple(nn.logical_to_mesh_axes(("experts", "embed", "mlp"), rules)) == (
      "expert", ("fsdp", "context"), "model")
  assert tuple(nn.logical_to_mesh_axes(("layers", "experts", "mlp", "embed"), rules)) == (
      "stage", "expert", "model", ("fsdp", "context"))
  assert tuple(nn.logical_to_mesh_axes(("embed", None), rules)) == (
      ("fsdp", "expert", "context"), None)


# --- the table's derived facts -----------------------------------------------------------

@pytest.mark.parametrize("name, topology", [
    ("tpu-v5e-16", "v5e:4x4"), ("tpu-v5e-8", "v5e:2x4"), ("tpu-v6e-256", "v6e:16x16"),
    ("tpu-v4-8", "v4:2x2x1"), ("tpu-v5p-128", "v5p:4x4x4"), ("tpu-v5p-512", "v5p:4x8x8"),
    ("tpu-v5p-12288", "v5p:16x16x24"),
])
def test_tpu_topology_names_follow_cloud_tpu(name, topology):
  entry = meshes.lookup(name)
  assert entry.topology == topology
  dims = [int(n) for n in topology.split(":")[1].split("x")]
  assert math.prod(dims) == entry.num_devices


def test_multi_host_platforms_come_from_the_table():
  assert meshes.MULTI_HOST_PLATFORMS == ("gpu", "neuron")
  for entry in meshes.MESHES.values():
    hw = entry.hardware
    if entry.num_devices is not None:  # named entries carry every figure the planner needs
      assert hw.peak_bf16_flops and hw.hbm_bytes and hw.hbm_bandwidth and hw.link_bandwidth
      assert hw.source
