"""`axtrain convert` without torch: a hand-written GPT-2 directory, both layouts, and bad input."""

import json
import pathlib

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from core.registry import ConfigError
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


def test_a_full_disk_is_one_line_and_leaves_nothing_both_ways(tmp_path, capsys, tensors,
                                                               monkeypatch):
  """convert on a disk without room. --from_hf: the disk fills as it writes config.py (fault
  injection: that write raises ENOSPC half-way). --to_hf: the disk has less room than the
  model's tensors (os.statvfs reports one 4 kB block free), which it checks before writing (a
  write that fails anyway, in safetensors' Rust, is a full disk too: tests/test_cli.py). Each
  is one line naming the device and --output_dir, not the hidden folder it stages in, exit 74,
  and nothing is left; the same commands then succeed."""
  from launcher.errors import EXIT_NO_SPACE  # pylint: disable=import-outside-toplevel
  from tests.conftest import fill_disk_at, report_full  # pylint: disable=import-outside-toplevel
  from trainer import disk  # pylint: disable=import-outside-toplevel
  hf, run, back = _write_hf(tmp_path / "hf", tensors), tmp_path / "run", tmp_path / "back"
  head = f"axtrain: error: no space left on {disk.device_text(tmp_path)} writing "
  for flags, out, full in (([f"--from_hf={hf}"], run, lambda p: fill_disk_at(p, "/config.py.tmp")),
                           ([f"--to_hf={run}"], back, lambda p: report_full(p, tmp_path))):
    with monkeypatch.context() as patch:
      full(patch)
      code, err = _convert(capsys, *flags, f"--output_dir={out}")
    assert code == EXIT_NO_SPACE and err.count("\n") == 1, err
    assert err.startswith(f"{head}{out} (") and " needed, " in err, err
    assert err.endswith(" free); free space there, then run the same command again\n"), err
    assert not out.exists() and not list(tmp_path.glob(f".{out.name}.*")), "something was left"
    assert _convert(capsys, *flags, f"--output_dir={out}")[0] == 0
  assert (back / "model.safetensors").is_file()


def test_a_stopped_convert_leaves_no_partial_output_both_ways(tmp_path, capsys, tensors):
  """Ctrl-C as --from_hf writes run.json, SIGTERM as --to_hf writes config.json, each into its
  hidden staging folder (tests/signal_at_write.py): the stop line says it removed that folder,
  which is gone (before, a half checkpoint stayed in `.NAME.XXXXXXXX.tmp`, unmentioned)."""
  from tests.conftest import cli  # pylint: disable=import-outside-toplevel
  hf, run, back = _write_hf(tmp_path / "hf", tensors), tmp_path / "run", tmp_path / "back"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  for signame, code, at, flags, out in (
      ("SIGINT", 130, "/run.json.tmp", [f"--from_hf={hf}"], tmp_path / "again"),
      ("SIGTERM", 75, "/config.json.tmp", [f"--to_hf={run}"], back)):
    done = cli(signame, at, "--", "convert", *flags, f"--output_dir={out}",
               module="tests.signal_at_write", timeout=300)
    assert done.returncode == code, done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"axtrain: {signame}: stopped; removed its partial output "
                           f"{tmp_path}/.{out.name}.") and last.endswith(f".tmp (exit {code})"), last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]


def test_a_killed_converts_staging_folder_is_removed_by_the_next(tmp_path, capsys, tensors):
  """Hidden staging folders beside --output_dir: one a killed convert left (no process holds its
  lock) is removed with a note by the next convert to that folder; one a live convert is
  writing (its lock held) and a folder that is no staging folder are left alone."""
  import fcntl  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  hf, out = _write_hf(tmp_path / "hf", tensors), tmp_path / "out"
  stale, live, other = (tmp_path / n for n in (".out.k3_9zq0a.tmp", ".out.live0001.tmp",
                                               ".out.backup.tmp"))
  for folder in (stale, live, other):
    folder.mkdir()
    (folder / "config.json").write_text("{}")
  fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    code, err = _convert(capsys, f"--from_hf={hf}", f"--output_dir={out}")
  finally:
    os.close(fd)
  assert code == 0, err
  assert (f"axtrain: note: convert: removed {stale}, the partial output of an earlier convert "
          f"to {out} that was stopped before it could clean up\n") in err
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      ["hf", "out", live.name, other.name])


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


def _text_kinds() -> list[str]:
  from trainer.data.corpus import document_kinds  # pylint: disable=import-outside-toplevel
  return [*document_kinds(), "stdlib"]


def test_every_text_kind_reads_with_the_converted_models_tokenizer(tmp_path, capsys, tensors,
                                                                   monkeypatch):
  """config.py names the tokenizer (the folder's tokenizer.json; --tokenizer, given relative to
  the directory convert ran in), so a switch from its synthetic data to any text kind keeps it
  without tokenizer flags, from any directory; the data of a model whose tokenizer is not known
  (121 or 300 ids, no tokenizer.json) names none, and every text kind then refuses in one line
  that names the fix, never the bytes tokenizer and never model.vocab_size."""
  from launcher import config_loading  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib  # pylint: disable=import-outside-toplevel
  _word_tokenizer(tmp_path / "words.json")
  folder = _write_hf(tmp_path / "own", tensors)
  _word_tokenizer(folder / "tokenizer.json")
  monkeypatch.chdir(tmp_path)
  runs = {tmp_path / "own_run": ([f"--from_hf={folder}"], str(folder / "tokenizer.json")),
          tmp_path / "flag_run": ([f"--from_hf={_write_hf(tmp_path / 'bare', tensors)}",
                                   "--tokenizer=words.json"], str(tmp_path / "words.json"))}
  for vocab in (121, 300):
    hf = _gpt2_with_vocab(tmp_path / str(vocab), tensors, vocab)
    runs[tmp_path / f"run{vocab}"] = ([f"--from_hf={hf}"], None)
  for run, (args, path) in runs.items():
    assert _convert(capsys, *args, f"--output_dir={run}")[0] == 0
  monkeypatch.chdir(tmp_path / "own")
  for run, (_, path) in runs.items():
    for kind in _text_kinds():
      where = [] if kind == "stdlib" else ["--config.data.path=corpus"]
      cfg = config_loading.load(str(run / "config.py"), f"--config.data.kind={kind}", *where)
      if path is not None:
        assert cfg.data.tokenizer.to_dict() == {"kind": "huggingface", "path": path,
                                                "add_bos": False, "add_eos": True}, (run, kind)
        continue
      with pytest.raises(ConfigError) as refused:
        config_lib.parse(json.loads(cfg.to_json_best_effort()))
      assert str(refused.value).startswith(f"data.tokenizer: required field of data '{kind}' is "
                                           f"missing (the data kind it was switched from names "
                                           f"no tokenizer; name the model's: --config.data."
                                           f"tokenizer.kind=huggingface --config.data.tokenizer."
                                           f"path=PATH/TO/tokenizer.json"), str(refused.value)
    if path is None:  # the command line: one line, exit 2, nothing written
      (tmp_path / "corpus.jsonl").write_text('{"text": "the cat sat on the mat"}\n' * 50)
      code = main_lib.main(["axtrain", f"--config={run}/config.py", f"--output_dir={run}",
                            "--config.data.kind=jsonl",
                            f"--config.data.path={tmp_path / 'corpus.jsonl'}"])
      err = capsys.readouterr().err
      assert code == 2 and err.count("\n") == 1 and "model.vocab_size" not in err, err
      assert "--config.data.tokenizer.kind=huggingface" in err, err
      assert json.loads((run / "run.json").read_text())["status"] == "converted"
      # A tokenizer field set without its kind: how to turn the tokenizer on, not "a value".
      code = main_lib.main(["axtrain", f"--config={run}/config.py", "--config.data.kind=jsonl",
                            "--config.data.path=corpus.jsonl", "--config.data.tokenizer.path=t",
                            "--print_config"])
      assert code == 2 and capsys.readouterr().err == (
          "axtrain: error: --config.data.tokenizer.path: 'data.tokenizer' is off (None); turn it "
          "on first with --config.data.tokenizer.kind=KIND (bytes, huggingface, sentencepiece), "
          "then set its fields\n")


def _write_qwen3(path: pathlib.Path) -> pathlib.Path:
  """A tiny Qwen3ForCausalLM folder (1 layer, QK-norm, GQA, 256 ids, no tokenizer.json), its
  tensors named and shaped by the Qwen3 map, random."""
  from modules.hf_maps import FAMILIES  # pylint: disable=import-outside-toplevel
  cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 256,
         "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
         "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps(cfg))
  rng = np.random.default_rng(0)
  save_file({k: (0.1 * rng.normal(size=s)).astype(np.float32)
             for k, s in FAMILIES["Qwen3ForCausalLM"].hf_shapes(cfg).items()},
            str(path / "model.safetensors"))
  return path


def test_a_converted_model_fine_tunes_on_a_jsonl_corpus_with_its_docstring_command(tmp_path,
                                                                                   capsys):
  """The corpus command that config.py prints, run as printed in a fresh `axtrain` process
  (one that has imported no registry before the config file), trains the converted weights on
  a JSONL file: the file imports nothing that registers components, and the loader must."""
  from tests.conftest import cli  # pylint: disable=import-outside-toplevel
  hf = _write_qwen3(tmp_path / "hf")
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]
  rng = np.random.default_rng(0)
  (tmp_path / "corpus.jsonl").write_text("".join(
      json.dumps({"text": " ".join(rng.choice(words, 30))}) + "\n" for _ in range(200)))
  line = _corpus_line(run)
  assert line == (f"axtrain --config={run}/config.py --output_dir={run} --config.data.kind=jsonl "
                  f"--config.data.path=corpus.jsonl")
  done = cli(*line.split()[1:], cwd=tmp_path)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "resumed from checkpoint step 0" in done.stderr  # the converted weights
  info = json.loads((run / "run.json").read_text())
  assert info["status"] == "completed" and info["architecture"] == "Qwen3ForCausalLM"
  data = json.loads((run / "config.json").read_text())["data"]
  assert (data["kind"], data["path"], data["tokenizer"]["kind"]) == ("jsonl", "corpus.jsonl",
                                                                     "bytes")
  records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
  losses = [r["loss"] for r in records if "loss" in r]
  assert records[-2]["step"] == 1000 and losses[-1] < losses[0], losses


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
                               "LlamaForCausalLM: model.block.ffn.kind is 'moe' (LlamaForCausalLM takes "
                               "only 'mlp')\n"), err
  assert not (tmp_path / "hf").exists()


def test_output_inside_a_run_is_refused_and_the_run_left_alone(tmp_path, capsys, tensors):
  """Either direction's output inside a run directory would be a folder that run did not write
  (from_hf: a run nested in a run), after which the run can no longer be resumed or extended;
  both are refused before anything is written."""
  hf = _write_hf(tmp_path / "hf", tensors)
  run = tmp_path / "run"
  assert _convert(capsys, f"--from_hf={hf}", f"--output_dir={run}")[0] == 0
  before = sorted(p.relative_to(run) for p in run.rglob("*"))
  for args in ([f"--from_hf={hf}", f"--output_dir={run / 'sub'}"],
               [f"--to_hf={run}", f"--output_dir={run / 'checkpoints' / 'hf'}"]):
    code, err = _convert(capsys, *args)
    assert code == 2 and err.count("\n") == 1, err
    assert f"is inside the run directory {run}" in err and "choose a path outside it" in err
  assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
