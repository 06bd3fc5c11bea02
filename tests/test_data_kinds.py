"""The contract of a data kind, checked for every registered kind: a file kind reads back what
it writes; a mixture's components share one tokenizer, and a kind that describes none mixes
only with its own kind (a one-line error otherwise)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import trainer.data  # noqa: F401  (registers the sources)
from core.registry import ConfigError, registry
from launcher import main as main_lib
from tests.conftest import ROOT
from trainer.data import documents
from trainer.data.base import DATA
from trainer.data.config import HeldOutConfig
from trainer.data.corpus import CorpusSource, Split, document_kinds, split_by_name
from trainer.data.mixture import component


@pytest.mark.parametrize("kind", document_kinds())
def test_each_file_kind_reads_back_what_it_writes(kind, tmp_path):
  """`write` (the kind's example corpus) and `documents` (its reader) are inverses: the texts,
  with their quotes, commas, line breaks and non-ASCII letters, in order."""
  cls = DATA.entry(kind).target
  texts = documents.example_texts()
  path = cls.write(tmp_path, texts)
  cfg = DATA.parse(DATA.node(kind, path=path), "data")
  errors = documents.Errors("stop")
  got = [text for _, _, text in cls.documents(cfg, documents.expand(path), errors=errors)]
  assert got == texts


@dataclasses.dataclass(frozen=True, kw_only=True)
class CountingConfig(HeldOutConfig):
  kind: str = "counting"


class CountingSource(CorpusSource):
  """Documents 1, 2, 3, ...: ids of its own making, with no tokenizer to describe."""

  @classmethod
  def load(cls, cfg):
    docs = [np.arange(1, 2 + i % 20, dtype=np.int32) for i in range(60)]
    train, held = split_by_name([f"doc{i}" for i in range(60)], docs, cfg)
    return Split(train, held, 21, 0, {"kind": "counting", "train_docs": train.num_docs})


@pytest.fixture
def counting(monkeypatch):
  """The kind `counting`, registered for this test only."""
  monkeypatch.setattr(DATA, "_entries", dict(DATA._entries))  # pylint: disable=protected-access
  DATA.register("counting", CountingConfig)(CountingSource)


def mixture(*sources):
  node = registry("data").node("mixture", seq_len=16, batch_size=4, sources=sources)
  return DATA.build(registry("data").parse(node, "data"), vocab_size=256, seed=0)


def test_a_kind_without_a_tokenizer_mixes_with_its_own_kind(counting):
  del counting
  src = mixture(component("counting", weight=1), component("counting", weight=1,
                                                           eval_percent=10))
  batch = next(src.train_iterator(process_index=0, process_count=1))
  assert batch["inputs"].shape == (4, 16) and batch["inputs"].max() <= 20
  assert src.vocab_size == 21


@pytest.mark.parametrize("order", ["counting first", "counting second"])
def test_a_kind_without_a_tokenizer_is_refused_beside_another(counting, tmp_path, order):
  del counting
  path = DATA.entry("jsonl").target.write(tmp_path, documents.example_texts())
  parts = [component("counting", weight=1), component("jsonl", path=path, weight=1)]
  if order == "counting second":
    parts.reverse()
  with pytest.raises(ConfigError) as e:
    mixture(*parts)
  counting_ids = "the ids of data kind 'counting', which describes no tokenizer"
  bytes_ids = "the bytes tokenizer's 256 ids"
  first, second = ((counting_ids, bytes_ids) if order == "counting first"
                   else (bytes_ids, counting_ids))
  assert str(e.value) == (
      f"data.sources[1] holds {second} but data.sources[0] {first}; the components of a mixture "
      f"must share one tokenizer (kind and vocabulary size), and a kind that describes none "
      f"mixes only with its own kind")


def test_the_cli_refuses_the_mix_in_one_line(counting, tmp_path, capsys, monkeypatch):
  del counting
  monkeypatch.chdir(ROOT)
  path = DATA.entry("jsonl").target.write(tmp_path, documents.example_texts())
  config = tmp_path / "mix.py"
  config.write_text(
      "from configs import llama\nfrom trainer.config import switch_kind\n"
      "from trainer.data.mixture import component\n\n\ndef get_config(arg=None):\n"
      "  cfg = llama.get_config('size=test')\n"
      f"  switch_kind(cfg, 'data', 'mixture', sources=(component('jsonl', path={path!r}, "
      "weight=1), component('counting', weight=1)))\n  return cfg\n")
  out = tmp_path / "run"
  code = main_lib.main(["axtrain", f"--config={config}", f"--output_dir={out}"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert err.startswith("axtrain: error: data.sources[1] holds the ids of data kind 'counting'")
  assert not out.exists()


def test_pre_tokenized_and_raw_text_mix_when_the_tokenizer_is_the_same(tmp_path):
  (tmp_path / "tokens").mkdir()
  tokens = DATA.entry("tokens").target.example(tmp_path / "tokens")
  path = DATA.entry("jsonl").target.write(tmp_path, documents.example_texts())
  src = mixture(component("tokens", weight=1, **tokens), component("jsonl", path=path, weight=1))
  assert next(src.train_iterator(process_index=0, process_count=1))["inputs"].shape == (4, 16)


@pytest.mark.parametrize("tokenizer", [None, {"vocab_size": 256}, {"kind": "bytes"},
                                       {"kind": "bytes", "vocab_size": "256"}])
def test_tokens_metadata_without_a_tokenizer_kind_and_size_is_refused(tmp_path, tokenizer):
  (tmp_path / "tokens").mkdir()
  path = DATA.entry("tokens").target.example(tmp_path / "tokens")["path"]
  meta_path = tmp_path / "tokens" / "tokens" / "tokens.json"
  meta = json.loads(meta_path.read_text())
  meta_path.write_text(json.dumps({**meta, "tokenizer": tokenizer}))
  node = registry("data").node("tokens", path=path, seq_len=16, batch_size=4)
  with pytest.raises(ConfigError, match="its tokenizer must name a kind and a positive "
                                        "vocab_size"):
    DATA.build(registry("data").parse(node, "data"), vocab_size=256, seed=0)
