"""`axtrain convert`: Hugging Face <-> axtrain run directory.

    axtrain convert --from_hf=HF_DIR --output_dir=RUN_DIR [--tokenizer=PATH|bytes]
                    [--scan_layers=true|false] [--fused_qkv[=true|false]]
                    [--fused_gate_up[=true|false]]
    axtrain convert --to_hf=RUN_DIR --output_dir=HF_DIR [--step=N]

--from_hf reads config.json and *.safetensors (a single file or a sharded
index) of a LlamaForCausalLM, Qwen3ForCausalLM or GPT2LMHeadModel and writes a
run directory: config.json (the resolved run config), config.py (whose
get_config() returns that config, so `axtrain --config=RUN_DIR/config.py
--output_dir=RUN_DIR` continues training from the converted weights), run.json,
hf_config.json (the source's config, reused by --to_hf) and a step-0 checkpoint,
its layers scanned (one stacked `layers` tree; --scan_layers=false or
--no_scan_layers: unrolled layers_0, layers_1, ..., as model.scan_layers says; a block
group's layers past its whole repeats, Gemma 3 1b's last two, in layers_remainder), its
projections separate (--fused_qkv, --fused_gate_up: q/k/v, or a gated MLP's gate and up,
as one kernel each, as model.block.attention.fused_qkv and
model.block.ffn.fused_gate_up say; default false).
Training in RUN_DIR keeps config.py, hf_config.json and checkpoints/0,
--overwrite included.

The config names the model's tokenizer as data.tokenizer: --tokenizer (a
tokenizer.json, a SentencePiece .model or `bytes`, checked against the model's
vocabulary; a file by its absolute path), else HF_DIR/tokenizer.json (if it
loads and its ids fit), else UTF-8 bytes for a 256-id model. A switch from its synthetic data to any text kind
(--config.data.kind=jsonl, ...) keeps it, and `axtrain generate` encodes prompts
with it. For any other model it names none, since no other vocabulary is the
bytes tokenizer's: a note says so, and a text kind or generate then refuses,
naming the fix. config.py's docstring says which tokenizer it holds and gives
the command that trains on a corpus.

--to_hf writes config.json + model.safetensors from the newest checkpoint of a
run directory that reads (a newer one that does not is named in a warning and left
where it is), or --step's. The vocabulary rows that pad the embedding and LM head to
model.vocab_multiple are added (zeros) on import and dropped on export. Output
goes to a temporary directory that is renamed into place at the end, so a
mistake writes nothing; a disk without room for it is one line, exit 74, and
leaves nothing either. An --output_dir that is not empty, or that lies inside a
run directory (where that run would hold files it did not write), is refused.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np

from launcher import hf_files
from launcher.convert_config import choose_tokenizer, config_py
from launcher.errors import UserError, suggest
from launcher.staging import Staging
from trainer import disk
from trainer.run_files import Manifest

USAGE = ("usage: axtrain convert --from_hf=HF_DIR --output_dir=RUN_DIR [--tokenizer=PATH|bytes] "
         "[--scan_layers=true|false] [--fused_qkv[=true|false]] [--fused_gate_up[=true|false]] "
         "| axtrain convert --to_hf=RUN_DIR --output_dir=HF_DIR [--step=N]")
# The layout flags of --from_hf: the model fields of the same name (every one in the model's
# config, each block's of a layer pattern), and their defaults.
LAYOUT = {"scan_layers": True, "fused_qkv": False, "fused_gate_up": False}
_FLAGS = ("from_hf", "to_hf", "output_dir", "tokenizer", *LAYOUT, "no_scan_layers", "step")
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


def parse_args(argv: list[str]) -> dict:
  out: dict = {}
  for arg in argv[1:]:
    if arg in ("-h", "--help"):
      sys.stdout.write(__doc__.strip() + "\n")
      raise SystemExit(0)
    name, sep, value = arg.lstrip("-").partition("=")
    if not arg.startswith("--") or name not in _FLAGS:
      raise UserError(f"convert: unknown argument '{arg}'{suggest(name, _FLAGS)}; {USAGE}")
    if name in LAYOUT or name == "no_scan_layers":
      out[name.removeprefix("no_")] = _layout_flag(name, sep, value)
    elif not sep or not value:
      raise UserError(f"convert: --{name} needs a value (--{name}=PATH); {USAGE}")
    else:
      out[name] = os.path.expanduser(value)  # `--output_dir=~/x`: the shell leaves ~ alone
  if ("from_hf" in out) == ("to_hf" in out) or "output_dir" not in out:
    raise UserError(f"convert: give exactly one of --from_hf / --to_hf, and --output_dir; {USAGE}")
  for name, what in (("tokenizer", "the tokenizer the model was trained with"),
                     *((flag, "the layout to write; --to_hf reads either") for flag in LAYOUT)):
    if name in out and "to_hf" in out:
      raise UserError(f"convert: --{name} goes with --from_hf ({what}); {USAGE}")
  if "step" in out:
    if "from_hf" in out:
      raise UserError(f"convert: --step goes with --to_hf (the checkpoint to export); {USAGE}")
    if not out["step"].isdigit():
      raise UserError(f"convert: --step={out['step']}: expected a whole number >= 0; {USAGE}")
    out["step"] = int(out["step"])
  out["layout"] = {name: out.pop(name, default) for name, default in LAYOUT.items()}
  return out


def _layout_flag(name: str, sep: str, value: str) -> bool:
  """--NAME[=true|false] of LAYOUT, or --no_scan_layers: whether the converted layers are
  scanned (stacked on a leading axis) or unrolled, the projections fused or separate."""
  if name == "no_scan_layers":
    if sep:
      raise UserError(f"convert: --no_scan_layers takes no value (or --scan_layers=false); "
                      f"{USAGE}")
    return False
  if not sep:
    return True
  if value.lower() not in _BOOLS:
    raise UserError(f"convert: --{name}={value}: expected true or false; {USAGE}")
  return _BOOLS[value.lower()]


def set_layout(node, layout: dict, *, architecture: str) -> None:
  """Sets each field of `layout` (LAYOUT's names) wherever the model node (a ConfigDict) of
  `architecture` holds it: model.scan_layers, each attention's fused_qkv and each MLP's
  fused_gate_up (a layer pattern's blocks each); UserError for --fused_gate_up where no MLP
  has a gate."""
  if layout["fused_gate_up"] and not any(_values(node.to_dict(), "gated")):
    raise UserError(f"convert: --fused_gate_up: the {architecture} model's MLP has no gate "
                    f"(nothing to fuse); leave the flag out")

  def walk(node):
    for key, value in node.items():
      if key in layout:
        node[key] = layout[key]
      elif hasattr(value, "items"):
        walk(value)
  walk(node)


def _values(node: dict, key: str) -> list:
  """Every value of field `key` in a model config (a dict of nested dicts)."""
  return [v for k, value in node.items()
          for v in ([value] if k == key else _values(value, key) if isinstance(value, dict)
                    else [])]


def layout_of(model: dict) -> dict:
  """The LAYOUT values of a model config (a dict; a fused field true in any block counts)."""
  return {name: any(_values(model, name)) if _values(model, name) else default
          for name, default in LAYOUT.items()}


def main(argv: list[str]) -> int:
  args = parse_args(argv)
  output = pathlib.Path(args["output_dir"])
  from launcher.run_dir import check_writable  # pylint: disable=import-outside-toplevel
  check_writable(output)
  from launcher.folders import check_outside_runs  # pylint: disable=import-outside-toplevel
  check_outside_runs(output)
  _check_empty(output)
  if "from_hf" in args:
    from_hf(pathlib.Path(args["from_hf"]), output, layout=args["layout"],
            tokenizer=args.get("tokenizer"), argv=argv)
  else:
    to_hf(pathlib.Path(args["to_hf"]), output, step=args.get("step"))
  print(f"axtrain: wrote {output}", file=sys.stderr)
  return 0


def _check_empty(path: pathlib.Path) -> None:
  if path.exists() and (not path.is_dir() or any(path.iterdir())):
    raise UserError(f"--output_dir {path} exists and is not empty; choose an empty or new "
                    f"directory")


# -- parameter trees -----------------------------------------------------------------------

def stack_layers(params: dict, model, *, scan: bool) -> dict:
  """{'layers': [layer, ...]} -> scanned ('layers' with a leading axis) or layers_i, for parsed
  model config `model` (a block group's layers gathered into its repeats first, the layers
  after its whole repeats into its remainder)."""
  import jax  # pylint: disable=import-outside-toplevel
  from modules import block_group, decoder  # pylint: disable=import-outside-toplevel
  out = {k: v for k, v in params.items() if k != "layers"}
  whole = model.repeats * block_group.depth(model.block)
  repeats = block_group.per_repeat(params["layers"][:whole], model.block)
  if scan:
    out["layers"] = jax.tree.map(lambda *xs: np.stack(xs), *repeats)
  else:
    out.update({f"layers_{i}": repeat for i, repeat in enumerate(repeats)})
  if model.remainder is not None:
    out[decoder.REMAINDER] = block_group.per_repeat(params["layers"][whole:], model.remainder)[0]
  return out


def split_layers(params: dict, model) -> dict:
  """The inverse of stack_layers, for either layout."""
  import jax  # pylint: disable=import-outside-toplevel
  from modules import block_group, decoder  # pylint: disable=import-outside-toplevel
  out = {k: v for k, v in params.items()
         if k not in ("layers", decoder.REMAINDER) and not k.startswith("layers_")}
  if "layers" in params:
    repeats = [jax.tree.map(lambda x, i=i: x[i], params["layers"]) for i in range(model.repeats)]
  else:
    repeats = [params[f"layers_{i}"] for i in range(model.repeats)]
  out["layers"] = block_group.per_layer(repeats, model.block)
  if model.remainder is not None:
    out["layers"] += block_group.per_layer([params[decoder.REMAINDER]], model.remainder)
  return out


def layer_tree(abstract, model) -> dict:
  """The model's parameter names as {'layers': [layer, ...], ...} (either layout), leaves 0."""
  import jax  # pylint: disable=import-outside-toplevel
  zeros = jax.tree.map(lambda _: 0, abstract)
  if "layers" in zeros:  # the stack's leaves are zeros: one repeat's tree stands for each
    zeros = {**zeros, "layers": jax.tree.map(lambda _: np.zeros((model.repeats,)),
                                             zeros["layers"])}
  return jax.tree.map(lambda _: 0, split_layers(zeros, model))


def _check_tree(params, abstract) -> None:
  """Our converted tree against the model's own init shapes (a bug guard, not user input)."""
  import jax  # pylint: disable=import-outside-toplevel
  got = {jax.tree_util.keystr(p): v.shape for p, v in jax.tree_util.tree_leaves_with_path(params)}
  want = {jax.tree_util.keystr(p): v.shape
          for p, v in jax.tree_util.tree_leaves_with_path(abstract)}
  for key in sorted(set(got) | set(want)):
    if got.get(key) != want.get(key):
      raise UserError(f"converted parameter {key} has shape {got.get(key)} but the model "
                      f"expects {want.get(key)}")


def experiment_of(cfg_dict: dict):
  """The Experiment (trainer/experiment.build) of a run config, on one device: shapes only."""
  import jax  # pylint: disable=import-outside-toplevel

  import configs.base  # noqa: F401  pylint: disable=import-outside-toplevel  (all registries)
  from trainer import config as config_lib, experiment, meshes  # pylint: disable=import-outside-toplevel
  return experiment.build(config_lib.parse(cfg_dict), meshes.lookup("cpu"),
                          devices=jax.devices()[:1])


def abstract_params(exp):
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  return nn.meta.unbox(exp.abstract_state.params)


# -- checkpoints (layout owned by trainer/checkpoint.py) -------------------------------------

def _write_initial(run_dir: pathlib.Path, state) -> None:
  from trainer.checkpoint import write_initial  # pylint: disable=import-outside-toplevel
  write_initial(run_dir, state)


def _load_params(run_dir: pathlib.Path, abstract_params, step: int | None = None):
  """The parameters of `step`'s checkpoint, or of the newest that reads (a warning names a newer
  one that does not)."""
  import jax  # pylint: disable=import-outside-toplevel
  from launcher.errors import warn  # pylint: disable=import-outside-toplevel
  from trainer import checkpoint, checkpoint_files  # pylint: disable=import-outside-toplevel
  shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                           abstract_params)
  try:
    step = checkpoint_files.readable_step(run_dir / "checkpoints", step, warn=warn)
    return checkpoint.load_params(run_dir, abstract_params, shardings, step=step)
  except checkpoint.CheckpointError as e:
    raise UserError(str(e)) from None


# -- the two directions --------------------------------------------------------------------

def from_hf(hf_dir: pathlib.Path, output: pathlib.Path, *, layout: dict,
            tokenizer: str | None, argv: list[str]) -> None:
  if (why := disk.not_a(hf_dir, "directory")):
    raise UserError(f"--from_hf {hf_dir} {why}")
  hf_cfg = hf_files.read_json(hf_dir / "config.json", "expected a Hugging Face model directory")
  family = hf_files.family(hf_cfg, hf_dir)
  try:
    node = family.model_node(hf_cfg)
  except KeyError as e:
    raise UserError(f"{hf_dir / 'config.json'}: missing field {e}") from None
  set_layout(node, layout, architecture=family.architecture)
  st = hf_files.SafetensorsDir(hf_dir, family)
  hf_files.check_tensors(st, family, hf_cfg, hf_dir)

  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from configs.base import lm_config  # pylint: disable=import-outside-toplevel
  from core.registry import registry  # pylint: disable=import-outside-toplevel
  from launcher import run_dir as run_dir_lib  # pylint: disable=import-outside-toplevel
  from trainer.step import TrainState  # pylint: disable=import-outside-toplevel
  max_length = hf_cfg.get("max_position_embeddings", hf_cfg.get("n_positions", 2048))
  cfg = lm_config(node, max_steps=1000, learning_rate=1e-5, batch_size=8,
                  seq_len=min(1024, max_length), warmup_steps=100, data_kind="synthetic")
  chosen = choose_tokenizer(hf_dir, node.vocab_size, tokenizer)
  if chosen.node is not None:  # kept by a switch to any text kind; read by `axtrain generate`
    cfg.data.tokenizer = registry("tokenizer").node(**chosen.node)
  resolved = json.loads(cfg.to_json_best_effort())
  exp = experiment_of(resolved)
  abstract = abstract_params(exp)

  from modules.hf_maps import import_params, pad_vocab  # pylint: disable=import-outside-toplevel
  params = import_params(family, st.get, hf_cfg, layer_tree(abstract, exp.run.model))
  params = stack_layers(pad_vocab(params, exp.run.model.padded_vocab_size), exp.run.model,
                        scan=exp.run.model.scan_layers)
  _check_tree(params, abstract)
  params = jax.tree.map(jnp.asarray, params)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=exp.optimizer.tx.init(params))
  dtypes = sorted({st.dtype(n) for n in family.hf_shapes(hf_cfg)})
  num_params = sum(x.size for x in jax.tree.leaves(params))
  # The checkpoint holds the state's arrays (Orbax compresses them); its metadata and the JSON
  # files take a few kB.
  needed = sum(x.nbytes for x in jax.tree.leaves(state)) + 16_000
  with Staging(output, command="convert", needed=needed) as tmp:
    run_dir_lib.write_json(tmp / "config.json", resolved)
    run_dir_lib.write_json(tmp / "hf_config.json", hf_cfg)
    disk.write_atomic(tmp / "config.py", config_py(resolved, source=hf_dir, run_dir=output,
                                                   tokenizer=chosen).encode())
    Manifest(tmp).add(*(tmp / n for n in ("config.json", "hf_config.json", "config.py",
                                          "run.json")))
    run_dir_lib.write_json(tmp / "run.json", {
        "status": "converted", "converted_from": str(hf_dir.resolve()),
        "architecture": family.architecture, "hf_dtype": dtypes[0] if len(dtypes) == 1 else "F32",
        "num_params": num_params, "command": " ".join(["axtrain", "convert", *argv[1:]]),
        "versions": run_dir_lib.versions()})
    _write_initial(tmp, state)
  if chosen.note:
    print(chosen.note, file=sys.stderr)


def on_one_device(cfg: dict) -> dict:
  """A run's config with its mesh axes unset, for reading its parameters in one process on one
  device: the axes it trained with (context=4, expert=4, ...) would ask for that many devices,
  and the checkpoint is re-laid out onto this one while it is read (trainer/checkpoint.py)."""
  mesh = cfg.get("mesh")
  if not isinstance(mesh, dict):
    return cfg
  return {**cfg, "mesh": {k: (v if k == "rules" else None) for k, v in mesh.items()}}


_NUMPY_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


def to_hf(run_dir: pathlib.Path, output: pathlib.Path, *, step: int | None = None) -> None:
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  import ml_dtypes  # pylint: disable=import-outside-toplevel

  from modules.hf_maps import (  # pylint: disable=import-outside-toplevel
      drop_vocab_padding, family_of_model)
  if (why := disk.not_a(run_dir, "directory")):
    raise UserError(f"--to_hf {run_dir} {why}")
  cfg = hf_files.read_json(run_dir / "config.json", "expected an axtrain run directory")
  if not (run_dir / "checkpoints").is_dir():
    raise UserError(f"{run_dir} holds no checkpoints/ directory; nothing to convert")
  exp = experiment_of(on_one_device(cfg))
  run, abstract = exp.run, abstract_params(exp)
  info = hf_files.read_json(run_dir / "run.json", "") if (run_dir / "run.json").exists() else {}
  # a converted run goes back to the class it came from, where that class holds it
  family = family_of_model(run.model, source=info.get("architecture"))
  hf_cfg = family.hf_config(run.model)
  source = run_dir / "hf_config.json"
  hf_cfg = {**(hf_files.read_json(source, "") if source.exists() else {}), **hf_cfg}
  dtype_name = _NUMPY_DTYPES.get(info.get("hf_dtype"), "float32")
  dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.dtype(dtype_name)
  hf_cfg["torch_dtype"] = hf_cfg["dtype"] = dtype_name

  import jax  # pylint: disable=import-outside-toplevel
  from modules.hf_maps import export  # pylint: disable=import-outside-toplevel
  # Every parameter must map to a tensor: checked on zero-size stand-ins (broadcast views of
  # one zero) before the checkpoint is read, and again on the real parameters.
  stand_ins = jax.tree.map(lambda x: np.broadcast_to(np.zeros((), np.float32), x.shape),
                           abstract)
  export(family, split_layers(stand_ins, run.model), run.model)
  params = jax.tree.map(np.asarray, _load_params(run_dir, abstract, step))
  tensors = export(family, drop_vocab_padding(split_layers(params, run.model),
                                              run.model.vocab_size), run.model)
  tensors = {k: np.ascontiguousarray(v.astype(dtype)) for k, v in tensors.items()}
  config = (json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n").encode()
  # The tensors' bytes, and safetensors' header of about 100 bytes a tensor.
  with Staging(output, command="convert",
               needed=len(config) + sum(v.nbytes + 100 for v in tensors.values())) as tmp:
    disk.write_atomic(tmp / "config.json", config)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
