"""`axtrain convert` without torch: a hand-written GPT-2 directory, both layouts, and bad input.
Its outputs, the Hugging Face maps and training on corpora: tests/test_convert_outputs.py,
tests/test_convert_maps.py, tests/test_convert_corpus.py."""

import json
import pathlib

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from launcher import main as main_lib

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

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


def test_scan_layers_flag_takes_its_value(tmp_path, capsys, tensors):
  """--scan_layers=false writes unrolled layers (layers_0, ...), as --no_scan_layers does;
  a value that is no boolean, a value on --no_scan_layers and the flag with --to_hf are
  refused in one line."""
  from launcher import convert  # pylint: disable=import-outside-toplevel
  base = ["axtrain", "--from_hf=hf", "--output_dir=run"]
  for flag, scan in (("--scan_layers", True), ("--scan_layers=true", True),
                     ("--scan_layers=False", False), ("--scan_layers=0", False),
                     ("--no_scan_layers", False), (None, True)):
    assert convert.parse_args(base + ([flag] if flag else []))["layout"] == {
        "scan_layers": scan, "fused_qkv": False, "fused_gate_up": False}, flag
  assert convert.parse_args(base + ["--fused_qkv", "--fused_gate_up=false"])["layout"] == {
      "scan_layers": True, "fused_qkv": True, "fused_gate_up": False}
  hf = _write_hf(tmp_path / "hf", tensors)
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={tmp_path / 'run'}",
                  "--scan_layers=false")[0] == 0
  assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["scan_layers"] is False
  params = convert._load_params(tmp_path / "run", convert.abstract_params(convert.experiment_of(
      json.loads((tmp_path / "run" / "config.json").read_text()))))
  assert "layers_0" in params and "layers" not in params
  for args, message in ((["--scan_layers=no"], "--scan_layers=no: expected true or false"),
                        (["--no_scan_layers=true"], "--no_scan_layers takes no value"),
                        ([f"--to_hf={tmp_path / 'run'}", "--scan_layers=false"],
                         "--scan_layers goes with --from_hf"),
                        (["--fused_qkv=yes"], "--fused_qkv=yes: expected true or false"),
                        ([f"--to_hf={tmp_path / 'run'}", "--fused_qkv"],
                         "--fused_qkv goes with --from_hf (the layout to write"),
                        (["--fused_gate_up"], "--fused_gate_up: the GPT2LMHeadModel model's "
                                              "MLP has no gate (nothing to fuse)"),
                        (["--step=3"], "--step goes with --to_hf (the checkpoint to export)"),
                        ([f"--to_hf={tmp_path / 'run'}", "--step=last"],
                         "--step=last: expected a whole number >= 0")):
    if "--to_hf" not in args[0]:
      args = [f"--from_hf={hf}", *args]
    code, err = _convert(capsys, *args, f"--output_dir={tmp_path / 'out'}")
    assert code == 2 and err.startswith("axtrain: error: convert: ") and message in err, err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


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
  assert f"{tmp_path / 'nowhere'} does not exist" in _refused(tmp_path, capsys, tmp_path / "nowhere")
  # A path that exists, as a file, is called a file.
  assert f"{hf / 'config.json'} is a file, not a directory" in _refused(tmp_path, capsys,
                                                                        hf / "config.json")


@pytest.mark.parametrize("setting,reads,flags", [
    ("model.scan_layers=false", "model.scan_layers=true", "--scan_layers=false"),
    ("model.block.attention.fused_qkv=true", "model.block.attention.fused_qkv=false",
     "--fused_qkv=true")])
def test_fine_tuning_a_converted_model_in_the_other_layout_names_both_fixes(
    tmp_path, capsys, tensors, setting, reads, flags):
  """A converted model (scanned layers and separate projections, convert's defaults)
  fine-tuned by a config with unrolled layers, or fused q/k/v: the refusal names the setting
  that reads it and the conversion that fits the config (README's `init.from_run` fine-tune)."""
  hf = _write_hf(tmp_path / "hf", tensors)
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  code = main_lib.main(["axtrain", f"--config={run}/config.py", f"--config.{setting}",
                        f"--config.init.from_run={run}", f"--output_dir={tmp_path / 'tuned'}"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert err.endswith(f"; set --config.{reads} to read it, or convert the model "
                      f"again with this model's layout: axtrain convert --from_hf={hf.resolve()} "
                      f"{flags} --output_dir=NEW_DIR\n"), err
  assert not (tmp_path / "tuned").exists()


def test_output_dir_not_empty_is_left_alone(tmp_path, capsys, tensors):
  hf = _write_hf(tmp_path / "hf", tensors)
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={out}")
  assert code == 2 and "exists and is not empty" in err
  assert [p.name for p in out.iterdir()] == ["keep.txt"]
  assert (out / "keep.txt").read_text() == "mine"


def test_to_hf_refuses_models_hf_cannot_hold_and_runs_without_checkpoints(tmp_path, capsys,
                                                                          tensors):
  hf = _write_hf(tmp_path / "hf", tensors)
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  cfg = json.loads((run / "config.json").read_text())
  cfg["model"]["block"]["kind"] = "parallel"
  cfg["model"]["block"].pop("post_norms")  # pre_norm's own field
  (run / "config.json").write_text(json.dumps(cfg))
  code, err = _convert(capsys, f"--to_hf={run}", f"--output_dir={tmp_path / 'back'}")
  assert code == 2 and err == ("axtrain: error: the model cannot be written as GPT2LMHeadModel: "
                               "model.block.kind is 'parallel' (GPT2LMHeadModel takes only "
                               "'pre_norm')\n"), err
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
  assert (f"Its tokenizer (data.tokenizer) is the model's own, {hf}/tokenizer.json: a switch to "
          f"a text kind") in " ".join(doc.split()), doc
  line = next(l.strip() for l in doc.splitlines() if "--config.data.kind=jsonl" in l)
  assert line == (f"axtrain --config={run}/config.py --output_dir={run} --config.data.kind=jsonl "
                  f"--config.data.path=corpus.jsonl")
  # The line as written works: the corpus, read with the model's tokenizer, which config.py
  # names (no tokenizer flags), from any directory.
  rng = np.random.default_rng(0)
  (tmp_path / "corpus.jsonl").write_text("".join(
      json.dumps({"text": " ".join(rng.choice(WORDS, 30))}) + "\n" for _ in range(200)))
  monkeypatch.chdir(tmp_path)
  code = main_lib.main([*line.split(), "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert "data.kind: jsonl\n" in out and "data.tokenizer.kind: huggingface\n" in out
  assert f"data.tokenizer.path: {hf}/tokenizer.json\n" in out
  # And a short try of the converted config: its warm-up of 100 steps shrinks to fit.
  code = main_lib.main(["axtrain", f"--config={run}/config.py", f"--output_dir={run}",
                        "--config.trainer.max_steps=10", "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0 and err == ("axtrain: note: optimizer.schedule.warmup_steps 100 does not fit "
                               "in trainer.max_steps 10: the warm-up shrinks to 1 step (10% of "
                               "the run)\n"), err


def _gpt2_with_vocab(tmp_path, tensors, vocab: int) -> pathlib.Path:
  wte = np.random.default_rng(1).normal(size=(vocab, D)).astype(np.float32)
  return _write_hf(tmp_path / "hf", {**tensors, "wte.weight": wte}, vocab_size=vocab)


def _corpus_line(run: pathlib.Path) -> str:
  doc = (run / "config.py").read_text().split('"""')[1]
  return next(l.strip() for l in doc.splitlines() if "--config.data.kind=jsonl" in l)


@pytest.mark.parametrize("vocab", [256, 121, 300])
def test_converted_config_without_a_tokenizer_json_names_a_tokenizer_that_exists(
    tmp_path, capsys, tensors, vocab, monkeypatch):
  """A folder with no tokenizer.json (what `convert --to_hf` of a bytes-tokenizer run writes):
  a 256-id model reads UTF-8 bytes, and the line works as written; the bytes tokenizer cannot
  serve any other vocabulary (121: ids past the model's; 300: not the model's ids), so convert
  chooses none and says so in one line that names the fix."""
  hf = _gpt2_with_vocab(tmp_path, tensors, vocab)
  run = tmp_path / "run"
  code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")
  assert code == 0, err
  doc = (run / "config.py").read_text().split('"""')[1]
  line = _corpus_line(run)
  assert f"{hf}/tokenizer.json" not in doc
  if vocab != 256:
    assert err == (f"axtrain: note: {hf} has no tokenizer.json and the model's {vocab} ids are "
                   f"not the bytes tokenizer's 256: no tokenizer chosen; to train on text or "
                   f"generate, convert again with --tokenizer=PATH/TO/tokenizer.json (the "
                   f"model's own)\n"
                   f"axtrain: wrote {run}\n"), err
    assert line.endswith("--config.data.tokenizer.kind=huggingface "
                         "--config.data.tokenizer.path=PATH/TO/tokenizer.json"), line
    assert f"{hf} has no tokenizer.json" in " ".join(doc.split()), doc
    assert json.loads((run / "config.json").read_text())["data"]["tokenizer"] is None
    return
  assert err == f"axtrain: wrote {run}\n", err
  assert line.endswith("--config.data.path=corpus.jsonl"), line
  assert json.loads((run / "config.json").read_text())["data"]["tokenizer"]["kind"] == "bytes"
  (tmp_path / "corpus.jsonl").write_text('{"text": "the cat sat on the mat"}\n' * 50)
  monkeypatch.chdir(tmp_path)
  code = main_lib.main([*line.split(), "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert "data.kind: jsonl\n" in out and "data.tokenizer.kind: bytes\n" in out


def test_tokenizer_flag_names_the_models_tokenizer_and_is_checked(tmp_path, capsys, tensors,
                                                                   monkeypatch):
  """--tokenizer names the tokenizer of a folder without one: the corpus line reads with it
  (and works); a tokenizer whose ids the model does not have, a missing file and --to_hf are
  refused in one line, writing nothing."""
  hf = _write_hf(tmp_path / "hf", tensors)  # 16 ids
  _word_tokenizer(tmp_path / "words.json")
  for value, message in (
      ("bytes", "convert: --tokenizer=bytes has 256 ids but the model's vocabulary has 16; name "
                "the tokenizer the model was trained with"),
      (str(tmp_path / "nowhere.json"), f"convert: --tokenizer={tmp_path / 'nowhere.json'} does "
                                       f"not exist; give the model's tokenizer.json (or "
                                       f"SentencePiece .model), or bytes"),
      (str(hf), f"convert: --tokenizer={hf} is a directory, not a file; give the model's "),
      (str(hf / "config.json"), f"convert: --tokenizer={hf / 'config.json'}: tokenizer file "
                                f"'{hf / 'config.json'}' is not a Hugging Face tokenizer.json")):
    err = _refused(tmp_path, capsys, hf, f"--tokenizer={value}")
    assert err.startswith(f"axtrain: error: {message}"), err
  code, err = _convert(capsys, f"--to_hf={tmp_path}", f"--output_dir={tmp_path / 'out'}",
                       "--tokenizer=bytes")
  assert code == 2 and "--tokenizer goes with --from_hf" in err, err

  run = tmp_path / "run"
  code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}",
                       f"--tokenizer={tmp_path / 'words.json'}")
  assert code == 0 and err == f"axtrain: wrote {run}\n", err
  line = _corpus_line(run)
  assert line.endswith("--config.data.path=corpus.jsonl"), line
  (tmp_path / "corpus.jsonl").write_text('{"text": "the cat sat on the mat"}\n' * 50)
  monkeypatch.chdir(tmp_path)
  code = main_lib.main([*line.split(), "--print_config"])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert "data.tokenizer.kind: huggingface\n" in out
  assert f"data.tokenizer.path: {tmp_path / 'words.json'}\n" in out


def test_a_folder_tokenizer_that_cannot_serve_the_model_is_not_chosen(tmp_path, capsys, tensors):
  """HF_DIR/tokenizer.json with more ids than the model's vocabulary, or one that does not load,
  is not written into the config (training would refuse it, advising a larger model.vocab_size,
  which converted weights cannot take): convert names none and says why in one note."""
  from tokenizers import Tokenizer, models  # pylint: disable=import-outside-toplevel
  hf = _write_hf(tmp_path / "hf", tensors)
  vocab = {f"w{i}": i for i in range(V + 4)}
  Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0")).save(str(hf / "tokenizer.json"))
  for case, why in (("big", f"has {V + 4} ids but the model's vocabulary has {V}"),
                    ("broken", "does not load (tokenizer file")):
    if case == "broken":
      (hf / "tokenizer.json").write_text("{not json")
    run = tmp_path / case
    code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")
    assert code == 0 and err.startswith(f"axtrain: note: {hf}/tokenizer.json {why}"), err
    assert ": no tokenizer chosen; to train on text or generate, convert again with " \
           "--tokenizer=PATH/TO/tokenizer.json (the model's own)\naxtrain: wrote" in err, err
    assert json.loads((run / "config.json").read_text())["data"]["tokenizer"] is None


def test_from_hf_of_an_axtrain_run_says_it_is_not_a_hugging_face_folder(tmp_path, capsys):
  run = tmp_path / "demo"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"model": {}, "trainer": {}}))
  (run / "run.json").write_text(json.dumps({"status": "completed"}))
  err = _refused(tmp_path, capsys, run)
  assert err == (f"axtrain: error: --from_hf {run} is not a Hugging Face model folder: its "
                 f"config.json names no architectures or model_type (it is an axtrain run "
                 f"directory: export it with --to_hf)\n")


@pytest.mark.slow  # the README's commands, two trainings (make test-slow)
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
  assert code == 2 and ("different config (optimizer.schedule.warmup_steps 100 -> 0, "
                        "trainer.max_steps 1000 -> 2)") in (
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
