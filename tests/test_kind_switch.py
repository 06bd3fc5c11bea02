"""`--config.<path>.kind=K` for every registry: K's node replaces the old one (fields both
kinds have carry over), the other overrides then set K's fields, and the run trains.

Each switch of tests/test_golden_configs.py:SWITCHES is loaded as the CLI loads it and
its node checked to hold exactly K's fields; then one command with all of them at once
trains 3 steps of configs/tiny.py in-process (one compile: this machine has 2 cores).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, Literal

import pytest
from absl import flags

from core import paths
from core.registry import REQUIRED, ConfigError, Registry, registry
from launcher import config_loading, main as main_lib
from tests.conftest import ROOT
from tests.test_golden_configs import SWITCHES
from trainer import config as config_lib, experiment, loop, meshes
from trainer.data.mixture import component

TINY = str(ROOT / "configs" / "tiny.py")
SMALL = ["--config.trainer.max_steps=3", "--config.optimizer.schedule.warmup_steps=0",
         "--config.trainer.log_every=1", "--config.data.seq_len=32",
         "--config.data.batch_size=8", "--config.eval.batch_size=8", "--config.eval.num_batches=1",
         "--config.eval.every_steps=0", "--config.model.num_layers=1",
         "--config.trainer.hang_timeout_s=0", "--progress=false"]


def words(i: int) -> str:
  return f"document {i}: " + " ".join(["alpha", "beta", "gamma", "delta"][j % 4] for j in range(i % 17 + 5))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("switch")
  (root / "corpus.jsonl").write_text("".join(json.dumps({"text": words(i)}) + "\n"
                                             for i in range(200)))
  (root / "txt").mkdir()
  for i in range(50):
    (root / "txt" / f"{i}.txt").write_text(words(i + 1000))
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.train_from_iterator([words(i) for i in range(200)], trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<s>", "</s>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(root / "tokenizer.json"))
  return root


def overrides_for(name: str, files) -> list[str]:
  """SWITCHES[name] with file paths that exist (the golden test only prints them)."""
  out = []
  for arg in SWITCHES[name][1]:
    out.append(arg.replace("=corpus.jsonl", f"={files / 'corpus.jsonl'}")
               .replace("=tokenizer.json", f"={files / 'tokenizer.json'}"))
  if name == "tokenizer":  # a real tokenizer, on a small corpus
    out += ["--config.data.kind=jsonl", f"--config.data.path={files / 'corpus.jsonl'}",
            "--config.model.vocab_size=512"]
  return out


def load(*overrides):
  argv = ["axtrain", f"--config={TINY}", *overrides]
  fv = flags.FlagValues()
  config_loading.define(fv, argv)
  fv(argv)
  return fv["config"].value


def run(capsys, *args):
  code = main_lib.main(["axtrain", f"--config={TINY}", *args])
  out, err = capsys.readouterr()
  return code, out, err


def exact_fields(cfg, name: str) -> bool:
  node = paths.get_path(cfg, SWITCHES[name][0])
  fields = {f.name for f in dataclasses.fields(registry(name).entry(node["kind"]).config_cls)}
  return set(node.keys()) == fields


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_switch_gives_exactly_the_new_kinds_fields(name, files):
  cfg = load(*overrides_for(name, files))
  assert exact_fields(cfg, name)
  assert paths.get_path(cfg, SWITCHES[name][0] + ".kind") == SWITCHES[name][1][0].split("=")[1]
  config_lib.parse(cfg)


def test_a_switch_per_registry_in_one_command_trains_3_steps(capsys, tmp_path, files):
  args = [a for name in sorted(SWITCHES) for a in overrides_for(name, files)]
  code, _, err = run(capsys, *args, *SMALL, f"--output_dir={tmp_path / 'run'}")
  assert code == 0, err
  resolved = json.loads((tmp_path / "run" / "config.json").read_text())
  for name in SWITCHES:
    assert exact_fields(resolved, name), name
  assert resolved["model"]["block"]["ffn"]["kind"] == "moe"
  assert resolved["data"]["tokenizer"]["kind"] == "huggingface"
  records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]


def test_switches_apply_parents_first_whatever_the_order():
  args = ["--config.model.block.attention.position.kind=none",
          "--config.model.block.ffn.num_experts=4", "--config.model.block.ffn.kind=moe",
          "--config.model.block.kind=parallel", "--config.model.block.ffn.top_k=1"]
  for argv in (args, args[::-1]):
    cfg = load(*argv)
    assert cfg.model.block.kind == "parallel" and "separate_norms" in cfg.model.block
    assert dict(cfg.model.block.attention.position) == {"kind": "none"}
    assert cfg.model.block.ffn.kind == "moe" and cfg.model.block.ffn.top_k == 1
    assert cfg.model.block.ffn.hidden_dim == 512  # carried over from the mlp
    assert "use_bias" not in cfg.model.block.ffn  # the mlp's field, at its default: dropped


@pytest.mark.parametrize("args,message", [
    (["--config.model.block.ffn.use_bias=true", "--config.model.block.ffn.kind=moe"],
     "--config.model.block.ffn.use_bias: unknown field 'use_bias' of model.block.ffn (kind 'moe')"
     "; its fields: activation, aux_loss_coef, capacity_factor, gated, hidden_dim, init_std, "
     "kind, num_experts, renormalize, top_k"),
    (["--config.model.block.attention.position.kind=none",
      "--config.model.block.attention.position.theta=500000"],
     "--config.model.block.attention.position.theta: unknown field 'theta' of "
     "model.block.attention.position (kind 'none'); its fields: kind"),
    (["--config.data.field=body", "--config.data.kind=text", "--config.data.path=x"],
     "--config.data.field: unknown field 'field' of data (kind 'text')"),
    (["--config.model.block.ffn.kind=mope"],
     "model.block.ffn.kind: unknown ffn kind 'mope' (did you mean 'moe'?); registered: mlp, moe"),
    (["--config.data.tokenizer.kind=hugingface"],
     "data.tokenizer.kind: unknown tokenizer kind 'hugingface' (did you mean 'huggingface'?); "
     "registered: bytes, huggingface, sentencepiece"),
    (["--config.model.block.ffn.kind=moe"],
     "model.block.ffn.num_experts: required field of ffn 'moe' is missing"),
    (["--config.model.blok.kind=parallel"], "unknown field 'blok' of model (kind 'decoder_lm') "
                                           "(did you mean 'block'?)"),
    (["--config.trainer.kind=x"], "--config.trainer.kind: unknown field 'kind' of trainer; its "
                                  "fields: compile_cache, compute_dtype, "),
    (["--config.model=foo"], "--config.model=foo: 'model' is a section, not a value"),
    (["--config.model.scan_layers=yes"], "--config.model.scan_layers=yes: expected true or false"),
])
def test_bad_switch_is_one_line_and_exit_2(capsys, tmp_path, args, message):
  code, _, err = run(capsys, *args, f"--output_dir={tmp_path / 'run'}")
  assert code == 2 and err.count("\n") == 1 and err.startswith("axtrain: error: "), err
  assert message in err
  assert not (tmp_path / "run").exists()


def test_config_files_switch_with_the_same_function(files):
  cfg = load()
  cfg.unlock()
  node = config_lib.switch_kind(cfg, "data", "mixture", sources=(
      component("jsonl", path=str(files / "corpus.jsonl"), weight=3),
      component("text", path=str(files / "txt"), weight=1)))
  assert set(node.keys()) == {"kind", "seq_len", "batch_size", "sources"}
  assert (node.seq_len, node.batch_size) == (128, 8)  # carried over from the stdlib node
  cfg.data.seq_len, cfg.trainer.max_steps, cfg.eval.batch_size = 32, 3, 8
  cfg.optimizer.schedule.warmup_steps = 0
  cfg.trainer.log_every, cfg.eval.num_batches, cfg.model.num_layers = 1, 1, 1
  exp = experiment.build(config_lib.parse(cfg), meshes.lookup("cpu"))
  assert exp.source.counts == [6, 2]
  result = loop.train(exp)
  assert len([r for r in result.records if "loss" in r]) == 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class _First:
  kind: str = "first"
  x: int = 1
  y: str = "a"
  z: int = 5
  only_first: float = 0.5
  SHARED: ClassVar = ("x", "y")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Second:
  kind: str = "second"
  x: Literal["p", "q"] = "p"
  y: str = "b"
  z: int = 6
  needed: int = REQUIRED
  SHARED: ClassVar = ("x", "y", "needed")


_TOY = Registry("test_kind_switch_toy")
_TOY.register("first", _First)(object)
_TOY.register("second", _Second)(object)


def test_switched_carries_only_shared_fields_valid_for_the_new_kind():
  old = _TOY.node("first", x=3, y="kept", z=7)
  new = _TOY.switched(old, "second")
  # x is shared but 3 is not valid for "second"; z is in both kinds but not shared
  assert new.to_dict() == {"kind": "second", "x": "p", "y": "kept", "z": 6, "needed": None}
  assert [(d.name, d.value, d.new_default) for d in _TOY.not_carried(old, "second")] == [
      ("x", 3, "p"), ("z", 7, 6)]
  new.needed = 7  # the placeholder is typed: an int override type-checks
  with pytest.raises(TypeError):
    new.needed = "seven"
  with pytest.raises(ConfigError, match="required field of test_kind_switch_toy 'second'"):
    _TOY.parse(_TOY.switched(old, "second"), "toy")
  assert _TOY.switched(new, "first", only_first=2.0).to_dict() == {
      "kind": "first", "x": 1, "y": "kept", "z": 5, "only_first": 2.0}
  assert _TOY.switched(old, "first").to_dict() == old.to_dict()  # its own kind: all kept


def test_every_shared_name_is_a_field_of_its_registry():
  """A SHARED name that no kind of the registry has is a typo, which would carry nothing."""
  import configs.base  # noqa: F401  (every registry)
  from core import registry as registry_lib
  for reg in list(registry_lib._ALL.values()):  # pylint: disable=protected-access
    classes = [reg.entry(k).config_cls for k in reg.kinds()]
    names = {f.name for cls in classes for f in dataclasses.fields(cls)}
    declared = {n for cls in classes for n in getattr(cls, "SHARED", ())}
    assert declared <= names, (reg.name, declared - names)


def test_adamw_to_lion_takes_lions_own_betas_and_keeps_the_shared_fields(capsys):
  cfg = load("--config.optimizer.b2=0.9", "--config.optimizer.kind=lion")
  assert (cfg.optimizer.b1, cfg.optimizer.b2) == (0.9, 0.9)  # the command line sets b2 anyway
  cfg = load("--config.optimizer.kind=lion")
  assert cfg.optimizer.b2 == 0.99 and cfg.optimizer.learning_rate == 3e-3  # lion's b2; shared lr
  assert cfg.optimizer.schedule.warmup_steps == 20
  capsys.readouterr()


def test_schedule_switch_gives_the_new_kinds_end_ratio():
  """end_ratio is a final value in warmup_cosine and a floor in rsqrt: not carried."""
  cfg = load("--config.optimizer.schedule.kind=rsqrt")
  assert cfg.optimizer.schedule.end_ratio == 0.0 and cfg.optimizer.schedule.warmup_steps == 20


def test_a_switch_that_drops_a_value_the_config_file_set_says_so(capsys):
  """llm_1b sets rope_llama3's factor=32 (not its default); plain rope has no factor."""
  config_loading.load(str(ROOT / "configs" / "llm_1b.py"),
                      "--config.model.block.attention.position.kind=rope")
  err = capsys.readouterr().err
  assert err == ("axtrain: note: --config.model.block.attention.position.kind=rope drops "
                 "model.block.attention.position.factor=32.0 (kind 'rope' has no such field)\n")
  load("--config.model.block.ffn.kind=moe", "--config.model.block.ffn.num_experts=4")
  assert capsys.readouterr().err == ""  # mlp's fields that moe lacks are at their defaults


@pytest.fixture
def optional_child(monkeypatch):
  """Attention with an optional child (a norm node, None = off), as a later feature adds."""
  from core.registry import Component, child
  attention = registry("attention")
  entry = attention.entry("attention")

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class WithOptional(entry.config_cls):
    extra: Any = child("norm", None)

  monkeypatch.setitem(attention._entries, "attention",  # pylint: disable=protected-access
                      Component("attention", WithOptional, entry.target))
  return "model.block.attention.extra"


def test_an_optional_child_turns_on_with_its_kind_and_off_with_none(optional_child, capsys,
                                                                     tmp_path):
  path = optional_child
  assert load()[path.split(".")[0]].block.attention.extra is None
  cfg = load(f"--config.{path}.kind=layernorm", f"--config.{path}.eps=1e-3")
  assert dict(cfg.model.block.attention.extra) == {"kind": "layernorm", "eps": 1e-3,
                                                   "use_bias": True}
  on = tmp_path / "with_extra.py"  # a config file that turns it on
  on.write_text("from configs import tiny\nfrom core.registry import registry\n\n\n"
                "def get_config(arg=None):\n  cfg = tiny.get_config()\n"
                "  cfg.model.block.attention.extra = registry('norm').node('rmsnorm')\n"
                "  return cfg\n")
  assert config_loading.load(str(on)).model.block.attention.extra.kind == "rmsnorm"
  for cfg in (load(f"--config.{path}=None"),  # already off
              config_loading.load(str(on), f"--config.{path}=None")):
    assert cfg.model.block.attention.extra is None
    assert config_lib.parse(cfg).model.block.attention.extra is None
  code, _, err = run(capsys, f"--config.{path}.eps=1e-3", f"--output_dir={tmp_path / 'run'}")
  assert code == 2 and err == (
      f"axtrain: error: --config.{path}.eps: '{path}' is off (None); turn it on first with "
      f"--config.{path}.kind=KIND (layernorm, rmsnorm), then set its fields\n")
  code, _, err = run(capsys, f"--config.{path}=rmsnorm", f"--output_dir={tmp_path / 'run'}")
  assert code == 2 and f"turn it on with --config.{path}.kind=KIND (layernorm, rmsnorm)" in err
  code, _, err = run(capsys, "--config.model.block.attention=None",
                     f"--output_dir={tmp_path / 'run'}")
  assert code == 2 and "'model.block.attention' is a section, not a value" in err, err
  assert not (tmp_path / "run").exists()
