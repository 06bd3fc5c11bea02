"""The csv source: one document per row of a CSV file with a header, text in `column`."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pytest

import trainer.data  # noqa: F401  (registers the sources)
from core.registry import ConfigError, registry
from launcher import main as cli_main
from trainer.data.base import DATA
from trainer.data.mixture import component

TEXTS = [f"row {i}, with a comma" + ("\nand a second line" if i % 3 == 0 else "") + " x" * (i % 5)
         for i in range(80)]


def write_csv(path, rows, header=("id", "body", "score")):
  out = io.StringIO()
  writer = csv.writer(out)  # the stdlib writer: an independent source of the quoting
  writer.writerow(header)
  writer.writerows(rows)
  path.write_text(out.getvalue())
  return path


@pytest.fixture
def corpus(tmp_path):
  return write_csv(tmp_path / "c.csv", [(i, t, i / 2) for i, t in enumerate(TEXTS)])


def source(path, **values):
  node = registry("data").node("csv", path=str(path), seq_len=16, batch_size=4, **values)
  return DATA.build(registry("data").parse(node, "data"), vocab_size=256, seed=0)


def read(path, on_error="stop", **values):
  """(texts, skipped) as the csv reader gives them (for corpora too small to pack)."""
  from trainer.data import documents
  node = registry("data").node("csv", path=str(path), on_error=on_error, **values)
  cfg = registry("data").parse(node, "data")
  errors = documents.Errors(on_error)
  _, texts = DATA.entry("csv").target.read(cfg, str(path), errors=errors, what="data.path")
  return texts, errors.skipped


def docs_of(src):
  out = []
  for packer in (src.train, src.eval):
    c = packer.corpus
    out += [bytes(c.shards[0][s:s + n].astype(np.uint8)) for s, n in zip(c.doc_start, c.doc_len)]
  return sorted(out)


def test_every_row_is_one_document_of_its_column(corpus):
  src = source(corpus, column="body")
  assert docs_of(src) == sorted(t.encode() + b"\x03" for t in TEXTS)  # + the EOS separator
  batch = next(src.train_iterator(process_index=0, process_count=1))
  assert batch["inputs"].shape == (4, 16)
  assert set(registry("data").node("csv", path="x")) == {
      "kind", "seq_len", "batch_size", "path", "eval_path", "eval_percent", "on_error",
      "column", "tokenizer"}


def test_a_byte_order_mark_and_blank_lines_are_not_data(tmp_path):
  path = tmp_path / "bom.csv"
  path.write_bytes(b"\xef\xbb\xbftext\r\nfirst\r\n\r\nsecond\r\nthird\r\n")
  assert read(path) == (["first", "second", "third"], 0)


def test_bad_files_and_rows(tmp_path, corpus):
  with pytest.raises(ConfigError, match=r"no column 'text' \(columns: id, body, score\); "
                                        r"set data.column"):
    source(corpus)
  short = write_csv(tmp_path / "short.csv", [(1, "a", 1), (2,), (3, "c", 3), (4, "d", 4)])
  with pytest.raises(ConfigError, match=r"short.csv:3: the row has 1 cells, none in column "
                                        r"'body' \(number 2 of the header\) \(set "
                                        r"data.on_error=skip"):
    read(short, column="body")
  assert read(short, "skip", column="body") == (["a", "c", "d"], 1)
  latin = tmp_path / "latin.csv"
  latin.write_bytes(b"text\ncaf\xe9\n")
  with pytest.raises(ConfigError, match=r"latin.csv: not UTF-8 text \(byte 8\)"):
    read(latin)
  binary = tmp_path / "b.csv"
  binary.write_bytes(b"text\n\0\x01")
  with pytest.raises(ConfigError, match=r"b.csv: not a CSV file \(NUL byte at offset 5\)"):
    read(binary)
  empty = tmp_path / "empty.csv"
  empty.write_text("")
  with pytest.raises(ConfigError, match="empty.csv: no header row"):
    read(empty)
  broken = tmp_path / "broken.csv"
  broken.write_text('text\n"never closed\n')
  with pytest.raises(ConfigError, match=r"broken.csv:\d+: not valid CSV"):
    read(broken)


def test_a_cell_longer_than_csvs_default_limit_is_one_document(tmp_path):
  long = "y" * 200_000  # over csv's 128 KiB cell limit, which is restored afterwards
  limit = csv.field_size_limit()
  assert read(write_csv(tmp_path / "l.csv", [(1, long, 0), (2, "b", 0)],
                        header=("id", "text", "s"))) == ([long, "b"], 0)
  assert csv.field_size_limit() == limit


def test_mixture_component_tokenize_and_command_line(tmp_path, corpus, capsys, monkeypatch):
  """Found through the registry: a mixture component, `axtrain tokenize --kind=csv --column`,
  and `--config.data.kind=csv` on any config."""
  mix = registry("data").node("mixture", seq_len=16, batch_size=4, sources=(
      component("csv", path=str(corpus), column="body", weight=1),
      component("stdlib", weight=1)))
  assert DATA.build(registry("data").parse(mix, "data"), vocab_size=256, seed=0).counts == [2, 2]
  out = tmp_path / "tokens"
  assert cli_main.main(["axtrain", "tokenize", f"--input={corpus}", "--kind=csv",
                        "--column=body", f"--output_dir={out}"]) == 0
  meta = json.loads((out / "tokens.json").read_text())
  assert meta["num_docs"] == len(TEXTS) and meta["source"]["column"] == "body"
  assert cli_main.main(["axtrain", "tokenize", f"--input={corpus}", "--kind=jsonl",
                        "--column=body", f"--output_dir={tmp_path / 'x'}"]) == 2
  assert re.search(r"--column is not read by --kind=jsonl \(only by [^)]*\bcsv\b",
                   capsys.readouterr().err)
  monkeypatch.chdir(tmp_path)
  from tests.conftest import ROOT
  code = cli_main.main(["axtrain", f"--config={ROOT / 'configs' / 'tiny.py'}",
                        "--config.data.kind=csv", f"--config.data.path={corpus}",
                        "--config.data.column=body", "--print_config"])
  assert code == 0 and "data.column: body" in capsys.readouterr().out
