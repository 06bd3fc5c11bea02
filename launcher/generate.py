"""`axtrain generate`: continue prompts with the model of a run directory.

    axtrain generate --run_dir=runs/demo --prompt="def main(" --max_new_tokens=80
    axtrain generate --run_dir=RUN --prompt_file=prompts.txt --temperature=0 --json

Loads the latest (or --step's) checkpoint of a training run or of an
`axtrain convert --from_hf` output, encodes each prompt with the run's
tokenizer (its config's data.tokenizer; a run that names none reads UTF-8 bytes
if its model has 256 ids, and is refused otherwise), samples
(trainer/generate.py: KV-cache prefill, then one jitted loop) and prints each
continuation, one per prompt; --json prints one object per prompt instead.
Sampling: --temperature=0 is greedy; --top_k=0 and --top_p=1 turn those filters
off. A row stops at the tokenizer's EOS id or after --max_new_tokens (cut to
what fits in the model's maximum length).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from launcher.errors import UserError, suggest
from trainer import disk

USAGE = ("usage: axtrain generate --run_dir=DIR (--prompt=TEXT | --prompt_file=FILE) [--step=N] "
         "[--max_new_tokens=64] [--temperature=1.0] [--top_k=0] [--top_p=1.0] [--seed=0] [--json]")
# name -> (type, default); None: required or absent.
FLAGS = {"run_dir": (str, None), "prompt": (str, None), "prompt_file": (str, None),
         "step": (int, None), "max_new_tokens": (int, 64), "temperature": (float, 1.0),
         "top_k": (int, 0), "top_p": (float, 1.0), "seed": (int, 0), "json": (bool, False)}


def parse_args(argv: list[str]) -> dict:
  out = {name: default for name, (_, default) in FLAGS.items()}
  for arg in argv[1:]:
    if arg in ("-h", "--help"):
      sys.stdout.write(__doc__.strip() + "\n\n" + USAGE + "\n")
      raise SystemExit(0)
    name, sep, value = arg[2:].partition("=") if arg.startswith("--") else (arg, "", "")
    if not arg.startswith("--") or name not in FLAGS:
      raise UserError(f"generate: unknown argument '{arg}'{suggest(name, FLAGS)}; {USAGE}")
    kind = FLAGS[name][0]
    if kind is bool:
      if sep:
        raise UserError(f"generate: --{name} takes no value; {USAGE}")
      out[name] = True
      continue
    if not sep:
      raise UserError(f"generate: --{name} needs a value (--{name}=...); {USAGE}")
    try:
      out[name] = kind(value)
    except ValueError:
      raise UserError(f"generate: --{name} must be {'an integer' if kind is int else 'a number'}"
                      f", got '{value}'") from None
  if not out["run_dir"]:
    raise UserError(f"generate: --run_dir is required; {USAGE}")
  if (out["prompt"] is None) == (out["prompt_file"] is None):
    raise UserError(f"generate: give exactly one of --prompt / --prompt_file; {USAGE}")
  return out


def read_prompts(args: dict) -> list[str]:
  if args["prompt"] is not None:
    if not args["prompt"]:
      raise UserError("generate: --prompt is empty; give some text to continue")
    return [args["prompt"]]
  path = pathlib.Path(os.path.expanduser(args["prompt_file"]))
  if (why := disk.not_a(path, "file")):
    raise UserError(f"generate: --prompt_file {path} {why}")
  lines = path.read_text(encoding="utf-8").splitlines()
  if not lines:
    raise UserError(f"generate: --prompt_file {path} is empty; write one prompt per line")
  for i, line in enumerate(lines, 1):
    if not line:
      raise UserError(f"generate: line {i} of --prompt_file {path} is empty; write one prompt "
                      f"per line")
  return lines


def read_run_config(run_dir: pathlib.Path) -> dict:
  if (why := disk.not_a(run_dir, "directory")):
    raise UserError(f"generate: --run_dir {run_dir} {why}")
  from launcher import folders  # pylint: disable=import-outside-toplevel
  if folders.hf_model(run_dir):
    raise UserError(f"generate: {run_dir} is a Hugging Face model, not a run directory; convert "
                    f"it into a new one, `axtrain convert --from_hf={run_dir} "
                    f"--output_dir=NEW_RUN`, then `axtrain generate --run_dir=NEW_RUN`")
  if not (run_dir / "config.json").is_file():
    raise UserError(f"generate: {run_dir} holds no config.json; expected an axtrain run directory")
  ckpts = run_dir / "checkpoints"
  if not ckpts.is_dir() or not any(p.name.isdigit() for p in ckpts.iterdir()):
    raise UserError(f"generate: {run_dir} holds no checkpoint; train it first (or generate from "
                    f"a Hugging Face model converted into a new run directory, `axtrain convert "
                    f"--from_hf=HF_DIR --output_dir=NEW_RUN`)")
  return json.loads((run_dir / "config.json").read_text())


def run_tokenizer(cfg: dict, *, converted_from: str | None = None):
  """The tokenizer the run trained with, for prompts: its BOS if it added one, never EOS.

  The data node's tokenizer (a mixture's: its first component's; synthetic data's: the one
  it names, e.g. a converted model's), the one an `axtrain tokenize` directory recorded, or,
  where the run names none, bytes for a 256-id model; any other model's ids are not bytes,
  so that is refused, naming the fix (`converted_from`: the Hugging Face folder a converted
  run came from, to convert again with its tokenizer)."""
  from trainer.data import tokenizers, tokens  # pylint: disable=import-outside-toplevel
  data = cfg["data"]
  node = data.get("tokenizer") or next(
      (src.get("tokenizer") for src in data.get("sources") or () if src.get("tokenizer")), None)
  if node is None and data.get("kind") == "tokens":
    node = tokens.read_tokens_meta(data["path"], what="data.path")["tokenizer"]
  if node is None:
    node = {"kind": _bytes_for(cfg, converted_from=converted_from)}
  fields = {k: v for k, v in node.items() if k not in ("kind", "vocab_size", "add_eos")}
  return tokenizers.build(node["kind"], **fields, add_eos=False)


def _bytes_for(cfg: dict, *, converted_from: str | None) -> str:
  """'bytes' for a run that names no tokenizer and whose model has the bytes tokenizer's 256
  ids; else a UserError: no other vocabulary is UTF-8 bytes."""
  from trainer.data.tokenizers import BytesTokenizer  # pylint: disable=import-outside-toplevel
  vocab = cfg["model"]["vocab_size"]
  if vocab == BytesTokenizer.vocab_size:
    return BytesTokenizer.name
  fix = (f"convert it again with its tokenizer: axtrain convert --from_hf={converted_from} "
         f"--tokenizer=PATH/TO/tokenizer.json --output_dir=NEW_RUN_DIR" if converted_from else
         "train with one named: --config.data.tokenizer.kind=huggingface "
         "--config.data.tokenizer.path=PATH/TO/tokenizer.json")
  raise UserError(f"generate: the run names no tokenizer (data.kind={cfg['data'].get('kind')}) "
                  f"and its model's {vocab} ids are not the {BytesTokenizer.name} tokenizer's "
                  f"{BytesTokenizer.vocab_size}; {fix}")


def max_length(run, run_dir: pathlib.Path) -> int:
  """Tokens the model can attend over: its learned positions, a converted model's
  max_position_embeddings, or else the sequence length it was trained at."""
  pos = run.model.position_embedding
  if getattr(pos, "max_length", None):
    return pos.max_length
  hf = run_dir / "hf_config.json"
  if hf.is_file():
    return int(json.loads(hf.read_text()).get("max_position_embeddings", run.data.seq_len))
  return run.data.seq_len


def main(argv: list[str]) -> int:
  args = parse_args(argv)
  from trainer.generate import SamplingOptions  # pylint: disable=import-outside-toplevel
  options = SamplingOptions(max_new_tokens=args["max_new_tokens"],
                            temperature=args["temperature"], top_k=args["top_k"],
                            top_p=args["top_p"])
  options.check()
  if args["step"] is not None and args["step"] < 0:
    raise UserError(f"generate: --step must be >= 0, got {args['step']}")
  if not 0 <= args["seed"] < 2 ** 63:  # as trainer.seed: a key of the sampling's random stream
    raise UserError(f"generate: --seed must be a whole number in [0, 2**63), got {args['seed']}")
  prompts = read_prompts(args)
  run_dir = pathlib.Path(os.path.expanduser(args["run_dir"]))
  cfg = read_run_config(run_dir)
  for result in sample_run(run_dir, cfg, prompts, options, step=args["step"], seed=args["seed"]):
    if args["json"]:
      print(json.dumps(result, ensure_ascii=False))
    else:
      print(result["text"])
  return 0


def sample_run(run_dir: pathlib.Path, cfg: dict, prompts: list[str], options, *,
               step: int | None, seed: int) -> list[dict]:
  """One dict per prompt: prompt, prompt_ids, ids (generated), text (their decoding), stop."""
  import configs.base  # noqa: F401  pylint: disable=import-outside-toplevel  (all registries)
  from modules.decoder import MODELS  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib  # pylint: disable=import-outside-toplevel

  from launcher.run_dir import RunDir  # pylint: disable=import-outside-toplevel

  run = config_lib.parse(cfg)
  model = MODELS.build(run.model)
  tok = run_tokenizer(cfg, converted_from=RunDir(run_dir).info().get("converted_from"))
  limit = max_length(run, run_dir)
  ids = encode_prompts(tok, prompts, limit=limit, vocab_size=run.model.vocab_size)
  options, note = fit_options(options, longest=max(len(x) for x in ids), limit=limit,
                              eos_id=tok.eos_id)
  entry, mesh = local_mesh()
  params = load_run_params(run_dir, run=run, model=model, mesh=mesh, rules=entry.rules,
                           step=step)
  if note:
    print(note, file=sys.stderr)
  tokens, counts, hit_eos = generate_ids(params, ids, model=model, options=options, mesh=mesh,
                                         rules=entry.rules, seed=seed)
  return decode_results(tok, prompts, ids, tokens=tokens, counts=counts, hit_eos=hit_eos)


def encode_prompts(tok, prompts: list[str], *, limit: int, vocab_size: int) -> list:
  """Each prompt's token ids; refuses a prompt that encodes to nothing, one that leaves no room
  for a new token within `limit`, and ids the model's vocabulary does not have."""
  ids = tok.encode(prompts)
  if not all(len(x) for x in ids):
    raise UserError("generate: a prompt encodes to no tokens; give some text to continue")
  longest = max(len(x) for x in ids)
  if longest >= limit:
    raise UserError(f"generate: a prompt is {longest} tokens long but the model's maximum length "
                    f"is {limit} (prompt + at least one new token must fit); shorten it")
  top = max(int(x.max()) for x in ids)
  if top >= vocab_size:
    raise UserError(f"generate: the tokenizer gives id {top} but model.vocab_size is "
                    f"{vocab_size}; this run's tokenizer does not match its model")
  return ids


def fit_options(options, *, longest: int, limit: int, eos_id: int | None):
  """(options, note): max_new_tokens cut to what fits after the longest prompt within `limit`,
  the tokenizer's EOS id and the cache length set; the note says so when it was cut."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  new = min(options.max_new_tokens, limit - longest)
  note = (f"axtrain: note: max_new_tokens cut to {new} (the model's maximum length is {limit})"
          if new < options.max_new_tokens else None)
  return dataclasses.replace(options, max_new_tokens=new, eos_id=eos_id,
                             cache_length=longest + new), note


def local_mesh():
  """(entry, mesh): the auto mesh of the devices here, not the run's axis sizes (those were for
  its devices)."""
  import jax  # pylint: disable=import-outside-toplevel
  from trainer import meshes, sharding  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib  # pylint: disable=import-outside-toplevel
  entry = meshes.select("auto")
  mesh = sharding.make_mesh(sharding.resolve_axes(entry, config_lib.MeshConfig(),
                                                  jax.device_count()))
  return entry, mesh


def load_run_params(run_dir: pathlib.Path, *, run, model, mesh, rules, step: int | None):
  """The checkpoint's parameters (the latest or `step`'s), sharded over `mesh` and cast to the
  run's compute dtype on the devices here."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel

  from launcher.errors import warn  # pylint: disable=import-outside-toplevel
  from trainer import checkpoint, checkpoint_files, sharding  # pylint: disable=import-outside-toplevel
  from trainer.experiment import compute_dtype  # pylint: disable=import-outside-toplevel
  from trainer.step import cast_floats  # pylint: disable=import-outside-toplevel

  abstract = jax.eval_shape(lambda k: model.init(k, jnp.zeros((1, 8), jnp.int32))["params"],
                            jax.random.key(0))
  shardings = sharding.logical_shardings(abstract, mesh, rules)
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on a read-only manager
  try:
    step = checkpoint_files.readable_step(run_dir / "checkpoints", step, warn=warn)
    params = checkpoint.load_params(run_dir, nn.meta.unbox(abstract), shardings, step=step)
  except checkpoint.CheckpointError as e:
    raise UserError(f"generate: {e}") from None
  finally:
    absl_logging.set_verbosity(verbosity)
  return cast_floats(params, compute_dtype(run.trainer.compute_dtype, jax.devices()[0].platform))


def generate_ids(params, ids: list, *, model, options, mesh, rules, seed: int):
  """(tokens, counts, hit_eos) as numpy arrays, one row per prompt and the padding rows: the
  prompts padded into one batch that splits over the mesh's batch shards, then sampled."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from trainer import sharding  # pylint: disable=import-outside-toplevel
  from trainer.generate import generate  # pylint: disable=import-outside-toplevel

  rows, longest = len(ids), max(len(x) for x in ids)
  shards = sharding.num_shards(sharding.batch_sharding(mesh, rules), dim=0)
  batch = -(-rows // shards) * shards  # padded with copies of the first prompt
  prompts_BxP = np.zeros((batch, longest), np.int32)
  lengths_B = np.full((batch,), len(ids[0]), np.int32)
  for i, x in enumerate(ids):
    prompts_BxP[i, :len(x)] = x
    lengths_B[i] = len(x)
  prompts_BxP[rows:, :len(ids[0])] = ids[0]
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    out = generate(params, jnp.asarray(prompts_BxP), jnp.asarray(lengths_B),
                   jax.random.key(seed), model=model, options=options)
  return tuple(np.asarray(x) for x in (out.tokens, out.num_tokens, out.hit_eos))


def decode_results(tok, prompts: list[str], ids: list, *, tokens, counts, hit_eos) -> list[dict]:
  """One dict per prompt: the generated ids up to (not including) EOS and their text."""
  results = []
  for i, prompt in enumerate(prompts):
    gen = tokens[i, :counts[i] - int(hit_eos[i])].tolist()  # the EOS itself is not text
    results.append({"prompt": prompt, "prompt_ids": ids[i].tolist(), "ids": gen,
                    "text": tok.decode(gen), "stop": "eos" if hit_eos[i] else "length"})
  return results
