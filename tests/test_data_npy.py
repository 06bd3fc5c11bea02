"""The npy source: documents of token ids in .npy files, split at eos_id, memory-mapped."""

from __future__ import annotations

import numpy as np
import pytest

import trainer.data  # noqa: F401  (registers the sources)
from core.registry import ConfigError, registry
from trainer.data import documents
from trainer.data.base import DATA
from trainer.data.mixture import component

EOS = 1
# 40 documents of ids 2..999 of lengths 1..13, each ended by EOS; the last one of each file
# without it (a file cut in the middle of a document).
RNG = np.random.default_rng(0)
DOCS = [RNG.integers(2, 1000, size=1 + i % 13) for i in range(40)]


def write(tmp_path, docs=DOCS, *, files=2, dtype=np.uint16, eos=True):
  """`docs` laid out in `files` .npy files with np.save, each ended by EOS but a file's last."""
  root = tmp_path / "ids"
  root.mkdir(parents=True)
  for n, part in enumerate(np.array_split(np.arange(len(docs)), files)):
    ids = [np.append(docs[i], EOS) if eos and i != part[-1] else docs[i] for i in part]
    np.save(root / f"part-{n}.npy", np.concatenate(ids).astype(dtype))
  return root


def node(path, **values):
  return registry("data").node("npy", path=str(path), seq_len=8, batch_size=4, **values)


def split(path, **values):
  cfg = DATA.parse(node(path, **values), "data")
  return DATA.entry("npy").target.load(cfg)


def docs_of(corpus):
  return [corpus.shards[s][a:a + n].tolist()
          for s, a, n in zip(corpus.doc_shard, corpus.doc_start, corpus.doc_len)]


def test_documents_end_at_eos_and_every_one_is_read_once(tmp_path):
  got = split(write(tmp_path), eos_id=EOS)
  train, held = docs_of(got.train), docs_of(got.eval)
  want = [d.tolist() + [EOS] for d in DOCS]
  want[19], want[39] = DOCS[19].tolist(), DOCS[39].tolist()  # each file's last: no EOS
  assert sorted(train + held) == sorted(want) and held and len(train) > len(held)
  assert got.vocab_size == max(int(d.max()) for d in DOCS) + 1  # no tokenizer: its own ids
  assert "tokenizer" not in got.describe
  assert all(isinstance(shard, np.memmap) for shard in got.train.shards)  # not copied


def test_without_eos_id_each_file_is_one_document(tmp_path):
  got = split(write(tmp_path, files=4, eos=False))
  assert got.train.num_docs + got.eval.num_docs == 4
  assert got.train.num_tokens + got.eval.num_tokens == sum(len(d) for d in DOCS)


def test_the_split_does_not_depend_on_the_dtype_or_the_folder(tmp_path):
  a = split(write(tmp_path / "a", dtype=np.int32), eos_id=EOS)
  b = split(write(tmp_path / "b", dtype=np.uint16), eos_id=EOS)
  assert docs_of(a.eval) == docs_of(b.eval) and docs_of(a.train) == docs_of(b.train)


def test_batches_hold_the_files_ids_packed(tmp_path):
  src = DATA.build(DATA.parse(node(write(tmp_path), eos_id=EOS), "data"), vocab_size=1024,
                   seed=0)
  batch = next(src.train_iterator(process_index=0, process_count=1))
  assert set(np.unique(batch["inputs"])) <= set(np.concatenate(DOCS).tolist()) | {EOS}
  assert batch["segment_ids"].shape == (4, 8) and batch["inputs"].dtype == np.int32


def test_a_tokenizer_bounds_the_ids_and_lets_it_mix(tmp_path):
  small = [d % 200 + 4 for d in DOCS]  # byte ids
  path = write(tmp_path, small)
  got = split(path, eos_id=EOS, tokenizer=registry("tokenizer").node("bytes"))
  assert got.vocab_size == 256 and got.describe["tokenizer"]["kind"] == "bytes"
  top = max(int(d.max()) for d in DOCS)
  with pytest.raises(ConfigError, match=rf"holds id {top}, but data.tokenizer \(bytes\) has 256 "):
    split(write(tmp_path / "big"), eos_id=EOS, tokenizer=registry("tokenizer").node("bytes"))
  jsonl = DATA.entry("jsonl").target.write(tmp_path, documents.example_texts())
  mixed = registry("data").node("mixture", seq_len=8, batch_size=4, sources=(
      component("npy", path=str(path), eos_id=EOS, weight=1,
                tokenizer=registry("tokenizer").node("bytes")),
      component("jsonl", path=jsonl, weight=1)))
  src = DATA.build(DATA.parse(mixed, "data"), vocab_size=256, seed=0)
  assert next(src.train_iterator(process_index=0, process_count=1))["inputs"].shape == (4, 8)


@pytest.mark.parametrize("array,words", [
    (np.zeros((3, 4), np.int32), "holds a int32 array of shape (3, 4); data.kind=npy reads 1-D"),
    (np.linspace(0, 1, 9), "holds a float64 array of shape (9,)"),
    (np.array([5, -2, 7]), "holds a negative id (-2)"),
    (np.zeros(0, np.int32), "the array is empty"),
])
def test_a_bad_file_is_refused_by_name(tmp_path, array, words):
  np.save(tmp_path / "bad.npy", array)
  with pytest.raises(ConfigError) as e:
    split(tmp_path / "bad.npy")
  assert str(e.value).startswith(f"{tmp_path / 'bad.npy'}: {words}"), str(e.value)


def test_a_file_that_is_not_npy_is_refused(tmp_path):
  (tmp_path / "ids.npy").write_text("1 2 3\n")
  with pytest.raises(ConfigError, match=r"ids.npy: not a .npy array"):
    split(tmp_path / "ids.npy")
  with pytest.raises(ConfigError, match="data.eos_id must be a token id"):
    DATA.build(DATA.parse(node(tmp_path / "ids.npy", eos_id=-1), "data"), vocab_size=8, seed=0)
