"""Data pipeline: sources, tokenizers, packing, determinism, resume, process slices.

Everything here runs in-process on small files the tests write; no JAX.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import trainer.data  # noqa: F401  (registers the sources)
from core.registry import ConfigError, registry
from tests.conftest import ROOT
from trainer.data import tokenizers
from trainer.data.base import DATA
from trainer.data.mixture import component
from trainer.data.mixture import allocate

ETX = 3  # the bytes tokenizer's EOS


def words(i: int) -> str:
  rng = np.random.default_rng(i)
  vocab = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
  return f"doc{i}: " + " ".join(vocab[j] for j in rng.integers(0, 10, size=5 + i % 23)) + "."


TEXTS = [words(i) for i in range(300)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The same 300 documents as text files, JSONL, Parquet and ArrayRecord."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  from array_record.python import array_record_module
  root = tmp_path_factory.mktemp("corpus")
  (root / "txt").mkdir()
  for i, t in enumerate(TEXTS):
    (root / "txt" / f"{i:03d}.txt").write_text(t)
  with open(root / "c.jsonl", "w") as f:
    for i, t in enumerate(TEXTS):
      f.write(json.dumps({"id": i, "body": t}) + "\n")
  pq.write_table(pa.table({"body": TEXTS}), root / "c.parquet", row_group_size=64)
  w = array_record_module.ArrayRecordWriter(str(root / "c.array_record"), "group_size:1")
  for t in TEXTS:
    w.write(t.encode())
  w.close()
  (root / "all.txt").write_text("\n".join(TEXTS) + "\n")
  return root


def source(kind="jsonl", *, vocab_size=256, seed=0, tokenizer=None, **values):
  if tokenizer is not None:  # (kind, path)
    values["tokenizer"] = registry("tokenizer").node(tokenizer[0], path=tokenizer[1])
  node = registry("data").node(kind, **{"seq_len": 32, "batch_size": 8, **values})
  return DATA.build(registry("data").parse(node, "data"), vocab_size=vocab_size, seed=seed)


def batches(src, steps, *, process_index=0, process_count=1, state=None):
  it = src.train_iterator(process_index=process_index, process_count=process_count)
  if state is not None:
    it.set_state(json.loads(json.dumps(state)))
  return [next(it) for _ in range(steps)], it.get_state()


def pieces(batch):
  """Per row, the byte strings of each document piece (by segment id)."""
  out = []
  for inputs, seg in zip(batch["inputs"], batch["segment_ids"]):
    out.append([bytes(inputs[seg == s].astype(np.uint8)) for s in np.unique(seg[seg > 0])])
  return out


def assert_pieces_of(batch, texts, *, eos=True):
  """Every segment of every row is a contiguous piece of one document (+ its EOS)."""
  docs = [t.encode() + (bytes([ETX]) if eos else b"") for t in texts]
  for row in pieces(batch):
    for piece in row:
      assert any(piece in d for d in docs), piece


@pytest.mark.parametrize("kind,path,field", [
    ("text", "txt/*.txt", "text"), ("text", "txt", "text"), ("jsonl", "c.jsonl", "body"),
    ("parquet", "c.parquet", "body"), ("arrayrecord", "c.array_record", "text")])
def test_each_source_packs_documents_of_its_files(corpus, kind, path, field):
  extra = {"field": field} if field != "text" else {}
  src = source(kind, path=str(corpus / path), eval_percent=10, **extra)
  (batch,), _ = batches(src, 1)
  assert batch["inputs"].shape == (8, 32) and batch["inputs"].dtype == np.int32
  assert set(batch) == {"inputs", "targets", "weights", "positions", "segment_ids"}
  assert_pieces_of(batch, TEXTS)
  # train and eval documents are disjoint and together are the whole corpus
  assert src.train.corpus.num_docs + src.eval.corpus.num_docs == len(TEXTS)
  assert 0 < src.eval.corpus.num_docs < len(TEXTS) // 4


def test_packing_segments_positions_and_weights(corpus):
  src = source("jsonl", path=str(corpus / "c.jsonl"), field="body", seq_len=64)
  (batch,), _ = batches(src, 1)
  for b in range(8):
    seg, pos, w = batch["segment_ids"][b], batch["positions"][b], batch["weights"][b]
    inputs, targets = batch["inputs"][b], batch["targets"][b]
    assert np.all(np.diff(seg) >= 0) and seg[0] == 1
    starts = np.flatnonzero(np.diff(seg)) + 1
    assert np.all(pos[starts] == 0)  # positions restart with every document
    assert np.all(np.diff(pos)[np.diff(seg) == 0] == 1)
    # the last token of each piece but the row's last is EOS; its target is not trained
    assert np.all(inputs[starts - 1] == ETX) and np.all(w[starts - 1] == 0)
    # ... and neither is the target after a row-final EOS (the next row's new document)
    assert w.sum() == 64 - len(starts) - (inputs[-1] == ETX)
    assert np.all(targets[:-1] == inputs[1:])


def test_synthetic_documents_are_packed_like_a_corpus():
  plain, _ = batches(source("synthetic", seq_len=256), 1)
  assert set(plain[0]) == {"inputs", "targets", "weights"} and plain[0]["weights"].all()
  src = source("synthetic", seq_len=256, batch_size=8, mean_doc_len=16)
  (batch,), _ = batches(src, 1)
  assert set(batch) == set(src.fields()) >= {"positions", "segment_ids"}
  # the tokens are those of the unpacked stream: documents only cut it
  np.testing.assert_array_equal(batch["inputs"], plain[0]["inputs"])
  lengths = []
  for seg, pos, w in zip(batch["segment_ids"], batch["positions"], batch["weights"]):
    assert seg[0] == 1 and pos[0] == 0 and np.all(np.diff(seg) >= 0)
    starts = np.flatnonzero(np.diff(seg)) + 1
    assert np.all(pos[starts] == 0) and np.all(np.diff(pos)[np.diff(seg) == 0] == 1)
    # a target in the next document is not trained
    assert np.all(w[starts - 1] == 0) and w.sum() >= 255 - len(starts)
    lengths += np.diff(np.concatenate([[0], starts])).tolist()
  assert 10 < np.mean(lengths) < 22  # geometric, mean 16 (a row cuts the last one short)
  # the same global rows whatever the process count
  halves = [batches(src, 1, process_index=i, process_count=2)[0][0] for i in range(2)]
  for key in batch:
    np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), batch[key])
  with pytest.raises(ConfigError, match="mean_doc_len must be 0 .* or at least 2"):
    source("synthetic", mean_doc_len=1)


def test_an_epoch_is_every_document_once_in_seeded_order(corpus):
  path = corpus / "small.jsonl"
  path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:40]))
  src = source("jsonl", path=str(path), seq_len=16, batch_size=4, eval_percent=5)
  c = src.train.corpus
  train_docs = [bytes(c.shards[0][s:s + n]) for s, n in zip(c.doc_start, c.doc_len)]
  row_order = src.train._epoch(0)[2]  # index k of the epoch is stream row row_order[k]
  assert not np.array_equal(row_order, np.arange(len(row_order)))  # rows visited shuffled
  stream = src.train.rows(np.argsort(row_order))  # back in stream order
  # rows overlap by one token: all inputs, then the last target, are the epoch's stream
  flat = np.concatenate([*stream["inputs"], stream["targets"][-1][-1:]])
  assert len(flat) > c.num_tokens - 16
  docs = [d + bytes([ETX]) for d in bytes(flat.astype(np.uint8)).split(bytes([ETX]))[:-1]]
  assert len(set(docs)) == len(docs) and set(docs) <= set(train_docs)
  assert len(docs) >= len(train_docs) - 1  # at most the cut tail is missing
  assert docs != train_docs[:len(docs)]  # shuffled
  next_epoch = src.train.rows(np.arange(src.train.rows_per_epoch) + src.train.rows_per_epoch)
  assert not np.array_equal(next_epoch["inputs"], stream["inputs"])


def test_same_seed_same_batches_other_seed_other_batches(corpus):
  path = str(corpus / "c.jsonl")
  a, _ = batches(source(path=path, field="body", seed=3), 3)
  b, _ = batches(source(path=path, field="body", seed=3), 3)
  c, _ = batches(source(path=path, field="body", seed=4), 3)
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert not np.array_equal(a[0]["inputs"], c[0]["inputs"])


def test_resume_continues_the_exact_stream_also_with_more_processes(corpus):
  src = source(path=str(corpus / "c.jsonl"), field="body")
  # 60 steps of 8 rows run past one epoch (~ 9k tokens / 32 per row), so epochs are crossed
  full, _ = batches(src, 60)
  _, state = batches(src, 40)
  assert state["step"] == 40
  rest, _ = batches(src, 20, state=state)
  for x, y in zip(full[40:], rest):
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
  halves = [batches(src, 20, process_index=p, process_count=2, state=state)[0] for p in (0, 1)]
  for x, h0, h1 in zip(full[40:], *halves):
    for k in x:
      np.testing.assert_array_equal(x[k], np.concatenate([h0[k], h1[k]]))


def test_resume_with_other_data_is_refused(corpus):
  _, state = batches(source(path=str(corpus / "c.jsonl"), field="body"), 2)
  other = source(path=str(corpus / "c.jsonl"), field="body", seq_len=16)
  with pytest.raises(ConfigError, match="seq_len: 32 then, 16 now"):
    other.train_iterator(process_index=0, process_count=1).set_state(state)


def test_two_processes_read_disjoint_rows_whose_union_is_the_stream(corpus):
  src = source(path=str(corpus / "c.jsonl"), field="body", seq_len=24)
  single, _ = batches(src, 4)
  parts = [batches(src, 4, process_index=p, process_count=2)[0] for p in (0, 1)]
  seen = set()
  for step, whole in enumerate(single):
    for p in (0, 1):
      rows = parts[p][step]["inputs"]
      assert rows.shape == (4, 24)
      for r in rows:
        key = (step, r.tobytes())
        assert key not in seen
        seen.add(key)
    for k in whole:
      np.testing.assert_array_equal(whole[k], np.concatenate([parts[0][step][k],
                                                              parts[1][step][k]]))


def test_eval_is_held_out_padded_and_fixed(corpus):
  src = source(path=str(corpus / "c.jsonl"), field="body", eval_percent=5)
  a = src.eval_batches(batch_size=4, num_batches=20, process_index=0, process_count=1)
  b = src.eval_batches(batch_size=4, num_batches=20, process_index=0, process_count=1)
  np.testing.assert_array_equal(a[3]["inputs"], b[3]["inputs"])
  weights = sum(x["weights"].sum() for x in a)
  # 20 x 4 rows of 32 exceed the held-out tokens: the rest is padding with weight 0
  tokens = src.eval.corpus.num_tokens
  docs = src.eval.corpus.num_docs
  assert weights == tokens - docs  # every token but the first of each document is a target
  assert a[-1]["weights"].sum() == 0 and np.all(a[-1]["segment_ids"] == 0)
  held = {bytes(src.eval.corpus.shards[0][s:s + n]) for s, n in
          zip(src.eval.corpus.doc_start, src.eval.corpus.doc_len)}
  train = {bytes(src.train.corpus.shards[0][s:s + n]) for s, n in
           zip(src.train.corpus.doc_start, src.train.corpus.doc_len)}
  assert held and not held & train


def test_eval_path_is_a_separate_source(corpus, tmp_path):
  (tmp_path / "eval.jsonl").write_text(json.dumps({"body": "held out text only"}) + "\n")
  src = source(path=str(corpus / "c.jsonl"), field="body", eval_path=str(tmp_path / "eval.jsonl"))
  assert src.train.corpus.num_docs == len(TEXTS)
  (batch,) = src.eval_batches(batch_size=2, num_batches=1, process_index=0, process_count=1)
  assert bytes(batch["inputs"][0][batch["segment_ids"][0] == 1].astype(np.uint8)) == \
      b"held out text only\x03"


def test_mixture_takes_rows_by_weight(corpus, tmp_path):
  (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": "B" * 50}) + "\n"
                                            for _ in range(30)))
  src = source("mixture", batch_size=8, sources=(
      component("jsonl", path=str(corpus / "c.jsonl"), field="body", weight=3),
      component("jsonl", path=str(tmp_path / "b.jsonl"), weight=1, eval_percent=20)))
  got, state = batches(src, 3)
  for batch in got:
    only_b = [np.all(np.isin(r, [ord("B"), ETX])) for r in batch["inputs"]]
    assert sum(only_b) == 2  # 1/4 of 8 rows
  again, _ = batches(src, 1, state={"step": 2, "stream": state["stream"]})
  np.testing.assert_array_equal(again[0]["inputs"], got[2]["inputs"])
  assert allocate([0.7, 0.2, 0.1], 10) == [7, 2, 1] and allocate([1, 1, 1], 8) == [3, 3, 2]


def test_stdlib_default_packs_stdlib_files():
  src = source("stdlib", seq_len=64)
  (batch,), _ = batches(src, 1)
  assert src.vocab_size == 256 and batch["inputs"].max() < 256
  assert src.train.corpus.num_tokens > 1_000_000 and src.eval.corpus.num_docs > 0


# -- tokenizers -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spm_model(corpus):
  import sentencepiece as spm
  prefix = corpus / "sp"
  spm.SentencePieceTrainer.train(input=str(corpus / "all.txt"), model_prefix=str(prefix),
                                 vocab_size=60, model_type="bpe", character_coverage=1.0,
                                 hard_vocab_limit=False, minloglevel=2)
  return str(prefix) + ".model"


@pytest.fixture(scope="module")
def hf_json(corpus):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<s>", "</s>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  path = corpus / "tokenizer.json"
  tok.save(str(path))
  return str(path)


def test_bytes_tokenizer():
  tok = tokenizers.build("bytes", add_bos=True, add_eos=True)
  ids = tok.encode(["hé"])[0]
  assert ids.tolist() == [2, 104, 195, 169, 3] and tok.vocab_size == 256


def test_sentencepiece_tokenizer_round_trip_and_specials(spm_model):
  import sentencepiece as spm
  sp = spm.SentencePieceProcessor(model_file=spm_model)
  tok = tokenizers.build("sentencepiece", path=spm_model, add_bos=True, add_eos=True)
  ids = tok.encode([TEXTS[5]])[0]
  assert ids[0] == sp.bos_id() and ids[-1] == sp.eos_id()
  assert sp.decode(ids[1:-1].tolist()) == TEXTS[5]
  assert tok.vocab_size == sp.get_piece_size()


def test_huggingface_tokenizer_round_trip_and_specials(hf_json):
  from tokenizers import Tokenizer
  ref = Tokenizer.from_file(hf_json)
  tok = tokenizers.build("huggingface", path=hf_json, add_bos=True, add_eos=True)
  ids = tok.encode([TEXTS[7]])[0]
  assert ids[0] == ref.token_to_id("<s>") and ids[-1] == ref.token_to_id("</s>")
  assert ref.decode(ids[1:-1].tolist()) == TEXTS[7]


@pytest.mark.parametrize("which", ["sentencepiece", "huggingface"])
def test_sources_with_trained_tokenizers(corpus, spm_model, hf_json, which):
  path = spm_model if which == "sentencepiece" else hf_json
  src = source("jsonl", path=str(corpus / "c.jsonl"), field="body", tokenizer=(which, path),
               vocab_size=512)
  (batch,), _ = batches(src, 1)
  assert batch["inputs"].max() < src.vocab_size <= 512
  with pytest.raises(ConfigError, match=f"model.vocab_size is 40; set --config.model.vocab_size="
                                        f"{src.vocab_size}"):
    source("jsonl", path=str(corpus / "c.jsonl"), field="body", tokenizer=(which, path),
           vocab_size=40)


# -- pre-tokenized shards -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["npy", "arrayrecord"])
def test_tokenize_then_train_on_tokens_matches_on_the_fly(corpus, hf_json, tmp_path, fmt):
  out = tmp_path / "tok"
  done = subprocess.run(
      [sys.executable, "-m", "launcher", "tokenize", f"--input={corpus / 'c.jsonl'}",
       "--kind=jsonl", "--field=body", "--tokenizer=huggingface", f"--tokenizer_path={hf_json}",
       f"--format={fmt}", "--shard_tokens=1000", f"--output_dir={out}"],
      cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  meta = json.loads((out / "tokens.json").read_text())
  assert len(meta["shards"]) > 1 and meta["num_docs"] == len(TEXTS)
  tokens = source("tokens", path=str(out), vocab_size=512, eval_percent=10)
  live = source("jsonl", path=str(corpus / "c.jsonl"), field="body",
                tokenizer=("huggingface", hf_json), vocab_size=512, eval_percent=10)
  (a,), _ = batches(tokens, 1)
  assert tokens.vocab_size == live.vocab_size
  # same documents, so the pre-tokenized rows are pieces of the on-the-fly documents
  live_docs = [bytes(live.train.corpus.shards[0][s:s + n].astype(np.uint16).tobytes())
               for s, n in zip(live.train.corpus.doc_start, live.train.corpus.doc_len)]
  live_docs += [bytes(live.eval.corpus.shards[0][s:s + n].astype(np.uint16).tobytes())
                for s, n in zip(live.eval.corpus.doc_start, live.eval.corpus.doc_len)]
  for inputs, seg in zip(a["inputs"], a["segment_ids"]):
    for s in np.unique(seg):
      piece = inputs[seg == s].astype(np.uint16).tobytes()
      assert any(piece in d for d in live_docs)


# -- config validation ----------------------------------------------------------------------


def test_each_kind_has_only_the_fields_it_reads(corpus):
  with pytest.raises(ConfigError, match="data 'text' has no field 'field'"):
    source("text", path=str(corpus / "txt"), field="body")
  with pytest.raises(ConfigError, match="data 'stdlib' has no field 'path'"):
    source("stdlib", path="x.txt")
  with pytest.raises(ConfigError, match="data 'tokens' has no field 'tokenizer'"):
    source("tokens", path="x", tokenizer=("huggingface", "t.json"))
  with pytest.raises(ConfigError, match="field 'path' is required"):
    source("jsonl")
  with pytest.raises(ConfigError, match="unknown tokenizer kind 'sentencepeice'.*did you mean"):
    source("jsonl", path=str(corpus / "c.jsonl"), field="body",
           tokenizer=("sentencepeice", str(corpus / "c.jsonl")))
  with pytest.raises(ConfigError, match="tokenizer 'bytes' has no field 'path'"):
    source("jsonl", path=str(corpus / "c.jsonl"), tokenizer=("bytes", "x.model"))
  assert set(registry("data").node("synthetic")) == {"kind", "seq_len", "batch_size",
                                                     "mean_doc_len", "tokenizer"}
  assert set(registry("data").node("jsonl", path="x")) == {
      "kind", "seq_len", "batch_size", "path", "eval_path", "eval_percent", "on_error", "field",
      "tokenizer"}


def test_mixture_components_are_nodes_of_corpus_kinds(corpus):
  good = component("jsonl", path=str(corpus / "c.jsonl"), field="body", weight=1)
  with pytest.raises(ConfigError, match=r"sources\[1\].seq_len: a component takes seq_len"):
    source("mixture", sources=(good, {**good, "seq_len": 16}))
  with pytest.raises(ConfigError, match=r"sources\[0\].kind: 'synthetic' is not a corpus kind"):
    source("mixture", sources=({"kind": "synthetic", "weight": 1},))
  with pytest.raises(ConfigError, match=r"sources\[0\].weight must be a positive number"):
    source("mixture", sources=({**good, "weight": 0},))
  with pytest.raises(ConfigError, match=r"sources\[0\].field: unknown field 'field' of "
                     r"data.sources\[0\] \(kind 'text'\)"):
    source("mixture", sources=({**good, "kind": "text"},))


def test_moving_the_corpus_keeps_split_and_batches(corpus, tmp_path):
  moved = tmp_path / "elsewhere" / "c.jsonl"
  moved.parent.mkdir()
  moved.write_bytes((corpus / "c.jsonl").read_bytes())
  (a,), _ = batches(source(path=str(corpus / "c.jsonl"), field="body"), 1)
  (b,), _ = batches(source(path=str(moved), field="body"), 1)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
