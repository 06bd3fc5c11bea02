"""`axtrain tokenize`: tokenize a corpus once into shards that `data.kind=tokens` memory-maps.

usage:
  axtrain tokenize --input=GLOB --kind=jsonl [--field=text] --tokenizer=huggingface \\
      --tokenizer_path=tokenizer.json --output_dir=DIR [--format=npy|arrayrecord]

then train with --config.data.kind=tokens --config.data.path=DIR. The directory
holds tokens.json (tokenizer, shard list, counts) and per shard either
NAME.tokens.npy + NAME.lengths.npy (flat ids + document lengths) or
NAME.array_record (one record per document: its ids as little-endian bytes).
It is written under DIR.partial and renamed when complete; a run that fails
(a bad document without --on_error=skip, no documents, a full disk) or is
stopped (Ctrl-C, SIGTERM) removes DIR.partial, a run after one that was killed
removes its DIR.partial with a note, and an existing DIR is never overwritten (nor is a DIR inside a run directory
accepted: that run would then hold files it did not write).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import re
import sys
import typing

import numpy as np
from absl import flags

from core.registry import ConfigError
from launcher.errors import UserError, suggest
from launcher.staging import Staging
from trainer import disk
from trainer.data import DATA, corpus as corpus_lib, documents, tokenizers
from trainer.data.config import DocumentFilesConfig
from trainer.data.tokens import META

_FLAG_TYPES = {str: flags.DEFINE_string, int: flags.DEFINE_integer, bool: flags.DEFINE_boolean,
               float: flags.DEFINE_float}


def reader_fields() -> dict[str, dict[str, dataclasses.Field]]:
  """{field name: {kind: field}} of the fields a document kind adds for its reader (jsonl's
  `field`, csv's `column`): each is a flag of `axtrain tokenize`, found in the registry."""
  common = {f.name for f in dataclasses.fields(DocumentFilesConfig)}
  out: dict[str, dict[str, dataclasses.Field]] = {}
  for kind in corpus_lib.document_kinds():
    for f in dataclasses.fields(DATA.entry(kind).config_cls):
      if f.name not in common:
        out.setdefault(f.name, {})[kind] = f
  return out


def _flags() -> flags.FlagValues:
  fv = flags.FlagValues()
  flags.DEFINE_string("input", None, "Corpus file, glob or directory.", flag_values=fv)
  endings = ", ".join(e for k in corpus_lib.document_kinds() for e in DATA.entry(k).target.SUFFIXES)
  flags.DEFINE_enum("kind", None, corpus_lib.document_kinds(), "Format of the input files "
                    f"(default: the one their names end with: {endings}; refused where they "
                    f"end otherwise or differ).", flag_values=fv)
  for name, by_kind in reader_fields().items():
    kind, f = next(iter(by_kind.items()))
    hint = typing.get_type_hints(DATA.entry(kind).config_cls)[name]
    define = _FLAG_TYPES.get(hint, flags.DEFINE_string)
    define(name, None, f"data.{name} of --kind={', '.join(by_kind)} (default "
           f"{', '.join(sorted({repr(g.default) for g in by_kind.values()}))}).", flag_values=fv)
  flags.DEFINE_string("tokenizer", "bytes", f"{' | '.join(tokenizers.TOKENIZERS.kinds())}.",
                      flag_values=fv)
  flags.DEFINE_string("tokenizer_path", None, "SentencePiece .model or tokenizer.json.",
                      flag_values=fv)
  flags.DEFINE_boolean("add_bos", False, "Prepend BOS to every document.", flag_values=fv)
  flags.DEFINE_boolean("add_eos", True, "Append EOS to every document.", flag_values=fv)
  flags.DEFINE_enum("on_error", "stop", ["stop", "skip"], "Bad document: stop, or skip it.",
                    flag_values=fv)
  flags.DEFINE_enum("format", "npy", ["npy", "arrayrecord"], "Shard format.", flag_values=fv)
  flags.DEFINE_integer("shard_tokens", 100_000_000, "Tokens per shard (about).", flag_values=fv)
  flags.DEFINE_string("output_dir", None, "Directory to create.", flag_values=fv)
  return fv


def main(argv: list[str]) -> int:
  fv = _flags()
  if any(a in ("-h", "--help") for a in argv[1:]):
    from launcher.main import options_text  # pylint: disable=import-outside-toplevel
    sys.stdout.write(__doc__.strip() + "\n\n" + options_text(fv))
    return 0
  from launcher.config_loading import check_values  # pylint: disable=import-outside-toplevel
  check_values(fv, argv)
  try:
    fv(argv)
  except flags.UnrecognizedFlagError as e:
    raise UserError(f"tokenize: unknown flag --{e.flagname}{suggest(e.flagname, list(fv))}; see "
                    f"axtrain tokenize --help") from None
  except flags.Error as e:
    raise UserError(f"tokenize: {' '.join(str(e).split())}") from None
  if not fv.input or not fv.output_dir:
    raise UserError("tokenize needs --input=FILE|GLOB|DIR and --output_dir=DIR")
  if fv.shard_tokens <= 0:
    raise UserError(f"--shard_tokens must be positive, got {fv.shard_tokens}")
  out = pathlib.Path(os.path.expanduser(fv.output_dir))
  from launcher.run_dir import check_writable  # pylint: disable=import-outside-toplevel
  check_writable(out)  # a parent that is a file, or not writable: one line, nothing written
  from launcher.folders import check_outside_runs  # pylint: disable=import-outside-toplevel
  check_outside_runs(out)
  if out.exists():
    raise UserError(f"--output_dir '{out}' exists; choose a new directory")
  try:
    return _tokenize(fv, out)
  except ConfigError as e:  # the readers name data.* fields: say the flags that set them here
    raise UserError(as_flags(str(e))) from None


# The data.* fields that a flag of `axtrain tokenize` sets under another name.
_RENAMED = {"path": "input"}


def as_flags(message: str) -> str:
  """`message` with each `data.NAME` that is a flag of `axtrain tokenize` written as `--FLAG`
  (the readers' errors name the training config's fields: `set data.on_error=skip`)."""
  own = {"kind", "on_error", *reader_fields()}
  def flag(match: re.Match) -> str:
    name = match[1]
    return f"--{_RENAMED.get(name, name)}" if name in own or name in _RENAMED else match[0]
  return re.sub(r"(?<![\w.-])data\.(\w+)", flag, message)


def _tokenize(fv: flags.FlagValues, out: pathlib.Path) -> int:
  """Writes the shards and tokens.json under OUT.partial, renamed to `out` when complete; a
  failure part-way (a bad document, no documents, a full disk, Ctrl-C or SIGTERM) removes
  OUT.partial (launcher/staging.py), and so does the next run after a SIGKILL."""
  tokenizer = _tokenizer(fv)
  files = documents.expand(fv.input, what="--input")
  kind = _kind(fv.kind, files)
  cfg, reader = _reader(fv, kind)
  errors = documents.Errors(fv.on_error)
  with Staging(out, command="tokenize", partial=True) as partial:
    writer = _write(fv, cfg, reader, files, errors=errors, tokenizer=tokenizer, root=partial)
    meta = {"format": fv.format, "dtype": np.dtype(tokenizer.dtype).name,
            "shards": writer.names, "tokenizer": tokenizer.describe(),
            "num_docs": writer.num_docs, "num_tokens": writer.num_tokens,
            "skipped_documents": errors.skipped,
            "source": {"kind": kind, "input": fv.input,
                       **{n: getattr(cfg, n) for n in reader_fields() if hasattr(cfg, n)}}}
    disk.write_atomic(partial / META, (json.dumps(meta, indent=1) + "\n").encode())
  print(f"axtrain tokenize: {writer.num_docs:,} documents, {writer.num_tokens:,} tokens in "
        f"{len(writer.names)} shard(s) -> {out}"
        + (f"; skipped {errors.skipped} bad documents (first: {errors.first})"
           if errors.skipped else ""))
  return 0


def _write(fv: flags.FlagValues, cfg, reader, files: list[str], *, errors: documents.Errors,
           tokenizer: tokenizers.Tokenizer, root: pathlib.Path) -> "_ShardWriter":
  """Every document of `files`, tokenized into shards under `root`; UserError if none."""
  writer = _ShardWriter(root, fv.format, tokenizer.dtype, fv.shard_tokens)
  batch = []
  for _, _, doc in reader.documents(cfg, files, errors=errors):
    batch.append(doc)
    if len(batch) == corpus_lib.ENCODE_CHUNK:
      writer.add(tokenizer.encode(batch))
      batch = []
  writer.add(tokenizer.encode(batch))
  writer.close()
  if writer.num_docs == 0:
    raise UserError(f"--input '{fv.input}': no documents found")
  return writer


def _kind(given: str | None, files: list[str]) -> str:
  """--kind, or the document kind that the input files' names end with (a note says which);
  UserError where they end with none or with several kinds' endings."""
  if given is not None:
    return given
  found = corpus_lib.kinds_of(files)
  kinds = set(found.values())
  if len(kinds) == 1 and None not in kinds:
    kind = kinds.pop()
    print(f"axtrain: note: tokenize: --kind={kind}, from the input's file names "
          f"({', '.join(f'*{e}' for e in found)}); give --kind to read them as another kind",
          file=sys.stderr)
    return kind
  endings = ", ".join(f"*{e} ({k or 'no kind'})" if e else f"no ending ({k or 'no kind'})"
                      for e, k in found.items())
  raise UserError(f"tokenize: --kind is not given and the input's file names do not say one "
                  f"kind: {endings}; give --kind={'|'.join(corpus_lib.document_kinds())}")


def _reader(fv: flags.FlagValues, kind: str):
  """(the `kind`'s parsed data config, its source class) from the reader flags given."""
  own = {}
  for name, by_kind in reader_fields().items():
    if fv[name].present:
      if kind not in by_kind:
        raise UserError(f"--{name} is not read by --kind={kind} (only by "
                        f"{' and '.join(by_kind)})")
      own[name] = fv[name].value
  try:
    node = DATA.node(kind, path=fv.input, on_error=fv.on_error, **own)
    return DATA.parse(node, "data"), DATA.entry(kind).target
  except ConfigError as e:
    raise UserError(f"tokenize: {e}") from None


def _tokenizer(fv: flags.FlagValues) -> tokenizers.Tokenizer:
  fields = {"add_bos": fv.add_bos, "add_eos": fv.add_eos}
  if fv.tokenizer == "bytes":
    if fv.tokenizer_path is not None:
      with_path = [k for k in tokenizers.TOKENIZERS.kinds() if "path" in {
          f.name for f in dataclasses.fields(tokenizers.TOKENIZERS.entry(k).config_cls)}]
      raise UserError(f"--tokenizer_path is not used by the bytes tokenizer; set --tokenizer="
                      f"{' or '.join(with_path)}, or drop the path")
  elif fv.tokenizer_path is None:
    raise UserError(f"--tokenizer={fv.tokenizer} needs --tokenizer_path (the model file)")
  else:
    fields["path"] = fv.tokenizer_path
  return tokenizers.build(fv.tokenizer, **fields)


def _save_npy(path: pathlib.Path, array: np.ndarray) -> None:
  """np.save's file (format 1.0), written by trainer/disk.py: a full disk is an OSError with its
  errno (np.save reports a short write without one: `N requested and M written`)."""
  header = io.BytesIO()
  np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
  disk.write_atomic(path, [header.getvalue(), np.ascontiguousarray(array)])


class _ShardWriter:
  def __init__(self, root: pathlib.Path, fmt: str, dtype, shard_tokens: int):
    self.root, self.fmt, self.dtype, self.shard_tokens = root, fmt, dtype, shard_tokens
    self.names: list[str] = []
    self.num_docs = self.num_tokens = 0
    self._docs: list[np.ndarray] = []
    self._tokens = 0

  def add(self, docs: list[np.ndarray]) -> None:
    for doc in docs:
      self._docs.append(doc)
      self._tokens += len(doc)
      if self._tokens >= self.shard_tokens:
        self._flush()

  def _flush(self) -> None:
    if not self._docs:
      return
    name = f"shard-{len(self.names):05d}"
    if self.fmt == "npy":
      _save_npy(self.root / f"{name}.tokens.npy", np.concatenate(self._docs).astype(self.dtype))
      _save_npy(self.root / f"{name}.lengths.npy", np.array([len(d) for d in self._docs], np.int64))
    else:
      from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel
      writer = array_record_module.ArrayRecordWriter(str(self.root / f"{name}.array_record"),
                                                     "group_size:1")
      for doc in self._docs:
        writer.write(doc.astype(np.dtype(self.dtype).newbyteorder("<")).tobytes())
      writer.close()
    self.names.append(name)
    self.num_docs += len(self._docs)
    self.num_tokens += self._tokens
    self._docs, self._tokens = [], 0

  def close(self) -> None:
    self._flush()
