"""Parity with Hugging Face: tiny random models built by transformers, converted both ways.

transformers and torch are test extras (`pip install -e '.[hf]'`); they are
imported only here.
"""

import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from launcher import convert  # noqa: E402

TOKENS = np.array([[5, 17, 99, 3, 64, 120, 7, 42, 11, 2, 90, 33],
                   [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])


def _llama():
  cfg = transformers.LlamaConfig(
      vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=64,
      rope_theta=500_000.0, tie_word_embeddings=False,
      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
  return transformers.LlamaForCausalLM(cfg)


def _qwen3():
  """LLaMA's shape with QK-norm (attention.norm) and a head_dim other than dim / heads."""
  cfg = transformers.Qwen3Config(
      vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
      max_position_embeddings=64, tie_word_embeddings=False)
  model = transformers.Qwen3ForCausalLM(cfg)
  with torch.no_grad():  # random norm scales, so that a swapped q_norm/k_norm shows
    for name, p in model.named_parameters():
      if name.endswith(("q_norm.weight", "k_norm.weight")):
        p.uniform_(0.5, 1.5)
  return model


def _gpt2():
  cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                bos_token_id=0, eos_token_id=0)
  return transformers.GPT2LMHeadModel(cfg)


def _logits_ours(run_dir: pathlib.Path):
  """Logits of the converted run directory, restored the way `axtrain convert --to_hf` does."""
  import jax

  exp = convert.experiment_of(json.loads((run_dir / "config.json").read_text()))
  params = convert._load_params(run_dir, convert.abstract_params(exp))
  return np.asarray(jax.jit(exp.model.apply)({"params": params}, TOKENS))


@pytest.fixture(scope="module", params=["llama", "qwen3", "gpt2"])
def converted(request, tmp_path_factory):
  torch.manual_seed(0)
  hf = {"llama": _llama, "qwen3": _qwen3, "gpt2": _gpt2}[request.param]().eval()
  root = tmp_path_factory.mktemp(request.param)
  hf.save_pretrained(root / "hf")
  with torch.no_grad():
    expected = hf(torch.tensor(TOKENS)).logits.numpy()
  # In-process (the CLI paths are covered by tests/test_convert.py): saves two jax start-ups.
  assert convert.main(["axtrain", f"--from_hf={root / 'hf'}", f"--output_dir={root / 'run'}"]) == 0
  assert convert.main(["axtrain", f"--to_hf={root / 'run'}", f"--output_dir={root / 'back'}"]) == 0
  return root, expected


def test_logits_match_transformers(converted):
  root, expected = converted
  got = _logits_ours(root / "run")
  diff = float(np.max(np.abs(got - expected)))
  print(f"max abs logits diff {diff:.3g}")
  assert diff < 1e-4


def test_round_trip_reproduces_every_tensor(converted):
  from safetensors.numpy import load_file
  root, expected = converted
  before = load_file(str(root / "hf" / "model.safetensors"))
  after = load_file(str(root / "back" / "model.safetensors"))
  assert sorted(before) == sorted(after)
  for name, tensor in before.items():
    assert after[name].dtype == tensor.dtype, name
    np.testing.assert_array_equal(after[name], tensor, err_msg=name)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(root / "back").eval()
  with torch.no_grad():
    np.testing.assert_array_equal(reloaded(torch.tensor(TOKENS)).logits.numpy(), expected)
