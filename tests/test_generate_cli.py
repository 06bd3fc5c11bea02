"""`axtrain generate`: greedy parity with transformers on converted models, the CLI, bad input."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launcher import convert, generate as generate_cli
from launcher import main as main_lib
from modules.hf_maps import FAMILIES

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

PROMPTS = [[5, 17, 99, 3, 64, 120, 7], [1, 2, 3, 4]]


# Gemma 2 and 3 (14 s of the quick suite on 2 cores) in the slow lane: their logits against
# transformers' stay in the quick one (tests/test_hf_parity.py), and so does their cache against
# their own forward pass (tests/test_generate.py)
_SLOW = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a in _SLOW else a
                                  for a in FAMILIES])
def test_greedy_equals_transformers_generate(tmp_path, arch):
  """Every registered family's example, as tests/test_hf_parity.py builds it."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests import test_hf_parity
  from trainer.generate import SamplingOptions, generate

  torch.manual_seed(0)
  hf = test_hf_parity.transformers_model(FAMILIES[arch]).eval()
  hf.save_pretrained(tmp_path / "hf")
  assert convert.main(["axtrain", f"--from_hf={tmp_path / 'hf'}",
                       f"--output_dir={tmp_path / 'run'}"]) == 0
  exp = convert.experiment_of(json.loads((tmp_path / "run" / "config.json").read_text()))
  model = exp.model
  params = convert._load_params(tmp_path / "run", convert.abstract_params(exp))

  batch = np.zeros((2, 7), np.int32)
  for i, p in enumerate(PROMPTS):
    batch[i, :len(p)] = p
  out = generate(params, jnp.asarray(batch), jnp.asarray([7, 4], jnp.int32), jax.random.key(0),
                 model=model, options=SamplingOptions(max_new_tokens=20, temperature=0.0))
  # Ours never stops (eos_id None); transformers' min_new_tokens would instead forbid the
  # config's EOS id (MistralConfig's 2, which the Mistral example's greedy picks at token 14).
  hf.generation_config.eos_token_id = None
  for i, prompt in enumerate(PROMPTS):  # transformers one prompt at a time: no padding
    with torch.no_grad():
      want = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20,
                         pad_token_id=0)[0, len(prompt):].numpy()
    np.testing.assert_array_equal(np.asarray(out.tokens[i]), want, err_msg=f"prompt {i}")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A `test`-size LLaMA run directory with random parameters: config.json + a step-0 checkpoint."""
  from configs.base import lm_config
  from modules import llama
  from modules.decoder import MODELS
  from trainer import checkpoint, config as config_lib

  cfg = lm_config(llama.model_node("test"), max_steps=10, learning_rate=1e-3, batch_size=2,
                  seq_len=32, warmup_steps=1)
  cfg.model.scan_layers = False
  resolved = json.loads(cfg.to_json_best_effort())
  model = MODELS.build(config_lib.parse(resolved).model)
  boxed = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, boxed,
                        is_leaf=lambda x: hasattr(x, "unbox"))
  path = tmp_path_factory.mktemp("gen") / "run"
  path.mkdir()
  (path / "config.json").write_text(json.dumps(resolved))
  checkpoint.write_initial(path, {"params": params})
  return path


def _generate(capsys, *args) -> tuple[int, str, str]:
  code = main_lib.main(["axtrain", "generate", *map(str, args)])
  out = capsys.readouterr()
  return code, out.out, out.err


def test_cli_prints_continuations_and_json(run_dir, tmp_path, capsys):
  code, out, _ = _generate(capsys, f"--run_dir={run_dir}", "--prompt=def f(x):",
                           "--max_new_tokens=8", "--temperature=0", "--json")
  assert code == 0
  (result,) = [json.loads(line) for line in out.splitlines()]
  assert result["prompt_ids"] == list(b"def f(x):")
  assert 1 <= len(result["ids"]) <= 8 and (len(result["ids"]) == 8) == (result["stop"] == "length")
  assert result["text"] == bytes(result["ids"]).decode("utf-8", errors="replace")

  prompts = tmp_path / "prompts.txt"
  prompts.write_text("import os\ndef f(x):\n")
  code, out, _ = _generate(capsys, f"--run_dir={run_dir}", f"--prompt_file={prompts}",
                           "--max_new_tokens=8", "--temperature=0", "--json", "--step=0")
  assert code == 0
  both = [json.loads(line) for line in out.splitlines()]
  assert [r["prompt"] for r in both] == ["import os", "def f(x):"]
  assert both[1]["ids"] == result["ids"], "batched with another prompt, the tokens changed"

  code, out, _ = _generate(capsys, f"--run_dir={run_dir}", "--prompt=def f(x):",
                           "--max_new_tokens=8", "--temperature=0")
  assert code == 0 and out == result["text"] + "\n"


def test_a_relative_run_dir_works(run_dir, capsys, monkeypatch):
  """As `make demo` calls it: --run_dir=runs/demo (Orbax reads absolute paths only)."""
  monkeypatch.chdir(run_dir.parent)
  code, out, err = _generate(capsys, f"--run_dir={run_dir.name}", "--prompt=def f(x):",
                             "--max_new_tokens=4", "--temperature=0")
  assert code == 0, err


def test_cli_cuts_max_new_tokens_to_the_model_length(run_dir, capsys):
  code, out, err = _generate(capsys, f"--run_dir={run_dir}", "--prompt=" + "x" * 28,
                             "--max_new_tokens=50", "--top_k=5", "--json")
  assert code == 0 and "max_new_tokens cut to 4" in err
  assert len(json.loads(out)["ids"]) <= 4


@pytest.mark.parametrize("args,message", [
    (["--prompt=hi"], "holds no checkpoint"),
    (["--prompt="], "--prompt is empty"),
    (["--prompt=" + "x" * 40], "a prompt is 40 tokens long but the model's maximum length is 32"),
    (["--prompt=hi", "--temperature=-0.5"], "temperature must be a finite number >= 0"),
    (["--prompt=hi", "--temperature=nan"], "temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (["--prompt=hi", "--temperature=inf"], "temperature must be a finite number >= 0 (0 = greedy), got inf"),
    (["--prompt=hi", "--top_p=0"], "top_p must be in (0, 1]"),
    (["--prompt=hi", "--top_p=1.5"], "top_p must be in (0, 1]"),
    (["--prompt=hi", "--top_k=-1"], "top_k must be >= 0"),
    (["--prompt_file=/nonexistent/prompts.txt"], "/nonexistent/prompts.txt does not exist"),
    (["--prompt_file=/"], "--prompt_file / is a directory, not a file"),
    (["--prompt=hi", "--step=7"], "no committed checkpoint of step 7; steps: 0"),
    (["--prompt=hi", "--temprature=1"], "did you mean 'temperature'"),
    (["--prompt=hi", "--top_k=two"], "--top_k must be an integer, got 'two'"),
    (["--prompt=hi", "--seed=-1"], "--seed must be a whole number in [0, 2**63), got -1"),
])
def test_bad_input_is_one_line_exit_2(run_dir, tmp_path, capsys, args, message):
  target = run_dir
  if message == "holds no checkpoint":
    target = tmp_path / "empty"
    target.mkdir()
    (target / "config.json").write_text((run_dir / "config.json").read_text())
  code, out, err = _generate(capsys, f"--run_dir={target}", *args)
  assert code == 2 and out == ""
  assert err.startswith("axtrain: error: ") and err.count("\n") == 1, err
  assert message in err, err


def test_a_hugging_face_folder_is_told_to_convert_into_a_new_run_directory(tmp_path, capsys):
  """Not 'convert a model into it', which convert refuses for a folder that is not a run."""
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text(json.dumps({"model_type": "llama",
                                              "architectures": ["LlamaForCausalLM"]}))
  (hf / "model.safetensors").write_bytes(b"")
  code, out, err = _generate(capsys, f"--run_dir={hf}", "--prompt=hi")
  assert code == 2 and out == "" and err == (
      f"axtrain: error: generate: {hf} is a Hugging Face model, not a run directory; convert it "
      f"into a new one, `axtrain convert --from_hf={hf} --output_dir=NEW_RUN`, then `axtrain "
      f"generate --run_dir=NEW_RUN`\n"), err


def test_max_length_of_a_converted_model_comes_from_its_hf_config(tmp_path):
  from trainer import config as config_lib
  from configs.base import lm_config
  from modules import llama
  run = config_lib.parse(json.loads(lm_config(
      llama.model_node("test"), max_steps=1, learning_rate=1e-3, batch_size=1, seq_len=16,
      warmup_steps=1).to_json_best_effort()))
  assert generate_cli.max_length(run, pathlib.Path(tmp_path)) == 16
  (tmp_path / "hf_config.json").write_text(json.dumps({"max_position_embeddings": 64}))
  assert generate_cli.max_length(run, pathlib.Path(tmp_path)) == 64


TEXT = "def parse(self, text): return [line.strip() for line in text.splitlines()]"


def _spm(tmp_path):
  import sentencepiece as spm
  (tmp_path / "corpus.txt").write_text(TEXT * 20)
  spm.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(
      tmp_path / "sp"), vocab_size=40, model_type="bpe", character_coverage=1.0,
      hard_vocab_limit=False, minloglevel=2)
  return str(tmp_path / "sp.model")


def _hf(tmp_path):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator([TEXT] * 20, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<s>", "</s>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(tmp_path / "tokenizer.json"))
  return str(tmp_path / "tokenizer.json")


@pytest.mark.parametrize("kind,make", [("bytes", None), ("sentencepiece", _spm),
                                       ("huggingface", _hf)])
def test_run_tokenizer_encodes_prompts_without_eos_and_decodes_back(tmp_path, kind, make):
  node = {"kind": kind, "add_bos": kind != "bytes", "add_eos": True}
  if make:
    node["path"] = make(tmp_path)
  tok = generate_cli.run_tokenizer({"data": {"kind": "jsonl", "tokenizer": node}})
  (ids,) = tok.encode([TEXT])
  assert tok.eos_id not in ids.tolist()
  body = ids[1:] if node["add_bos"] else ids
  assert node["add_bos"] == (ids[0] == tok.bos_id)
  assert tok.decode(body) == TEXT


def test_a_converted_model_samples_with_its_own_tokenizer_or_names_the_fix(tmp_path, capsys):
  """A model converted from a folder with a tokenizer.json encodes prompts with it (its data is
  synthetic; config.py names the tokenizer); one converted without a known tokenizer (16 ids,
  not the bytes tokenizer's 256) is refused in one line that says how to convert it with one."""
  from tests import test_convert  # pylint: disable=import-outside-toplevel
  tensors = test_convert._gpt2_tensors(np.random.default_rng(0))
  own = test_convert._write_hf(tmp_path / "own", tensors)
  test_convert._word_tokenizer(own / "tokenizer.json")
  bare = test_convert._write_hf(tmp_path / "bare", tensors)
  for hf in (own, bare):
    assert convert.main(["axtrain", f"--from_hf={hf}",
                         f"--output_dir={tmp_path / hf.name}_run"]) == 0
  capsys.readouterr()
  code, out, err = _generate(capsys, f"--run_dir={tmp_path / 'own_run'}", "--prompt=the cat sat",
                             "--max_new_tokens=3", "--temperature=0", "--json")
  assert code == 0, err
  result = json.loads(out)
  assert result["prompt_ids"] == [2, 3, 4]  # the words' ids in tokenizer.json, not UTF-8 bytes
  words = test_convert.WORDS
  assert result["text"] == " ".join(([None, None] + words)[i] for i in result["ids"])
  code, out, err = _generate(capsys, f"--run_dir={tmp_path / 'bare_run'}", "--prompt=the cat")
  assert code == 2 and out == "" and err.count("\n") == 1, err
  assert err == (f"axtrain: error: generate: the run names no tokenizer (data.kind=synthetic) and "
                 f"its model's {test_convert.V} ids are not the bytes tokenizer's 256; convert it "
                 f"again with its tokenizer: axtrain convert --from_hf={bare.resolve()} "
                 f"--tokenizer=PATH/TO/tokenizer.json --output_dir=NEW_RUN_DIR\n"), err


@pytest.mark.parametrize("vocab", [256, 512])
def test_a_run_that_names_no_tokenizer_reads_bytes_only_with_their_vocabulary(vocab):
  """Synthetic data naming no tokenizer: bytes for a 256-id model; any other model's ids are not
  UTF-8 bytes, so generate refuses, naming the tokenizer flags a training run takes."""
  from launcher.errors import UserError  # pylint: disable=import-outside-toplevel
  cfg = {"model": {"vocab_size": vocab}, "data": {"kind": "synthetic", "tokenizer": None}}
  if vocab == 256:
    assert generate_cli.run_tokenizer(cfg).encode(["hi"])[0].tolist() == list(b"hi")
    return
  with pytest.raises(UserError, match=r"^generate: the run names no tokenizer \(data.kind="
                     r"synthetic\) and its model's 512 ids are not the bytes tokenizer's 256; "
                     r"train with one named: --config.data.tokenizer.kind=huggingface "
                     r"--config.data.tokenizer.path=PATH/TO/tokenizer.json$"):
    generate_cli.run_tokenizer(cfg)


def test_docs_name_real_code():
  """Every `path.py:name` that docs/generate.md cites exists."""
  import importlib
  import re
  root = pathlib.Path(__file__).resolve().parents[1]
  cited = set(re.findall(r"`([\w/]+)\.py:(\w+)`", (root / "docs" / "generate.md").read_text()))
  assert len(cited) >= 4
  for path, name in sorted(cited):
    assert hasattr(importlib.import_module(path.replace("/", ".")), name), f"{path}.py:{name}"
