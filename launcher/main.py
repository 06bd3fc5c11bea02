"""axtrain: train a JAX model described by a Python config file.

usage:
  axtrain --config=FILE[:key=value,...] [--config.a.b=VALUE ...] [options]
  axtrain convert --from_hf=HF_DIR --output_dir=RUN_DIR
  axtrain convert --to_hf=RUN_DIR --output_dir=HF_DIR
  axtrain tokenize --input=GLOB --kind=jsonl --output_dir=DIR [--tokenizer=...] (docs/data.md)
  axtrain plan --config=FILE --mesh=NAME [--json] [--sweep]  (fits? how fast? docs/plan.md)
  axtrain generate --run_dir=DIR --prompt=TEXT [--max_new_tokens=N --temperature=T ...] (docs/generate.md)
  axtrain runs PATH... [--json] [--plot=FILE.png]   (a table of runs; docs/runs.md)
  axtrain eval --run_dir=DIR [--step=N] [--config.eval.*=...] [--config.data.*=...]
  axtrain launch --backend=local|slurm|k8s|tpu-vm [launch flags] -- ARGS   (docs/launch.md)
  axtrain --version

examples:
  axtrain --config=configs/tiny.py
  axtrain --config=configs/tiny.py --config.trainer.max_steps=200 --config.optimizer.learning_rate=1e-3
  axtrain --config=configs/llm_1b.py --print_config
  for lr in 1e-3 3e-4; do axtrain --config=configs/tiny.py --config.optimizer.learning_rate=$lr; done

Each run writes its own directory (or --output_dir): runs/<config>/base/ without
overrides, runs/<config>/<key=value,...>/ with the overrides that change a value
(sorted by key, values as Python writes them: 2e-3 and 0.002 are one run):
config.json, run.json, metrics.jsonl, checkpoints/, manifest.json (the files axtrain
wrote there). Re-running a completed run does nothing; raising
--config.trainer.max_steps extends it from its last checkpoint; any other change
in an existing run directory is refused unless --overwrite, which deletes only
the files axtrain wrote (it refuses, naming any other file; `axtrain convert`'s
files are kept). A run shorter than its warm-up shrinks the warm-up (a note says so).
Mistakes print one line `axtrain: error: ...` and exit with code 2.

Re-running the command of an unfinished run resumes it from its last committed
checkpoint (docs/fault_tolerance.md). Exit codes: 0 done, 1 failed (non-finite
loss, no usable checkpoint), 2 usage error or run directory in use, 74 no space
left on a disk it writes to (training or any command that writes; one line names
the file, what it needed and what is free; free space, then retry the same command), 75 preempted by SIGTERM/SIGINT with a
checkpoint saved, or SIGTERM before training: retry the same command; 130 Ctrl-C
(SIGINT) before training began, nothing written.
"""

from __future__ import annotations

import importlib
import os
import sys

from absl import flags

from launcher import config_loading, distributed, platforms, preemption
from launcher.errors import EXIT_NO_SPACE, EXIT_USAGE, ConfigError, UserError, suggest
from trainer import disk


def _define_flags(argv: list[str]) -> flags.FlagValues:
  fv = flags.FlagValues()
  config_loading.define(fv, argv)
  flags.DEFINE_string("output_dir", None, "Run directory; default runs/<config stem>/base or "
                      "runs/<config stem>/<sorted overrides>.",
                      flag_values=fv)
  flags.DEFINE_boolean("overwrite", False, "Start the run over: delete the files axtrain wrote "
                       "in the run directory (refused, naming them, if it holds any other).",
                       flag_values=fv)
  flags.DEFINE_boolean("rewrite_config", False, "The run directory's config.json is missing or "
                       "damaged: write it again from this command's config, once the newest "
                       "checkpoint's parameters fit its model, and resume the checkpoints.",
                       flag_values=fv)
  flags.DEFINE_boolean("print_config", False, "Print the resolved config as sorted `a.b.c: value`"
                       " lines and the parameter count, then exit.", flag_values=fv)
  flags.DEFINE_string("mesh", "auto", "Device mesh from the registry (docs/meshes.md), or `auto` "
                      "to pick one from the devices JAX sees.", flag_values=fv)
  flags.DEFINE_boolean("progress", True, "Show a progress line on stderr.", flag_values=fv)
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0 for multi-process "
                      "runs (jax.distributed); Slurm is detected without it.", flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.", flag_values=fv)
  flags.DEFINE_integer("process_id", None, "This process's index in a multi-process run.",
                       flag_values=fv)
  flags.DEFINE_enum("distributed", "auto", distributed.MODES, "How a multi-process run starts: "
                    "`auto` from --coordinator_address, --num_processes and --process_id, "
                    "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID or a Slurm job step; `tpu` from the Cloud TPU environment "
                    "(every worker of a multi-host slice).", flag_values=fv)
  flags.DEFINE_integer("distributed_timeout", distributed.DEFAULT_TIMEOUT_S, "Seconds a "
                       "multi-process run waits for all its processes to join before it gives "
                       "up with one line naming the coordinator address.", flag_values=fv)
  flags.DEFINE_boolean("version", False, "Print the versions of axtrain, jax and jaxlib, then "
                       "exit.", flag_values=fv)
  config_loading.register_flag_names(fv)
  return fv


def options_text(fv: flags.FlagValues) -> str:
  """`options:` and one line per flag of `fv`, with its default."""
  lines = ["options:"]
  for name in sorted(fv):
    flag = fv[name]
    default = "" if flag.default in (None, "") else f" (default: {flag.default})"
    lines.append(f"  --{name}: {flag.help}{default}")
  return "\n".join(lines) + "\n"


def version_text() -> str:
  """`axtrain 0.1.0 (jax 0.10.2, jaxlib 0.10.2, python 3.11.7)`: what --version prints."""
  from launcher.run_dir import versions  # pylint: disable=import-outside-toplevel
  found = versions()
  others = ", ".join(f"{k} {found[k]}" for k in ("jax", "jaxlib", "python") if k in found)
  return f"axtrain {found.get('axtrain', 'unknown')} ({others})\n"


def help_text(fv: flags.FlagValues) -> str:
  return __doc__.strip() + "\n\n" + options_text(fv)


# `axtrain COMMAND ...` -> the launcher module whose main(argv) runs it (imported on use).
COMMANDS = {"convert": "convert", "tokenize": "tokenize", "plan": "plan", "generate": "generate",
            "runs": "runs", "eval": "eval_run", "launch": "launch.command"}
# Commands that run on this machine's devices: like training, they take the CPU backend
# outright on a machine without accelerators (launcher/platforms.py). `plan` compiles for
# other machines' devices and must keep libtpu's TPU topologies reachable.
ON_LOCAL_DEVICES = frozenset({"convert", "generate", "eval"})


def run(argv: list[str] | None = None, *, callbacks=()) -> None:
  """Console-script entry point: `main` with the process's SIGINT/SIGTERM handling installed
  (launcher/preemption.py:Interruptions: a signal before training stops it in one line), then
  exit with its code. tests/launch_with_hooks.py passes `argv` and loop `callbacks`."""
  argv = sys.argv if argv is None else argv
  training = len(argv) < 2 or argv[1] not in COMMANDS
  interruptions = preemption.Interruptions(what=(
      " before training began; nothing is half-written: the same command starts or resumes "
      "the run" if training else "")).install()
  code = main(argv, callbacks=callbacks)
  interruptions.finishing()
  if code == preemption.EXIT_PREEMPTED:
    # The checkpoint is committed and the run's files written: leave at once, without the
    # interpreter's teardown, which the scheduler may cut short (a task of a Slurm step still
    # there when a peer has exited 75 is killed, and the step counts as failed, not preempted);
    # the processes of a multi-process run first leave jax.distributed together.
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
    distributed.leave_together(code)
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def main(argv: list[str], *, callbacks=()) -> int:
  """`callbacks`: trainer.callbacks.Callback objects for the training loop (tests inject them)."""
  try:
    command = argv[1] if len(argv) > 1 else None
    if command in COMMANDS:
      if command in ON_LOCAL_DEVICES:
        platforms.cpu_when_no_accelerator()
        platforms.check_backend()
      module = importlib.import_module(f"launcher.{COMMANDS[command]}")
      if command == "launch":  # it checks the training arguments with this file's parser
        return module.main(argv[:1] + argv[2:], parse_train=parse_flags)
      return module.main(argv[:1] + argv[2:])
    return train_main(argv, callbacks=callbacks)
  except ConfigError as e:
    message = " ".join(str(e).split())
    print(f"axtrain: error: {message}", file=sys.stderr)
    return EXIT_USAGE
  except Exception as e:  # pylint: disable=broad-except  (re-raised unless a disk was full)
    full = disk.as_no_space(e)
    if full is None:
      raise
    if full.path is None and _written(argv) is not None:  # a library's error that names no file
      full = disk.NoSpace(_written(argv), needed=full.needed, quota=full.quota)
    print(f"axtrain: error: {full}; free space there, then run the same command again",
          file=sys.stderr)
    return EXIT_NO_SPACE


def _written(argv: list[str]) -> str | None:
  """What a command writes, by its flags (--output_dir, --plot, --run_dir): where a full disk
  that an error does not locate is."""
  for name in ("output_dir", "plot", "run_dir"):
    for arg in argv[1:]:
      if arg.startswith(f"--{name}=") and arg.split("=", 1)[1]:
        return os.path.expanduser(arg.split("=", 1)[1])
  return None


def _command_hint(argv: list[str]) -> str:
  """A did-you-mean for a mistyped command word (the first argument); training has none."""
  if len(argv) < 2 or argv[1].startswith("-"):
    return ""
  if argv[1] == "train" or suggest(argv[1], ["train"]):
    return " (training takes no command word: axtrain --config=FILE ...)"
  return suggest(argv[1], COMMANDS)


def parse_flags(argv: list[str]) -> flags.FlagValues:
  fv = _define_flags(argv)
  if any(a in ("-h", "--help", "-help", "--helpfull") for a in argv[1:]):
    sys.stdout.write(help_text(fv))
    raise SystemExit(0)
  if "--version" in argv[1:]:
    sys.stdout.write(version_text())
    raise SystemExit(0)
  positional = [a for a in argv[1:] if not a.startswith("-")]
  if positional:
    raise UserError(f"unexpected argument '{positional[0]}'{_command_hint(argv)}; flags look like"
                    f" --name=value, commands: {', '.join(COMMANDS)}")
  config_loading.check_values(fv, argv)
  config_loading.check_file(config_loading.config_file_arg(argv), argv=argv[1:])
  try:
    fv(argv)
  except ConfigError:
    raise
  except (flags.Error, AttributeError, KeyError, SyntaxError, TypeError, ValueError) as e:
    raise config_loading.translate(e, argv) from None
  config_loading.check_values(fv, argv)  # --config.* overrides, now that they are known
  return fv


def train_main(argv: list[str], *, callbacks=()) -> int:
  fv = parse_flags(argv)
  platforms.cpu_when_no_accelerator()
  from launcher import session  # pylint: disable=import-outside-toplevel  (imports jax)
  return session.run(fv, argv, callbacks=callbacks)


__all__ = ["main", "run"]
