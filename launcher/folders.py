"""What an existing folder is, when `--output_dir` names one that is not a run directory.

A message that refuses a folder says what the folder is and what to do instead: a folder of
runs (a sweep, `runs/`), a folder inside a run (its checkpoints/, tensorboard/), an
`axtrain tokenize` corpus, a Hugging Face model (`axtrain convert --to_hf`), or someone
else's files. None of these messages suggests --overwrite: it deletes only a run's own files.
"""

from __future__ import annotations

import json
import os
import pathlib

from launcher.errors import UserError
from trainer.run_files import axtrain_run_json

TOKENS_META = "tokens.json"  # what `axtrain tokenize` writes (trainer/data/corpus.py:META)
_NOT_RUNS = {"checkpoints", "corrupt_checkpoints", "superseded_checkpoints", "tensorboard",
             "profile", "wandb"}
_DEPTH = 3  # runs/<config>/<overrides> is two levels below runs/


def is_run(path: pathlib.Path) -> bool:
  """A run directory of axtrain: an axtrain run.json beside a config.json."""
  return (path / "config.json").is_file() and axtrain_run_json(path) is not None


def enclosing_run(path: pathlib.Path) -> pathlib.Path | None:
  """The run directory that `path` lies inside (not `path` itself), if any."""
  for parent in pathlib.Path(path).absolute().parents:
    if is_run(parent):
      return parent
  return None


def runs_below(path: pathlib.Path) -> list[pathlib.Path]:
  """Run directories below `path` (not inside other runs), at most _DEPTH levels down."""
  found = []
  root_depth = len(pathlib.Path(path).parts)
  for top, dirs, _ in os.walk(path):
    here = pathlib.Path(top)
    if here != pathlib.Path(path) and is_run(here):
      found.append(here)
      dirs[:] = []
      continue
    keep = len(here.parts) - root_depth < _DEPTH
    dirs[:] = sorted(d for d in dirs if keep and d not in _NOT_RUNS and not d.startswith("."))
  return found


def _names(paths: list, limit: int = 3) -> str:
  return ", ".join(map(str, paths[:limit])) + (" ..." if len(paths) > limit else "")


def hf_model(path: pathlib.Path) -> bool:
  try:
    config = json.loads((path / "config.json").read_text())
  except (OSError, ValueError):
    return False
  return (isinstance(config, dict) and ("architectures" in config or "model_type" in config)
          and any(path.glob("*.safetensors")))


def nested_message(path: pathlib.Path, run: pathlib.Path, *, flag: str = "--output_dir") -> str:
  inside = pathlib.Path(path).absolute().relative_to(run)
  return (f"{flag} {path} is inside the run directory {run} ({inside.parts[0]}/ of that run); "
          f"runs never nest: give {flag}={run} to resume that run, or a folder outside it")


def check_outside_runs(path: pathlib.Path, *, flag: str = "--output_dir") -> None:
  """Refuses an output that is not a run (a converted model, a tokenized corpus) inside a run
  directory: that run would then hold a folder it did not write (a nested run, for
  `convert --from_hf`), so its own command could no longer resume or extend it."""
  run = enclosing_run(path)
  if run is not None:
    raise UserError(f"{flag} {path} is inside the run directory {run}, which would then hold "
                    f"files it did not write (and its command would refuse to resume or extend "
                    f"it); choose a path outside it")


def describe(path: pathlib.Path, foreign: list[str], *, flag: str = "--output_dir") -> str:
  """Why `path` (which holds `foreign`, entries no run writes) cannot be a run directory."""
  path = pathlib.Path(path)
  runs = runs_below(path)
  if runs:
    names = [r.relative_to(path) for r in runs]
    return (f"{path} holds {len(runs)} run{'s' if len(runs) > 1 else ''} ({_names(names)}); "
            f"point {flag} at one of them or at a new folder")
  if (path / TOKENS_META).is_file():
    return (f"{path} is a tokenized corpus (`axtrain tokenize`); train on it with "
            f"--config.data.kind=tokens --config.data.path={path}, and choose another {flag}")
  if hf_model(path):
    return (f"{path} is a Hugging Face model (as `axtrain convert --to_hf` writes); to train "
            f"from it, `axtrain convert --from_hf={path} --output_dir=NEW_RUN`; choose another "
            f"{flag}")
  if is_run(path):
    return (f"{path} is a run directory that also holds files axtrain did not write "
            f"({_names(foreign)}); move them out of it to resume, extend or start over this "
            f"run, or choose another {flag}")
  return (f"{path} holds files that axtrain did not write ({_names(foreign)}); it is not a run "
          f"directory, choose another {flag}")
