"""`axtrain eval`: the held-out loss of a run's checkpoint, without training.

    axtrain eval --run_dir=runs/tiny                    # latest checkpoint, the run's eval data
    axtrain eval --run_dir=runs/tiny --step=200 --config.eval.num_batches=32
    axtrain eval --run_dir=runs/tiny --config.data.kind=jsonl --config.data.path=other.jsonl

The run's config comes from its config.json; --config.eval.* and
--config.data.* overrides apply on top (the rest is fixed by the checkpoint).
The result (loss, perplexity, tokens) is printed and appended to the run's
metrics.jsonl as {"step": N, "eval_loss": ..., "source": "axtrain eval", ...};
`axtrain runs` leaves such records out of the training curves. With the run's
own settings it reproduces the run's eval_loss at that step exactly.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import ml_collections
from absl import flags
from ml_collections import config_flags

from launcher import config_loading
from launcher.errors import ConfigError, UserError, suggest, warn
from trainer import disk

USAGE = ("usage: axtrain eval --run_dir=DIR [--step=N] [--config.eval.FIELD=VALUE ...] "
         "[--config.data.FIELD=VALUE ...]")
_FLAGS = ("run_dir", "step")
OVERRIDABLE = ("eval", "data")  # sections an override may change; the checkpoint fixes the rest
SOURCE = "axtrain eval"
EXIT_FAILED = 1


def parse_args(argv: list[str]) -> tuple[dict, list[str]]:
  """({'run_dir': Path, 'step': int | None}, the --config.* override arguments)."""
  out: dict = {"run_dir": None, "step": None}
  config_args = []
  for arg in argv[1:]:
    if arg in ("-h", "--help"):
      sys.stdout.write(__doc__.strip() + "\n")
      raise SystemExit(0)
    name, sep, value = arg.lstrip("-").partition("=")
    if arg.startswith("--config."):
      if not sep:
        raise UserError(f"eval: {arg} needs a value ({arg}=VALUE)")
      section = name.split(".")[1]
      if section not in OVERRIDABLE:
        raise UserError(f"eval: {arg.partition('=')[0]} cannot be overridden: the checkpoint fixes "
                        f"everything but --config.eval.* and --config.data.*")
      config_args.append(arg)
    elif arg.startswith("--") and name in _FLAGS:
      if not value:
        raise UserError(f"eval: --{name} needs a value; {USAGE}")
      out[name] = value
    else:
      raise UserError(f"eval: unknown argument '{arg}'{suggest(name, _FLAGS)}; {USAGE}")
  if out["run_dir"] is None:
    raise UserError(f"eval: --run_dir is required; {USAGE}")
  out["run_dir"] = pathlib.Path(os.path.expanduser(out["run_dir"]))
  if out["step"] is not None:
    try:
      out["step"] = int(out["step"])
    except ValueError:
      raise UserError(f"eval: --step={out['step']}: expected a whole number") from None
  return out, config_args


def _typed(cfg: dict) -> ml_collections.ConfigDict:
  """config.json as a ConfigDict whose None fields of the data node are typed placeholders."""
  from core.registry import registry  # pylint: disable=import-outside-toplevel
  import trainer.data  # noqa: F401  pylint: disable=import-outside-toplevel  (registers sources)
  out = ml_collections.ConfigDict(cfg)
  data = cfg.get("data")
  if isinstance(data, dict) and "kind" in data:
    out.data = registry("data").node(data["kind"], **{k: v for k, v in data.items()
                                                      if k != "kind" and v is not None})
  return out


def load_config(run_dir: pathlib.Path, config_args: list[str]) -> ml_collections.ConfigDict:
  """The run's resolved config with the overrides applied (one-line errors for bad ones)."""
  path = run_dir / "config.json"
  try:
    cfg = json.loads(path.read_text())
  except FileNotFoundError:
    raise UserError(f"eval: {run_dir} has no config.json; give an axtrain run directory") \
        from None
  except ValueError as e:
    raise UserError(f"eval: {path} is not valid JSON: {e}") from None
  base = _typed(cfg)
  argv = ["axtrain eval", *config_args]
  try:  # kind switches (e.g. --config.data.kind=synthetic), then every path checked
    config_loading.prepare(base, config_loading.overrides(argv))
  except ConfigError as e:
    raise UserError(f"eval: {e}") from None
  fv = flags.FlagValues()
  config_flags.DEFINE_config_dict("config", base, flag_values=fv, lock_config=True, sys_argv=argv)
  config_loading.check_values(fv, argv)
  try:
    fv(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    raise UserError(f"eval: {config_loading.translate(e, argv)}") from None
  return fv["config"].value


def _restore_params(exp, run_dir: pathlib.Path, step: int | None):
  """(step, parameters) of a committed checkpoint: `step`, or the newest that reads (a newer
  one that does not is named in a warning)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel

  from trainer import checkpoint, checkpoint_files  # pylint: disable=import-outside-toplevel
  directory = run_dir / "checkpoints"
  steps = checkpoint_files.committed_steps(directory)
  if not steps:
    raise UserError(f"eval: {directory} holds no committed checkpoint; nothing to evaluate")
  if step is not None and step not in steps:
    raise UserError(f"eval: --step={step} is not a committed checkpoint in {directory} "
                    f"(committed: {', '.join(map(str, steps))})")
  step = checkpoint_files.readable_step(directory, step, warn=warn)
  abstract = nn.meta.unbox(exp.abstract_state.params)  # outside context(): no constraints
  try:
    with exp.context():
      params = checkpoint.load_params(run_dir, abstract, exp.state_shardings.params, step=step)
  except checkpoint.CheckpointError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (any read failure: unusable)
    reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    raise checkpoint.CheckpointError(f"checkpoint {directory / str(step)} is unreadable "
                                     f"({reason})") from None
  return step, params


def main(argv: list[str]) -> int:
  args, config_args = parse_args(argv)
  run_dir = args["run_dir"]
  if (why := disk.not_a(run_dir, "directory")):
    raise UserError(f"eval: --run_dir={run_dir} {why}")
  cfg = load_config(run_dir, config_args)
  if not (run_dir / "checkpoints").is_dir():  # before anything compiles
    raise UserError(f"eval: {run_dir} holds no checkpoints/ directory; nothing to evaluate")

  import jax  # pylint: disable=import-outside-toplevel

  # pylint: disable-next=import-outside-toplevel
  from trainer import checkpoint, config as config_lib, experiment, loop, meshes
  from planner import step_memory
  exp = experiment.build(config_lib.parse(cfg), meshes.select("auto"))
  process = dict(process_index=jax.process_index(), process_count=jax.process_count())
  batches = exp.source.eval_batches(batch_size=exp.run.eval.batch_size,
                                    num_batches=exp.run.eval.num_batches, **process)
  try:  # the eval step's one compile: refused before a checkpoint is read
    step_memory.check_eval(exp, batches[0])
  except ConfigError as e:
    raise UserError(f"eval: {e}") from None
  try:
    step, params = _restore_params(exp, run_dir, args["step"])
  except checkpoint.CheckpointError as e:
    print(f"axtrain: error: {e}", file=sys.stderr)
    return EXIT_FAILED
  started = time.perf_counter()
  result = loop.evaluate(exp, params, batches)
  record = {"step": step, **result, "eval_time_s": time.perf_counter() - started,
            "source": SOURCE}
  if config_args:
    record["overrides"] = " ".join(config_args)
  if jax.process_index() == 0:
    from trainer.run_files import Manifest, no_record  # pylint: disable=import-outside-toplevel
    from trainer.writers import JsonlWriter  # pylint: disable=import-outside-toplevel
    manifest = Manifest(run_dir)  # a run older than manifests: its layout shows metrics.jsonl
    writer = JsonlWriter(run_dir / "metrics.jsonl",  # one line, one write: safe beside training
                         record=manifest.record if manifest.files() is not None else no_record,
                         warn=warn)
    writer.on_record(record)
    writer.on_train_end(None)
  print(result_line(step, result, run_dir / "metrics.jsonl"))
  return 0


def result_line(step: int, result: dict, metrics: pathlib.Path) -> str:
  """What eval prints of `result` (eval_loss, eval_perplexity, eval_tokens), appended to
  `metrics`; docs/runs.md shows it for a run of the README's sweep (tests/test_runs.py)."""
  return (f"step {step}: eval_loss {result['eval_loss']:.6f} (perplexity "
          f"{result['eval_perplexity']:.3f}, {result['eval_tokens']:,} tokens); appended to "
          f"{metrics}")
