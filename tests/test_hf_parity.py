"""Parity with Hugging Face: a tiny random model of every registered family (its `example`
config), built by transformers, converted both ways.

transformers and torch are test extras (`pip install -e '.[hf]'`); they are
imported only here.
"""

import json
import pathlib

import numpy as np
import pytest

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from launcher import convert  # noqa: E402
from modules.hf_maps import FAMILIES  # noqa: E402

TOKENS = np.array([[5, 17, 99, 3, 64, 120, 7, 42, 11, 2, 90, 33],
                   [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])


def transformers_model(family, example=None):
  """The family's example config (or `example`) built by transformers, with random
  one-dimensional parameters (norm scales, biases: initialised to ones and zeros, they would
  hide a swapped or dropped one)."""
  cfg = transformers.AutoConfig.for_model(family.name, **(example or family.example))
  model = transformers.AutoModelForCausalLM.from_config(cfg)
  assert type(model).__name__ == family.architecture
  with torch.no_grad():
    for p in model.parameters():
      if p.ndim == 1:
        p.uniform_(0.5, 1.5)
  return model


def _logits_ours(run_dir: pathlib.Path):
  """Logits of the converted run directory, restored the way `axtrain convert --to_hf` does."""
  import jax

  exp = convert.experiment_of(json.loads((run_dir / "config.json").read_text()))
  params = convert._load_params(run_dir, convert.abstract_params(exp))
  return np.asarray(jax.jit(exp.model.apply)({"params": params}, TOKENS))


def convert_both_ways(family, root: pathlib.Path, example=None, layout: tuple[str, ...] = ()):
  """A random model of `family` (its `example`, or `example`) saved under root/hf, converted to
  root/run (with the convert flags `layout`) and back to root/back; its transformers logits on
  TOKENS."""
  torch.manual_seed(0)
  hf = transformers_model(family, example).eval()
  hf.save_pretrained(root / "hf")
  with torch.no_grad():
    expected = hf(torch.tensor(TOKENS)).logits.numpy()
  # In-process (the CLI paths are covered by tests/test_convert.py): saves two jax start-ups.
  assert convert.main(["axtrain", f"--from_hf={root / 'hf'}", f"--output_dir={root / 'run'}",
                       *layout]) == 0
  assert convert.main(["axtrain", f"--to_hf={root / 'run'}", f"--output_dir={root / 'back'}"]) == 0
  return expected


def _fused_flags(family) -> tuple[str, ...]:
  """The convert flags that fuse every projection the family's model has: q/k/v, and gate/up
  where its MLP is gated (GPT-2's is not)."""
  gated = '"gated": true' in family.model_node(family.example).to_json()
  return ("--fused_qkv", "--fused_gate_up") if gated else ("--fused_qkv",)


# Both parameter layouts of the model: its projections separate (convert's default) or fused
# (attention.fused_qkv, mlp.fused_gate_up), which the maps split and fuse (modules/hf_maps.py).
SEPARATE = [(name, "separate") for name in FAMILIES]
BOTH = SEPARATE + [(name, "fused") for name in FAMILIES]


@pytest.fixture(scope="module")
def converted(request, tmp_path_factory):
  """A random model of a registered family (its `example`), converted to a run directory in a
  layout (request.param: (architecture, layout)) and back, and its logits on TOKENS."""
  name, layout = request.param
  family = FAMILIES[name]
  root = tmp_path_factory.mktemp(f"{family.name}-{layout}")
  flags = _fused_flags(family) if layout == "fused" else ()
  expected = convert_both_ways(family, root, layout=flags)
  run = json.loads((root / "run" / "config.json").read_text())
  assert (f'"fused_qkv": {str(bool(flags)).lower()}' in json.dumps(run["model"])), flags
  return root, expected


def _ids(param) -> str:
  return "-".join(param)


def _assert_logits_match(run_dir: pathlib.Path, expected):
  got = _logits_ours(run_dir)
  vocab = expected.shape[-1]
  assert got.shape[-1] == 128 and np.all(got[..., vocab:] == np.finfo(got.dtype).min)
  got = got[..., :vocab]
  diff = float(np.max(np.abs(got - expected)))
  print(f"max abs logits diff {diff:.3g}")
  assert diff < 1e-4


@pytest.mark.parametrize("converted", BOTH, indirect=True, ids=_ids)
def test_logits_match_transformers(converted):
  root, expected = converted
  _assert_logits_match(root / "run", expected)


def test_qwen3_with_a_sliding_window_in_every_layer(tmp_path):
  """Qwen3's window fields (use_sliding_window, sliding_window 5 < the 12 tokens, every layer
  sliding): read as attention.sliding_window, logits equal, and written back as such."""
  family = FAMILIES["Qwen3ForCausalLM"]
  example = {**family.example, "use_sliding_window": True, "sliding_window": 5,
             "max_window_layers": 0}
  expected = convert_both_ways(family, tmp_path, example)
  run = json.loads((tmp_path / "run" / "config.json").read_text())
  assert run["model"]["block"]["attention"]["sliding_window"] == 5
  _assert_logits_match(tmp_path / "run", expected)
  back = json.loads((tmp_path / "back" / "config.json").read_text())
  assert (back["use_sliding_window"], back["sliding_window"], back["layer_types"]) == (
      True, 5, ["sliding_attention"] * 2)


@pytest.mark.parametrize("converted", [("Gemma3ForCausalLM", "separate")], indirect=True,
                         ids=_ids)
def test_gemma3_layers_past_whole_groups_are_the_group_s_remainder(converted):
  """The example's 8 layers (two groups of sliding, sliding, full, then two sliding): one group
  of three scanned twice and its first two layers after it, written back as HF's 8 layers."""
  root, _ = converted
  model = json.loads((root / "run" / "config.json").read_text())["model"]
  assert model["block"]["pattern"] == ["sliding", "sliding", "full"]
  assert model["block"]["remainder"] == "first" and model["num_layers"] == 8
  back = json.loads((root / "back" / "config.json").read_text())
  assert back["layer_types"] == FAMILIES["Gemma3ForCausalLM"].example["layer_types"]


@pytest.mark.parametrize("converted", BOTH, indirect=True, ids=_ids)
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


@pytest.mark.parametrize("converted", SEPARATE, indirect=True, ids=_ids)
def test_what_the_map_writes_alone_makes_the_same_model(converted):
  """The HF config the map writes, without the source's config.json that `--to_hf` merges it
  into, is enough for transformers to compute the same logits: a setting that a map leaves to
  its default although the example sets it otherwise (rms_norm_eps, rope_theta, ...) shows."""
  from core.registry import registry
  from modules.hf_maps import family_of_model
  root, expected = converted
  m = registry("model").parse(json.loads((root / "run" / "config.json").read_text())["model"],
                              "model")
  source = json.loads((root / "run" / "run.json").read_text())["architecture"]
  family = family_of_model(m, source=source)  # as `--to_hf` chooses it
  assert family.architecture == source
  written = {k: v for k, v in family.hf_config(m).items() if k != "model_type"}
  cfg = transformers.AutoConfig.for_model(family.name, **written)
  model = transformers.AutoModelForCausalLM.from_pretrained(root / "back", config=cfg).eval()
  with torch.no_grad():
    np.testing.assert_array_equal(model(torch.tensor(TOKENS)).logits.numpy(), expected)
