"""`axtrain convert` without torch: a hand-written GPT-2 directory, both layouts, and bad input."""

import json
import pathlib

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from launcher import main as main_lib

D, F, V, P = 8, 32, 16, 8  # width, MLP width (4 * D), vocabulary, positions


def _gpt2_tensors(rng) -> dict:
  """The tensors of a 1-layer GPT2LMHeadModel, named as in openai-community/gpt2 (no prefix)."""
  shapes = {"wte.weight": (V, D), "wpe.weight": (P, D), "ln_f.weight": (D,), "ln_f.bias": (D,),
            "h.0.ln_1.weight": (D,), "h.0.ln_1.bias": (D,), "h.0.ln_2.weight": (D,),
            "h.0.ln_2.bias": (D,), "h.0.attn.c_attn.weight": (D, 3 * D),
            "h.0.attn.c_attn.bias": (3 * D,), "h.0.attn.c_proj.weight": (D, D),
            "h.0.attn.c_proj.bias": (D,), "h.0.mlp.c_fc.weight": (D, F), "h.0.mlp.c_fc.bias": (F,),
            "h.0.mlp.c_proj.weight": (F, D), "h.0.mlp.c_proj.bias": (D,)}
  return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def _write_hf(path: pathlib.Path, tensors: dict, **config) -> pathlib.Path:
  path.mkdir(parents=True)
  cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": D, "n_layer": 1,
         "n_head": 2, "n_positions": P, "vocab_size": V, "layer_norm_epsilon": 1e-5,
         "activation_function": "gelu_new", **config}
  (path / "config.json").write_text(json.dumps(cfg))
  save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
  return path


def _convert(capsys, *args) -> tuple[int, str]:
  code = main_lib.main(["axtrain", "convert", *map(str, args)])
  return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def tensors():
  return _gpt2_tensors(np.random.default_rng(0))


@pytest.mark.parametrize("layout,dtype", [("--scan_layers", np.float32),
                                          ("--no_scan_layers", ml_dtypes.bfloat16)])
def test_round_trip_in_both_layouts(tmp_path, capsys, tensors, layout, dtype):
  tensors = {k: v.astype(dtype) for k, v in tensors.items()}
  hf = _write_hf(tmp_path / "hf", tensors)
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={tmp_path / 'run'}", layout)[0] == 0
  cfg = json.loads((tmp_path / "run" / "config.json").read_text())
  assert cfg["model"]["scan_layers"] == (layout == "--scan_layers")
  assert (tmp_path / "run" / "checkpoints" / "0").is_dir()
  assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "converted"
  back_dir = tmp_path / "back"
  assert _convert(capsys, f"--to_hf={tmp_path / 'run'}", f"--output_dir={back_dir}")[0] == 0
  back = load_file(str(tmp_path / "back" / "model.safetensors"))
  assert sorted(back) == sorted(f"transformer.{k}" for k in tensors)
  for name, value in tensors.items():
    assert back[f"transformer.{name}"].dtype == dtype
    np.testing.assert_array_equal(back[f"transformer.{name}"], value, err_msg=name)
  hf_cfg = json.loads((tmp_path / "back" / "config.json").read_text())
  assert hf_cfg["architectures"] == ["GPT2LMHeadModel"] and hf_cfg["n_embd"] == D


def _refused(tmp_path, capsys, hf, *extra):
  out = tmp_path / "out"
  code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={out}", *extra)
  assert code == 2
  assert err.startswith("axtrain: error: ") and err.count("\n") == 1, err
  assert not out.exists() and not list(tmp_path.glob(".out.*")), "something was written"
  return err


def test_unsupported_model(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", tensors, architectures=["BertModel"])
  assert "model 'BertModel' is not supported" in _refused(tmp_path, capsys, hf)


def test_missing_tensor(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", {k: v for k, v in tensors.items() if k != "h.0.ln_2.bias"})
  err = _refused(tmp_path, capsys, hf)
  assert "missing tensor 'transformer.h.0.ln_2.bias' (expected shape (8,)" in err


def test_shape_disagrees_with_config(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", tensors, n_layer=1, vocab_size=20)
  err = _refused(tmp_path, capsys, hf)
  assert "tensor 'transformer.wte.weight' has shape (16, 8) but config.json implies (20, 8)" in err


def test_no_safetensors_and_not_a_directory(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", tensors)
  (hf / "model.safetensors").unlink()
  assert "holds no *.safetensors" in _refused(tmp_path, capsys, hf)
  assert "is not a directory" in _refused(tmp_path, capsys, tmp_path / "nowhere")


def test_output_dir_not_empty_is_left_alone(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", tensors)
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={out}")
  assert code == 2 and "exists and is not empty" in err
  assert [p.name for p in out.iterdir()] == ["keep.txt"]
  assert (out / "keep.txt").read_text() == "mine"


def test_bad_arguments(capsys):
  code, err = _convert(capsys, "--from_hf=x")
  assert code == 2 and "give exactly one of --from_hf / --to_hf, and --output_dir" in err
  code, err = _convert(capsys, "--form_hf=x", "--output_dir=y")
  assert code == 2 and "did you mean 'from_hf'" in err


def test_cli_resumes_from_run_dir_and_refuses_bad_configs(tmp_path, capsys, tensors):
  """The converted run's config.py, and two incompatible compositions (in this process)."""
  hf = _write_hf(tmp_path / "hf", tensors)
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  code = main_lib.main(["axtrain", f"--config={run}/config.py", f"--output_dir={run}",
                        "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0, err
  # The tensors, plus the zero rows that pad the 16-id embedding to 128 (model.vocab_multiple).
  expected = sum(v.size for v in tensors.values()) + (128 - V) * D
  assert f"# parameters: {expected:,}" in out

  for args, message in (
      (["--config=configs/tiny.py", "--config.model.block.attention.num_kv_heads=4"],
       "attention: num_heads 6 is not a multiple of num_kv_heads 4"),
      (["--config=configs/moe_tiny.py", "--config.model.block.ffn.top_k=9"],
       "moe: top_k 9 must be between 1 and num_experts 8"),
  ):
    code = main_lib.main(["axtrain", *args, "--print_config"])
    assert code == 2
    assert capsys.readouterr().err == f"axtrain: error: {message}\n"


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


def test_to_hf_refuses_models_hf_cannot_hold_and_runs_without_checkpoints(tmp_path, capsys,
                                                                          tensors):
  hf = _write_hf(tmp_path / "hf", tensors)
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  cfg = json.loads((run / "config.json").read_text())
  cfg["model"]["block"]["kind"] = "parallel"
  (run / "config.json").write_text(json.dumps(cfg))
  code, err = _convert(capsys, f"--to_hf={run}", f"--output_dir={tmp_path / 'back'}")
  assert code == 2 and err == ("axtrain: error: the model cannot be written as GPT2LMHeadModel: "
                               "block kind 'parallel' (needs pre_norm)\n")
  (tmp_path / "empty_run").mkdir()
  (tmp_path / "empty_run" / "config.json").write_text(json.dumps(cfg))
  code, err = _convert(capsys, f"--to_hf={tmp_path / 'empty_run'}",
                       f"--output_dir={tmp_path / 'back'}")
  assert code == 2 and "holds no checkpoints/ directory" in err
  assert not (tmp_path / "back").exists()


def _files(root: pathlib.Path, names) -> dict:
  return {str(p.relative_to(root)): p.read_bytes() for name in names
          for p in sorted([root / name, *(root / name).rglob("*")]) if p.is_file()}


WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]


def _word_tokenizer(path: pathlib.Path) -> None:
  """A Hugging Face tokenizer.json whose ids fit the tiny model's vocabulary of V."""
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=import-outside-toplevel
  vocab = {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
  assert len(vocab) <= V
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(str(path))


def test_converted_config_says_what_it_trains_on_and_how_to_train_on_a_corpus(
    tmp_path, capsys, tensors, monkeypatch):
  hf = _write_hf(tmp_path / "hf", tensors)
  _word_tokenizer(hf / "tokenizer.json")
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  doc = (run / "config.py").read_text().split('"""')[1]
  assert "trains the converted model on synthetic data: 1000 steps of 8 x 8\nuniformly random " \
         "tokens (data.kind=synthetic)" in doc, doc
  line = next(l.strip() for l in doc.splitlines() if "--config.data.kind=jsonl" in l)
  assert line == (f"axtrain --config={run}/config.py --output_dir={run} --config.data.kind=jsonl "
                  f"--config.data.path=corpus.jsonl --config.data.tokenizer.kind=huggingface "
                  f"--config.data.tokenizer.path={hf}/tokenizer.json")
  # The line as written works: the corpus, read with the model's tokenizer.
  rng = np.random.default_rng(0)
  (tmp_path / "corpus.jsonl").write_text("".join(
      json.dumps({"text": " ".join(rng.choice(WORDS, 30))}) + "\n" for _ in range(200)))
  monkeypatch.chdir(tmp_path)
  code = main_lib.main([*line.split(), "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert "data.kind: jsonl\n" in out and "data.tokenizer.kind: huggingface\n" in out
  # And a short try of the converted config: its warm-up of 100 steps shrinks to fit.
  code = main_lib.main(["axtrain", f"--config={run}/config.py", f"--output_dir={run}",
                        "--config.trainer.max_steps=10", "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0 and err == ("axtrain: note: optimizer.schedule.warmup_steps 100 does not fit "
                               "in trainer.max_steps 10: the warm-up shrinks to 1 steps (10% of "
                               "the run)\n"), err


@pytest.mark.parametrize("vocab", [256, V])
def test_converted_config_without_a_tokenizer_json_names_a_tokenizer_that_exists(
    tmp_path, capsys, tensors, vocab, monkeypatch):
  """A folder with no tokenizer.json (what `convert --to_hf` of a bytes-tokenizer run writes):
  a 256-id model reads UTF-8 bytes, and the line works as written; any other asks for the
  model's tokenizer.json instead of naming a file that is not there."""
  wte = np.random.default_rng(1).normal(size=(vocab, D)).astype(np.float32)
  hf = _write_hf(tmp_path / "hf", {**tensors, "wte.weight": wte}, vocab_size=vocab)
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  doc = (run / "config.py").read_text().split('"""')[1]
  line = next(l.strip() for l in doc.splitlines() if "--config.data.kind=jsonl" in l)
  assert f"{hf}/tokenizer.json" not in doc
  if vocab != 256:
    assert line.endswith("--config.data.tokenizer.kind=huggingface "
                         "--config.data.tokenizer.path=PATH/TO/tokenizer.json"), line
    assert f"{hf} has no tokenizer.json" in " ".join(doc.split()), doc
    return
  assert line.endswith("--config.data.path=corpus.jsonl --config.data.tokenizer.kind=bytes"), line
  (tmp_path / "corpus.jsonl").write_text('{"text": "the cat sat on the mat"}\n' * 50)
  monkeypatch.chdir(tmp_path)
  code = main_lib.main([*line.split(), "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert "data.kind: jsonl\n" in out and "data.tokenizer.kind: bytes\n" in out


def test_from_hf_of_an_axtrain_run_says_it_is_not_a_hugging_face_folder(tmp_path, capsys):
  run = tmp_path / "demo"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"model": {}, "trainer": {}}))
  (run / "run.json").write_text(json.dumps({"status": "completed"}))
  err = _refused(tmp_path, capsys, run)
  assert err == (f"axtrain: error: --from_hf {run} is not a Hugging Face model folder: its "
                 f"config.json names no architectures or model_type (it is an axtrain run "
                 f"directory: export it with --to_hf)\n")


def test_readme_commands_continue_training_from_the_converted_weights(tmp_path, capfd, tensors):
  """convert, then the README's command as written, then a 2-step run with --overwrite whose
  first loss is the converted model's loss on that batch, computed by transformers."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from launcher import convert, run_dir  # pylint: disable=import-outside-toplevel
  hf = _write_hf(tmp_path / "hf", tensors)
  run = tmp_path / "run"
  assert main_lib.main(["axtrain", "convert", f"--from_hf={hf}", f"--output_dir={run}"]) == 0
  converted = _files(run, ["config.py", "hf_config.json", "checkpoints/0"])
  info = json.loads((run / "run.json").read_text())
  assert info["command"] == f"axtrain convert --from_hf={hf} --output_dir={run}"

  readme = ["axtrain", f"--config={run}/config.py", f"--output_dir={run}"]
  assert main_lib.main(readme) == 0, capfd.readouterr().err
  err = capfd.readouterr().err
  assert "resumed from checkpoint step 0" in err, err
  info = json.loads((run / "run.json").read_text())
  assert info["status"] == "completed" and info["resumed_from_step"] == 0
  assert info["converted_from"] == str(hf.resolve()) and info["hf_dtype"] == "F32"
  assert _files(run, ["config.py", "hf_config.json", "checkpoints/0"]) == converted

  code = main_lib.main(readme + ["--config.trainer.max_steps=2", "--config.trainer.log_every=1",
                                 "--config.optimizer.schedule.warmup_steps=0"])
  assert code == 2 and "different config (optimizer.schedule.warmup_steps, trainer.max_steps differ)" in (
      capfd.readouterr().err)
  assert main_lib.main(readme + ["--config.trainer.max_steps=2", "--config.trainer.log_every=1",
                                 "--config.optimizer.schedule.warmup_steps=0",
                                 "--overwrite"]) == 0, capfd.readouterr().err
  assert "resumed from checkpoint step 0" in capfd.readouterr().err
  assert _files(run, ["config.py", "hf_config.json", "checkpoints/0"]) == converted
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0", "2"]
  first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
  assert first["step"] == 1

  exp = convert.experiment_of(json.loads((run / "config.json").read_text()))
  batch = next(exp.source.train_iterator(process_index=0, process_count=1))
  model = transformers.GPT2LMHeadModel.from_pretrained(hf).eval()
  with torch.no_grad():
    logits = model(torch.tensor(batch["inputs"], dtype=torch.long)).logits
    expected = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.tensor(batch["targets"], dtype=torch.long)
        .reshape(-1)).item()
  assert first["loss"] == pytest.approx(expected, rel=1e-5), (first["loss"], expected)

  # The model cannot change under the converted weights, --overwrite or not.
  code = main_lib.main(readme + ["--config.model.dim=16", "--overwrite"])
  err = capfd.readouterr().err
  assert code == 2 and "holds a model converted from Hugging Face" in err and "model.dim" in err
  assert _files(run, ["config.py", "hf_config.json", "checkpoints/0"]) == converted
  assert run_dir.RunDir(run).converted()


def test_convert_uses_the_umask(tmp_path, capsys, tensors):
  import os  # pylint: disable=import-outside-toplevel
  hf = _write_hf(tmp_path / "hf", tensors)
  old = os.umask(0o027)
  try:
    assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={tmp_path / 'run'}")[0] == 0
    assert _convert(capsys, f"--to_hf={tmp_path / 'run'}", f"--output_dir={tmp_path / 'back'}")[0] == 0
  finally:
    os.umask(old)
  for root in (tmp_path / "run", tmp_path / "back"):
    for path in [root, *root.rglob("*")]:
      want = 0o750 if path.is_dir() else 0o640
      assert path.stat().st_mode & 0o777 == want, (path, oct(path.stat().st_mode))


def test_output_dir_that_cannot_be_written(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", tensors)
  regular = tmp_path / "file"
  regular.write_text("x")
  for out, message in ((regular / "run", "is a file, not a directory"),
                       (pathlib.Path("/proc/axtrain_convert"), "filesystem; choose a directory")):
    code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={out}")
    assert code == 2 and err.count("\n") == 1 and message in err, err
  assert regular.read_text() == "x" and not list(tmp_path.glob(".*.tmp"))


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
                               "LlamaForCausalLM: an ffn other than SwiGLU\n"), err
  assert not (tmp_path / "hf").exists()
