"""A converted model trains on a corpus: every text kind read with the model's tokenizer, and a
Qwen3 model fine-tuned on JSON Lines by its config's docstring command (split from
tests/test_convert.py, whose GPT-2 directory and word tokenizer it uses)."""

import json
import pathlib

import numpy as np
import pytest
from safetensors.numpy import save_file

from core.registry import ConfigError
from launcher import main as main_lib
from tests.test_convert import (_convert, _corpus_line, _gpt2_tensors, _gpt2_with_vocab,
                                _word_tokenizer, _write_hf)


@pytest.fixture(scope="module")
def tensors():
  return _gpt2_tensors(np.random.default_rng(0))


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
