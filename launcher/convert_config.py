"""What `axtrain convert --from_hf` writes as the run's config.py, and the tokenizer it names.

The tokenizer (data.tokenizer): --tokenizer (a tokenizer.json, a SentencePiece .model or
`bytes`, checked against the model's vocabulary; a file by its absolute path), else
HF_DIR/tokenizer.json (if it loads and its ids fit), else UTF-8 bytes for a 256-id model, else
none, with a note (`choose_tokenizer`). config.py's docstring says which it holds and gives the
command that trains on a corpus (`config_py`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import textwrap

from launcher.errors import ConfigError, UserError
from trainer import disk
from trainer.data.tokenizers import BytesTokenizer

CONFIG_PY = '''"""Run config written by `axtrain convert --from_hf={source}`.

    axtrain --config={run_dir}/config.py --output_dir={run_dir}

trains the converted model on synthetic data: {max_steps} steps of {batch_size} x {seq_len}
uniformly random tokens (data.kind=synthetic), which shows that it trains, not what it learns.
{tokenizer_text}
On your corpus (docs/data.md) the same command becomes:

    axtrain --config={run_dir}/config.py --output_dir={run_dir} --config.data.kind=jsonl --config.data.path=corpus.jsonl{tokenizer_flags}

Add --config.trainer.max_steps=20 for a short try. The config is held here, not read from
config.json (which records the run's current config), so that training with other settings
never changes it.
"""

import json

import ml_collections

from core.config_args import parse_arg

CONFIG = {config}


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments
  return ml_collections.ConfigDict(json.loads(CONFIG))
'''

# What a text kind needs when the converted config names no tokenizer.
_UNKNOWN_FLAGS = {"kind": "huggingface", "path": "PATH/TO/tokenizer.json"}


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """The converted model's tokenizer: `node`, the data.tokenizer node that config.py holds
  (None: none known), `what` it is for config.py's docstring, and `note`, one line for stderr
  when none is known."""
  node: dict | None
  what: str
  note: str | None = None

  def text(self) -> str:
    """config.py's paragraph on its tokenizer."""
    if self.node is None:
      text = (f"It names no tokenizer: {self.what}, so a text kind needs the model's own "
              f"named on the command line (or convert again with --tokenizer=PATH).")
    else:
      text = (f"Its tokenizer (data.tokenizer) is {self.what}: a switch to a text kind (jsonl, "
              f"text, parquet, ...) keeps it, and `axtrain generate` encodes prompts with it.")
    return textwrap.fill(text, width=94, break_long_words=False, break_on_hyphens=False)

  def flags(self) -> str:
    """The corpus command's tokenizer flags: none when config.py names the tokenizer."""
    if self.node is not None:
      return ""
    return "".join(f" --config.data.tokenizer.{k}={v}" for k, v in _UNKNOWN_FLAGS.items())


def choose_tokenizer(source: pathlib.Path, vocab_size: int, named: str | None) -> Tokenizer:
  """The converted run's tokenizer: --tokenizer, else the folder's own tokenizer.json (if it
  loads and its ids fit the model's), else bytes for a model of the bytes tokenizer's
  vocabulary (what `convert --to_hf` of a bytes-tokenizer run writes), else none: the note asks
  for it, as the bytes tokenizer cannot serve any other vocabulary (ids past the model's, or
  ids it never learned)."""
  if named is not None:
    node = _named(named, vocab_size)
    what = "UTF-8 bytes" if node["kind"] == BytesTokenizer.name else node["path"]
    return Tokenizer(node, f"{what} (convert --tokenizer={named})")
  own = source / "tokenizer.json"
  if own.is_file():
    node = {"kind": "huggingface", "path": str(own.absolute())}
    try:
      problem = _unfit(node, vocab_size)
    except ConfigError as e:
      problem = f"does not load ({' '.join(str(e).split())})"
    if problem is None:
      return Tokenizer(node, f"the model's own, {node['path']}")
    why = f"{own} {problem}"
  elif vocab_size == BytesTokenizer.vocab_size:
    return Tokenizer({"kind": BytesTokenizer.name},
                      f"UTF-8 bytes, whose {vocab_size} ids are the model's vocabulary ({source} "
                      f"has no tokenizer.json)")
  else:
    why = (f"{source} has no tokenizer.json and the model's {vocab_size} ids are not the "
           f"{BytesTokenizer.name} tokenizer's {BytesTokenizer.vocab_size}")
  return Tokenizer(None, why, note=f"axtrain: note: {why}: no tokenizer chosen; to train on "
                                    f"text or generate, convert again with "
                                    f"--tokenizer=PATH/TO/tokenizer.json (the model's own)")


def _unfit(node: dict, vocab_size: int) -> str | None:
  """Why tokenizer `node` cannot serve a model of `vocab_size` ids (it has more ids), else
  None; ConfigError when it does not load. Loaded without BOS/EOS: one whose EOS is not found
  is still the model's (training says to set data.tokenizer.add_eos=False)."""
  from trainer.data import tokenizers  # pylint: disable=import-outside-toplevel
  tok = tokenizers.build(**node, add_eos=False)
  if tok.vocab_size > vocab_size:
    return f"has {tok.vocab_size} ids but the model's vocabulary has {vocab_size}"
  return None


def _named(value: str, vocab_size: int) -> dict:
  """The tokenizer node of --tokenizer=VALUE (a tokenizer.json, a SentencePiece .model or
  `bytes`; a file by its absolute path, so that the run finds it from any directory), loaded
  to check that it is one and that its ids fit the model's vocabulary."""
  if value == BytesTokenizer.name:
    node = {"kind": BytesTokenizer.name}
  elif (why := disk.not_a(value, "file")):
    raise UserError(f"convert: --tokenizer={value} {why}; give the model's "
                    f"tokenizer.json (or SentencePiece .model), or {BytesTokenizer.name}")
  else:
    node = {"kind": "huggingface" if value.endswith(".json") else "sentencepiece",
            "path": str(pathlib.Path(value).absolute())}
  try:
    problem = _unfit(node, vocab_size)
  except ConfigError as e:
    raise UserError(f"convert: --tokenizer={value}: {' '.join(str(e).split())}") from None
  if problem is not None:
    raise UserError(f"convert: --tokenizer={value} {problem}; name the tokenizer the model was "
                    f"trained with")
  return node


def config_py(resolved: dict, *, source: pathlib.Path, run_dir: pathlib.Path,
              tokenizer: Tokenizer) -> str:
  """The converted run's config.py: `resolved` (its run config) with a docstring that gives the
  commands that train it, on synthetic tokens and on a corpus with `tokenizer`."""
  text = json.dumps(resolved, indent=2, sort_keys=True)
  quote = "'" * 3
  literal = f"r{quote}\n{text}\n{quote}" if quote not in text else repr(text)
  return CONFIG_PY.format(source=source, run_dir=run_dir, config=literal,
                          tokenizer_text=tokenizer.text(), tokenizer_flags=tokenizer.flags(),
                          max_steps=resolved["trainer"]["max_steps"],
                          batch_size=resolved["data"]["batch_size"],
                          seq_len=resolved["data"]["seq_len"])
