"""The data pipeline through the CLI: training on a user's JSONL by one override, and bad
input reported as one `axtrain: error:` line naming the file (and line), exit 2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from launcher import main as cli_main
from tests.conftest import cli
from trainer.data import DATA, corpus as corpus_lib

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

SMALL = ["--config=configs/tiny.py", "--config.trainer.max_steps=2", "--config.data.seq_len=32",
         "--config.optimizer.schedule.warmup_steps=0",
         "--config.data.batch_size=8", "--config.eval.batch_size=8",
         "--config.eval.num_batches=1", "--progress=false"]


def write_jsonl(path, n=60, bad=()):
  lines = [json.dumps({"text": f"line {i} of the corpus " + "xy" * (i % 7)}) for i in range(n)]
  for i, line in bad:
    lines[i] = line
  path.write_text("\n".join(lines) + "\n")
  return path


def test_train_on_jsonl_by_one_override_skipping_a_bad_line(tmp_path, capfd):
  corpus = write_jsonl(tmp_path / "corpus.jsonl", bad=[(5, json.dumps({"body": "no text"}))])
  code = cli_main.main(["axtrain", *SMALL, "--config.data.kind=jsonl",
                        f"--config.data.path={corpus}", "--config.data.on_error=skip",
                        f"--output_dir={tmp_path / 'run'}"])
  assert code == 0, capfd.readouterr().err
  records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert records[0]["data_skipped_documents"] == 1
  assert records[-1]["eval_tokens"] > 0


def test_bad_line_stops_at_start_up_in_a_fresh_process(tmp_path):
  corpus = write_jsonl(tmp_path / "corpus.jsonl", bad=[(6, json.dumps({"body": "no text"}))])
  done = cli(*SMALL, "--config.data.kind=jsonl", f"--config.data.path={corpus}",
             f"--output_dir={tmp_path / 'run'}")
  assert done.returncode == 2
  lines = done.stderr.strip().splitlines()
  assert lines == [f"axtrain: error: {corpus}:7: no field 'text' (has: body); set data.field "
                   f"(set data.on_error=skip to skip such documents)"]
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


def run(capsys, *argv):
  code = cli_main.main(["axtrain", *argv])
  err = capsys.readouterr().err.strip().splitlines()
  return code, err


def train_error(capsys, tmp_path, *overrides):
  code, err = run(capsys, *SMALL, *overrides, f"--output_dir={tmp_path / 'run'}")
  assert code == 2 and len(err) == 1 and err[0].startswith("axtrain: error: "), err
  return err[0].removeprefix("axtrain: error: ")


def tokenize_error(capsys, tmp_path, *args):
  code, err = run(capsys, "tokenize", *args, f"--output_dir={tmp_path / 'out'}")
  assert code == 2 and len(err) == 1 and err[0].startswith("axtrain: error: "), err
  assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
  return err[0].removeprefix("axtrain: error: ")


def test_bad_input_at_start_up(capsys, tmp_path):
  missing = tmp_path / "nope.jsonl"
  assert train_error(capsys, tmp_path, "--config.data.kind=jsonl",
                     f"--config.data.path={missing}") == \
      f"data.path '{missing}': no such file or directory"
  assert train_error(capsys, tmp_path, "--config.data.kind=text",
                     f"--config.data.path={tmp_path}/*.md") == \
      f"data.path '{tmp_path}/*.md': no files match the glob"
  assert train_error(capsys, tmp_path, "--config.data.field=body").startswith(
      "--config.data.field: unknown field 'field' of data (kind 'stdlib'); its fields: ")
  corpus = write_jsonl(tmp_path / "c.jsonl")
  bad_model = tmp_path / "bad.model"
  bad_model.write_text("not a model")
  assert train_error(capsys, tmp_path, "--config.data.kind=jsonl", f"--config.data.path={corpus}",
                     "--config.data.tokenizer.kind=sentencepiece",
                     f"--config.data.tokenizer.path={bad_model}").startswith(
      f"tokenizer file '{bad_model}' is not a SentencePiece model")


def test_an_empty_file_and_a_mixture_without_sources(capsys, tmp_path):
  """Issue 24: say that the file is empty (not 'has 1 document(s)'), and point a mixture
  switch on the command line to a config file (its sources are no flag value)."""
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  assert train_error(capsys, tmp_path, "--config.data.kind=text",
                     f"--config.data.path={empty}") == f"data.path '{empty}': the file is empty"
  (tmp_path / "blank").mkdir()
  for name in ("a.txt", "b.txt"):
    (tmp_path / "blank" / name).write_text("")
  assert train_error(capsys, tmp_path, "--config.data.kind=text",
                     f"--config.data.path={tmp_path / 'blank'}") == (
      f"data.path '{tmp_path / 'blank'}': all 2 documents are empty")
  assert train_error(capsys, tmp_path, "--config.data.kind=mixture") == (
      "data.sources: required field of data 'mixture' is missing (a tuple of weighted data "
      "nodes, which a config file sets: see configs/tiny_mixture.py)")
  assert not (tmp_path / "run").exists()


def _kinds_with(field: str) -> list[str]:
  """The document kinds whose config has `field`, from the registry."""
  return [k for k in corpus_lib.document_kinds()
          if field in {f.name for f in dataclasses.fields(DATA.entry(k).config_cls)}]


def test_bad_input_via_tokenize(capsys, tmp_path):
  good = write_jsonl(tmp_path / "good.jsonl")
  binary = tmp_path / "data.bin"
  binary.write_bytes(bytes(range(256)) * 4)
  assert tokenize_error(capsys, tmp_path, f"--input={binary}", "--kind=jsonl").startswith(
      f"{binary}:1: not a JSON Lines file")
  assert tokenize_error(capsys, tmp_path, f"--input={good}", "--kind=parquet").startswith(
      f"{good}: not a Parquet file")
  assert tokenize_error(capsys, tmp_path, f"--input={binary}", "--kind=text").startswith(
      f"{binary}: not a text file (NUL byte at offset 0)")
  assert tokenize_error(capsys, tmp_path, f"--input={good}", "--kind=arrayrecord").startswith(
      f"{good}: not an ArrayRecord file")
  undecodable = tmp_path / "latin1.jsonl"
  undecodable.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
  assert tokenize_error(capsys, tmp_path, f"--input={undecodable}", "--kind=jsonl") == \
      f"{undecodable}:2: not UTF-8 text (byte 13) (set --on_error=skip to skip such documents)"
  broken = write_jsonl(tmp_path / "broken.jsonl", bad=[(3, '{"text": "unterminated')])
  assert tokenize_error(capsys, tmp_path, f"--input={broken}", "--kind=jsonl").startswith(
      f"{broken}:4: not valid JSON")
  bad_json = tmp_path / "tokenizer.json"
  bad_json.write_text("{}")
  assert tokenize_error(capsys, tmp_path, f"--input={good}", "--kind=jsonl",
                        "--tokenizer=huggingface", f"--tokenizer_path={bad_json}").startswith(
      f"tokenizer file '{bad_json}' is not a Hugging Face tokenizer.json")
  assert tokenize_error(capsys, tmp_path, f"--input={good}", "--tokenizer=sentencepiece",
                        f"--tokenizer_path={tmp_path / 'none.model'}") == \
      f"tokenizer file '{tmp_path / 'none.model'}' does not exist"
  assert tokenize_error(capsys, tmp_path, f"--input={good}", "--tokenizer=sentencepiece",
                        f"--tokenizer_path={tmp_path}") == \
      f"tokenizer file '{tmp_path}' is a directory, not a file"
  assert tokenize_error(capsys, tmp_path, f"--input={good}", "--kind=text", "--field=body") == \
      f"--field is not read by --kind=text (only by {' and '.join(_kinds_with('field'))})"
  # policy skip: the bad lines are skipped and counted, the rest is tokenized
  code, _ = run(capsys, "tokenize", f"--input={broken}", "--kind=jsonl", "--on_error=skip",
                f"--output_dir={tmp_path / 'ok'}")
  meta = json.loads((tmp_path / "ok" / "tokens.json").read_text())
  assert code == 0 and meta["skipped_documents"] == 1 and meta["num_docs"] == 59
  # an existing output directory is never overwritten
  code, err = run(capsys, "tokenize", f"--input={good}", f"--output_dir={tmp_path / 'ok'}")
  assert code == 2 and "exists" in err[0]
  assert json.loads((tmp_path / "ok" / "tokens.json").read_text()) == meta


def test_tokenize_infers_the_kind_from_the_file_names_or_refuses_to_guess(capsys, tmp_path):
  """Without --kind a JSONL file is read as JSON Lines (one document a line, said in a note),
  not as one text document; names that say no kind, or several, are refused."""
  corpus = write_jsonl(tmp_path / "corpus.jsonl", n=300)
  code, err = run(capsys, "tokenize", f"--input={corpus}", f"--output_dir={tmp_path / 'tok'}")
  assert code == 0, err
  assert "axtrain: note: tokenize: --kind=jsonl, from the input's file names (*.jsonl)" in err[0]
  meta = json.loads((tmp_path / "tok" / "tokens.json").read_text())
  assert meta["num_docs"] == 300 and meta["source"]["kind"] == "jsonl"
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  write_jsonl(mixed / "a.jsonl")
  (mixed / "b.txt").write_text("text")
  assert tokenize_error(capsys, tmp_path, f"--input={mixed}") == (
      "tokenize: --kind is not given and the input's file names do not say one kind: "
      f"*.jsonl (jsonl), *.txt (text); give --kind={'|'.join(corpus_lib.document_kinds())}")
  (tmp_path / "c.dat").write_text("x")
  assert "*.dat (no kind)" in tokenize_error(capsys, tmp_path, f"--input={tmp_path / 'c.dat'}")


def test_every_document_kind_names_the_endings_of_its_own_files(tmp_path):
  """The kind inferred from the file names of each kind's example corpus is that kind."""
  from trainer.data import documents  # pylint: disable=import-outside-toplevel
  for kind in corpus_lib.document_kinds():
    folder = tmp_path / kind
    folder.mkdir()
    path = DATA.entry(kind).target.write(folder, ["a document"])
    assert set(corpus_lib.kinds_of(documents.expand(path)).values()) == {kind}, kind


def test_tokenize_errors_name_its_flags_and_leave_nothing(capsys, tmp_path):
  """Issue 34: a bad line's message names tokenize's own flags (--on_error, --field, --kind),
  not the training config's data.* fields, and the failed run leaves no OUT.partial behind,
  even after it wrote shards."""
  no_field = write_jsonl(tmp_path / "c.jsonl", bad=[(2, json.dumps({"body": "x"}))])
  assert tokenize_error(capsys, tmp_path, f"--input={no_field}", "--kind=jsonl") == (
      f"{no_field}:3: no field 'text' (has: body); set --field (set --on_error=skip to skip "
      f"such documents)")
  binary = tmp_path / "data.bin"
  binary.write_bytes(bytes(range(256)))
  assert tokenize_error(capsys, tmp_path, f"--input={binary}", "--kind=text") == (
      f"{binary}: not a text file (NUL byte at offset 0); --kind=text reads UTF-8 text files")
  # 600 good documents (the first 512, one tokenizer call, written as shards of about 4,000
  # tokens), then a bad one in the second file
  folder = tmp_path / "corpus"
  folder.mkdir()
  write_jsonl(folder / "a.jsonl", n=600)
  late = write_jsonl(folder / "b.jsonl", bad=[(59, "not json")])
  message = tokenize_error(capsys, tmp_path, f"--input={folder}", "--kind=jsonl",
                           "--shard_tokens=4000")
  assert message.startswith(f"{late}:60: not valid JSON") and "--on_error=skip" in message
  assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "corpus", "data.bin"]


def test_as_flags_renames_only_tokenize_flags():
  from launcher import tokenize  # pylint: disable=import-outside-toplevel
  assert tokenize.as_flags("set data.on_error=skip; data.path 'x'; data.seq_len 8; "
                           "--config.data.field; data.field") == (
      "set --on_error=skip; --input 'x'; data.seq_len 8; --config.data.field; --field")


@pytest.fixture(autouse=True)
def _chdir_repo(monkeypatch):
  from tests.conftest import ROOT
  monkeypatch.chdir(ROOT)


def test_tokenize_into_a_run_directory_is_refused_and_the_run_left_alone(capsys, tmp_path):
  """A corpus written inside a run would be a folder that run did not write, so the run's own
  command could no longer resume or extend it: refused in one line, nothing written."""
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text("{}")
  (run / "run.json").write_text(json.dumps({"command": "axtrain --config=configs/tiny.py",
                                            "versions": {"axtrain": "0.1.0"}}))
  corpus = write_jsonl(tmp_path / "c.jsonl")
  out = run / "tokens"
  code = cli_main.main(["axtrain", "tokenize", f"--input={corpus}", "--kind=jsonl",
                        f"--output_dir={out}"])
  err = capsys.readouterr().err
  assert code == 2 and err == (f"axtrain: error: --output_dir {out} is inside the run directory "
                               f"{run}, which would then hold files it did not write (and its "
                               f"command would refuse to resume or extend it); choose a path "
                               f"outside it\n")
  assert sorted(p.name for p in run.iterdir()) == ["config.json", "run.json"]


def test_tokenize_names_a_misspelt_flag_in_one_line(capsys):
  code = cli_main.main(["axtrain", "tokenize", "--inptu=c.jsonl", "--output_dir=out"])
  assert code == 2 and capsys.readouterr().err == (
      "axtrain: error: tokenize: unknown flag --inptu (did you mean 'input'?); see axtrain "
      "tokenize --help\n")


@pytest.mark.parametrize("signame,code", [("SIGINT", 130), ("SIGTERM", 75)])
def test_a_stopped_tokenize_leaves_no_partial_output(tmp_path, signame, code):
  """Ctrl-C or SIGTERM as tokenize writes its second shard (tests/signal_at_write.py), the
  first in OUT.partial: the stop line says it removed OUT.partial, which is gone (before, it
  stayed, unmentioned), and nothing else is written."""
  corpus, out = write_jsonl(tmp_path / "c.jsonl", n=600), tmp_path / "out"
  done = cli(signame, "shard-00001.tokens.npy.tmp", "--", "tokenize", f"--input={corpus}",
             "--kind=jsonl", "--shard_tokens=4000", f"--output_dir={out}",
             module="tests.signal_at_write", timeout=120)
  assert done.returncode == code, done.stderr[-3000:]
  assert done.stderr.splitlines()[-1] == (f"axtrain: {signame}: stopped; removed its partial "
                                          f"output {tmp_path / 'out.partial'} (exit {code})")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_a_killed_tokenizes_partial_output_is_removed_by_the_next(capsys, tmp_path):
  """OUT.partial of a tokenize that was killed (no process holds its lock): the next tokenize to
  OUT removes it with a note and writes OUT. One that a live tokenize is writing (its lock
  held) is refused in one line and left alone."""
  import fcntl  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  corpus, out, partial = write_jsonl(tmp_path / "c.jsonl"), tmp_path / "out", tmp_path / "out.partial"
  partial.mkdir()
  (partial / "shard-00000.tokens.npy").write_bytes(b"half")
  fd = os.open(partial, os.O_RDONLY | os.O_DIRECTORY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    code, err = run(capsys, "tokenize", f"--input={corpus}", "--kind=jsonl", f"--output_dir={out}")
    assert code == 2 and err == [
        f"axtrain: error: tokenize: {partial} is being written by another axtrain tokenize to "
        f"{out}; wait for it to finish, or choose another --output_dir"], err
    assert (partial / "shard-00000.tokens.npy").read_bytes() == b"half"
  finally:
    os.close(fd)
  code, err = run(capsys, "tokenize", f"--input={corpus}", "--kind=jsonl", f"--output_dir={out}")
  assert code == 0 and err == [
      f"axtrain: note: tokenize: removed {partial}, the partial output of an earlier tokenize to "
      f"{out} that was stopped before it could clean up"], err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "out"]
  (tmp_path / "other.partial").write_text("mine")  # no folder: someone else's file
  code, err = run(capsys, "tokenize", f"--input={corpus}", "--kind=jsonl",
                  f"--output_dir={tmp_path / 'other'}")
  assert code == 2 and err == [
      f"axtrain: error: tokenize: {tmp_path / 'other.partial'} exists and is not a folder "
      f"tokenize writes; move it away, or choose another --output_dir"], err
  assert (tmp_path / "other.partial").read_text() == "mine"
