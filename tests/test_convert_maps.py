"""`axtrain convert` and the Hugging Face maps: a sharded checkpoint, parameters no map knows,
tensors a map leaves unread, and --to_hf of runs trained on a mesh (split from
tests/test_convert.py, whose GPT-2 directory it uses)."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.test_convert import D, _convert, _gpt2_tensors, _write_hf


@pytest.fixture(scope="module")
def tensors():
  return _gpt2_tensors(np.random.default_rng(0))


def test_sharded_index_and_a_stray_tied_head_copy(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", {})
  (hf / "model.safetensors").unlink()
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[:7],
            "model-00002-of-00002.safetensors": names[7:]}
  for file, keys in shards.items():
    extra = {"lm_head.weight": tensors["wte.weight"]} if file.startswith("model-00002") else {}
    save_file({**{k: tensors[k] for k in keys}, **extra}, str(hf / file))
  weight_map = {k: f for f, keys in shards.items() for k in keys}
  (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  assert _convert(capsys, f"--to_hf={run}", f"--output_dir={tmp_path / 'back'}")[0] == 0
  back = load_file(str(tmp_path / "back" / "model.safetensors"))
  for name, value in tensors.items():
    np.testing.assert_array_equal(back[f"transformer.{name}"], value, err_msg=name)


def _attention_with_extra_parameter(monkeypatch):
  """Attention as a later layer might be: one more parameter, which no family map knows."""
  import flax.linen as nn

  from core.registry import Component, registry
  attention = registry("attention")
  entry = attention.entry("attention")

  class WithExtra(entry.target):
    @nn.compact
    def __call__(self, x, *args, **kwargs):
      gain = self.param("gain", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                        (3,))
      return super().__call__(x, *args, **kwargs) * gain[0]

  monkeypatch.setitem(attention._entries, "attention",  # pylint: disable=protected-access
                      Component("attention", entry.config_cls, WithExtra))


def test_a_parameter_no_map_knows_refuses_export_and_import(tmp_path, capsys, tensors,
                                                            monkeypatch):
  hf = _write_hf(tmp_path / "hf", tensors)
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={tmp_path / 'run'}")[0] == 0
  _attention_with_extra_parameter(monkeypatch)
  code, err = _convert(capsys, f"--to_hf={tmp_path / 'run'}", f"--output_dir={tmp_path / 'back'}")
  assert code == 2 and err.count("\n") == 1, err
  assert ("axtrain: error: the model cannot be written as GPT2LMHeadModel: its parameters "
          "layers.*.block.attention.gain map to no Hugging Face tensor") in err
  assert not (tmp_path / "back").exists()
  code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={tmp_path / 'run2'}")
  assert code == 2 and err.count("\n") == 1, err
  assert ("the model's parameters layers.*.block.attention.gain get no tensor from the "
          "GPT2LMHeadModel checkpoint") in err
  assert not (tmp_path / "run2").exists()


def test_a_map_that_leaves_a_tensor_unread_refuses(tmp_path, capsys, tensors, monkeypatch):
  import dataclasses

  from modules import hf_maps
  family = hf_maps.FAMILIES["GPT2LMHeadModel"]

  def forgetful(get, c):  # a map that never reads the final norm's bias
    return family.from_hf(lambda name: np.zeros(D, np.float32) if name ==
                          "transformer.ln_f.bias" else get(name), c)

  monkeypatch.setitem(hf_maps.FAMILIES, "GPT2LMHeadModel",
                      dataclasses.replace(family, from_hf=forgetful))
  hf = _write_hf(tmp_path / "hf", tensors)
  code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={tmp_path / 'run'}")
  assert code == 2 and "reads no parameter from the tensors transformer.ln_f.bias" in err, err
  assert not (tmp_path / "run").exists()


# -- --to_hf of runs trained on a mesh ------------------------------------------------------

def test_to_hf_reads_a_run_of_8_devices_onto_one(tmp_path, capsys):
  """A run trained with context=4 x data=2 on 8 fake devices (a subprocess) exports from this
  process's one device; the tensors are the checkpoint's, read here without any mesh."""
  from tests import ckpt_util as cu  # pylint: disable=import-outside-toplevel
  from tests.conftest import cli  # pylint: disable=import-outside-toplevel
  run = tmp_path / "run"
  trained = cli(f"--config={cu.CONFIG}", f"--output_dir={run}", "--config.trainer.max_steps=2",
                "--config.mesh.context=4", "--config.mesh.data=2", "--noprogress", devices=8)
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert json.loads((run / "config.json").read_text())["mesh"]["context"] == 4
  code, err = _convert(capsys, f"--to_hf={run}", f"--output_dir={tmp_path / 'hf'}")
  assert code == 0, err
  tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
  saved = cu.params(run, 2)
  vocab = tensors["model.embed_tokens.weight"].shape[0]
  np.testing.assert_array_equal(tensors["model.embed_tokens.weight"],
                                saved["['embedding']['embedding']"][:vocab])
  np.testing.assert_array_equal(tensors["model.norm.weight"], saved["['final_norm']['scale']"])


def test_to_hf_of_a_moe_run_on_an_expert_mesh_names_its_moe_parts(tmp_path, capsys):
  from launcher import config_loading  # pylint: disable=import-outside-toplevel
  run = tmp_path / "moe"
  (run / "checkpoints").mkdir(parents=True)
  cfg = config_loading.load("configs/moe_tiny.py", "--config.mesh.expert=4")
  (run / "config.json").write_text(cfg.to_json_best_effort())
  code, err = _convert(capsys, f"--to_hf={run}", f"--output_dir={tmp_path / 'hf'}")
  assert code == 2 and err == ("axtrain: error: the model cannot be written as "
                               "LlamaForCausalLM: model.block.ffn.kind is 'moe' (LlamaForCausalLM takes "
                               "only 'mlp')\n"), err
  assert not (tmp_path / "hf").exists()


def test_a_converted_run_goes_back_to_the_class_it_came_from(tmp_path, capsys, tensors,
                                                             monkeypatch):
  """Two HF classes may hold the same math (Mistral's and Phi-3's layers): a run converted
  from the one built on the other's map goes back to it; one trained here goes to the class the
  other builds on (a class built on GPT-2's map that holds all of GPT-2's models does not take
  them); one whose source class cannot hold it (the architecture in its run.json is LLaMA's)
  goes to the nearest that can."""
  import dataclasses

  from core.registry import registry
  from modules import gpt2 as gpt2_lib, hf_maps
  gpt2 = hf_maps.FAMILIES["GPT2LMHeadModel"]
  top = {**gpt2.settings.kinds[""]["decoder_lm"], "architectures": ["GPT2TwinLMHeadModel"]}
  twin = dataclasses.replace(gpt2, architecture="GPT2TwinLMHeadModel", settings=dataclasses.replace(
      gpt2.settings, kinds={**gpt2.settings.kinds, "": {"decoder_lm": top}}),
      extends="GPT2LMHeadModel")  # built on GPT-2's map: it holds every GPT-2 model
  monkeypatch.setitem(hf_maps.FAMILIES, twin.architecture, twin)  # registered after GPT-2's
  m = registry("model").parse(gpt2_lib.node(gpt2_lib.SIZES["small"]), "model")
  assert hf_maps.family_of_model(m) is gpt2  # trained here: the class the twin builds on
  for arch, want in (("GPT2TwinLMHeadModel", "GPT2TwinLMHeadModel"),
                     ("GPT2LMHeadModel", "GPT2LMHeadModel"),
                     ("LlamaForCausalLM", "GPT2LMHeadModel")):
    hf, run = tmp_path / arch / "hf", tmp_path / arch / "run"
    _write_hf(hf, tensors, architectures=[arch if arch != "LlamaForCausalLM" else
                                          "GPT2LMHeadModel"])
    assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
    if arch == "LlamaForCausalLM":  # a source class that cannot hold the model
      info = json.loads((run / "run.json").read_text())
      (run / "run.json").write_text(json.dumps({**info, "architecture": arch}))
    assert _convert(capsys, f"--to_hf={run}", f"--output_dir={run.parent / 'back'}")[0] == 0
    back = json.loads((run.parent / "back" / "config.json").read_text())
    assert back["architectures"] == [want], arch
