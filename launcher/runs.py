"""`axtrain runs PATH...`: one table of the runs under some directories (a sweep side by side).

    axtrain runs runs/tiny                     # every run directory below runs/tiny
    axtrain runs 'runs/tiny/*' --json          # a JSON list instead of the table
    axtrain runs runs/tiny --plot=sweep.png    # train and eval loss against steps, all runs
    axtrain runs runs --columns=learning_rate,seed   # these config columns only

A run directory is one that holds config.json and run.json; each PATH (a
directory or a glob) is searched for them, itself included. Columns: the run's
name, the config keys whose values differ between the runs, status, steps
done / max, final train loss, best and final eval loss, median tokens/s,
median MFU (when the metrics carry `mfu`), wall time. Rows are sorted by final
eval loss; runs without one come last. Records that `axtrain eval` appended
(they carry `source`) are not part of the training curves.

The config columns leave out the fields of a node whose kind differs between the runs (its
`.kind` column says it). On a terminal (or with COLUMNS set) the table fits its width: config
columns are headed by the shortest unique end of their key, long values and run names are cut
with "...", then wall time, MFU, tokens/s and best eval, then config columns are left out
until it fits, said on stderr;
--columns=KEY,... (full keys or their ends) chooses the config columns. --json lists every
differing key.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import io
import json
import math
import os
import pathlib
import shutil
import statistics
import sys

from launcher import folders
from launcher.errors import UserError, suggest, warn
from launcher.flat import flatten
from trainer import disk
from launcher.runs_table import cut_text, fitted, show_value, table  # noqa: F401  (runs_lib.table)

USAGE = "usage: axtrain runs PATH... [--json] [--plot=FILE.png|.svg|.pdf] [--columns=KEY,...]"
_FLAGS = ("json", "plot", "columns")
# Directories of a run that never hold other runs (not searched).
_NOT_RUNS = {"checkpoints", "corrupt_checkpoints", "superseded_checkpoints", "tensorboard",
             "profile"}
PLOT_INSTALL = "pip install 'axtrain[plot]'"


@dataclasses.dataclass
class Run:
  path: pathlib.Path
  config: dict  # flattened config.json
  info: dict  # run.json
  train: list[dict]  # metrics records with a train loss, in file order
  evals: list[dict]  # training's own evaluation records, in file order
  name: str = ""
  records_lost: bool = False  # trained (completed, or checkpoints) but no train record reads

  @property
  def status(self) -> str:
    return str(self.info.get("status", "unknown"))

  @property
  def steps(self) -> int | None:
    """The last step recorded; None where the records are lost (`records_lost`)."""
    if self.records_lost:
      return None
    return max((int(r["step"]) for r in self.train), default=0)

  @property
  def max_steps(self):
    return self.config.get("trainer.max_steps")

  @property
  def final_loss(self) -> float | None:
    return _finite(self.train[-1].get("loss")) if self.train else None

  @property
  def final_eval_loss(self) -> float | None:
    return _finite(self.evals[-1].get("eval_loss")) if self.evals else None

  @property
  def best_eval_loss(self) -> float | None:
    losses = [x for x in (_finite(r.get("eval_loss")) for r in self.evals) if x is not None]
    return min(losses, default=None)

  def median(self, key: str) -> float | None:
    values = [x for x in (_finite(r.get(key)) for r in self.train) if x is not None]
    return statistics.median(values) if values else None

  @property
  def wall_time_s(self) -> float | None:
    """From the first start to the end (or to now, while running)."""
    start = _time(self.info.get("first_start_time") or self.info.get("start_time"))
    end = _time(self.info.get("end_time"))
    if end is None and self.status == "running":
      end = datetime.datetime.now(datetime.timezone.utc)
    return (end - start).total_seconds() if start and end else None


def _finite(value) -> float | None:
  return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _time(text):
  try:
    return datetime.datetime.fromisoformat(text) if text else None
  except (TypeError, ValueError):
    return None


# -- finding and reading runs ---------------------------------------------------------------

def is_run_dir(path: pathlib.Path) -> bool:
  return (path / "config.json").is_file() and (path / "run.json").is_file()


def find(patterns: list[str]) -> list[pathlib.Path]:
  """Run directories at or below each path or glob, in order, without repeats."""
  found: dict[pathlib.Path, None] = {}
  for pattern in patterns:
    matches = sorted(glob.glob(pattern, recursive=True)) or (
        [pattern] if os.path.exists(pattern) else [])
    if not matches:
      raise UserError(f"runs: '{pattern}' matches no file or directory")
    for match in map(pathlib.Path, matches):
      for top, dirs, _ in os.walk(match):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_RUNS and not d.startswith("."))
        if is_run_dir(pathlib.Path(top)):
          found.setdefault(pathlib.Path(top), None)
  if not found:
    raise UserError(f"runs: no run directories (config.json + run.json) under "
                    f"{' '.join(patterns)}")
  return list(found)


def _read_json(path: pathlib.Path) -> dict:
  try:
    value = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    warn(f"{path}: not readable JSON ({' '.join(str(e).split())}); shown as empty")
    return {}
  return value if isinstance(value, dict) else {}


def read_metrics(path: pathlib.Path) -> list[dict]:
  """The records of a metrics.jsonl; a line that is not a JSON object is skipped with a warning."""
  if not path.is_file():
    return []
  records = []
  with open(path, encoding="utf-8", errors="replace") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        warn(f"{path} line {number}: not valid JSON; skipped")
        continue
      if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        warn(f"{path} line {number}: not a metrics record (an object with an integer step); "
              f"skipped")
        continue
      records.append(record)
  return records


def read(path: pathlib.Path) -> Run:
  records = [r for r in read_metrics(path / "metrics.jsonl") if "source" not in r]
  run = Run(path=path, config=flatten(_read_json(path / "config.json")),
            info=_read_json(path / "run.json"),
            train=[r for r in records if "loss" in r],
            evals=[r for r in records if "eval_loss" in r])
  if not run.train and (trained := _trained(run)):
    metrics = path / "metrics.jsonl"
    state = ("is missing" if not metrics.is_file() else "is empty"
             if metrics.stat().st_size == 0 else "holds no train record")
    warn(f"{metrics} {state}, although the run {trained}: its steps, losses and throughput "
          f"are unknown (steps shown as ?)")
    run.records_lost = True
  return run


def _trained(run: Run) -> str | None:
  """What shows that `run` trained steps (so its metrics.jsonl should hold records), or None."""
  if run.status == "completed":
    return "completed"
  saved = [int(p.name) for p in (run.path / "checkpoints").glob("*") if p.name.isdigit()]
  return f"has checkpoints up to step {max(saved)}" if saved and max(saved) > 0 else None


def differing_keys(runs: list[Run]) -> list[str]:
  """Config keys whose values are not the same in every run (sorted)."""
  keys = sorted({k for r in runs for k in r.config})
  missing = object()
  return [k for k in keys
          if len({json.dumps(r.config.get(k, missing), sort_keys=True, default=repr)
                  for r in runs}) > 1]


def _name(runs: list[Run]) -> None:
  """Each run's path relative to the common folder of the runs' parents."""
  parents = [str(r.path.absolute().parent) for r in runs]
  common = pathlib.Path(os.path.commonpath(parents))
  for r in runs:
    r.name = str(r.path.absolute().relative_to(common))


def _sort_key(run: Run):
  loss = run.final_eval_loss
  return (loss is None, loss if loss is not None else 0.0, run.name)


def collect(patterns: list[str]) -> tuple[list[Run], list[str]]:
  """(runs sorted by final eval loss, the config keys that differ between them)."""
  runs = [read(p) for p in find(patterns)]
  _name(runs)
  return sorted(runs, key=_sort_key), differing_keys(runs)


# -- output ---------------------------------------------------------------------------------


def as_dict(run: Run, keys: list[str]) -> dict:
  return {"name": run.name, "path": str(run.path), "config": {k: run.config.get(k) for k in keys},
          "status": run.status, "steps": run.steps, "max_steps": run.max_steps,
          "final_loss": run.final_loss, "best_eval_loss": run.best_eval_loss,
          "final_eval_loss": run.final_eval_loss, "tokens_per_sec": run.median("tokens_per_sec"),
          "mfu": run.median("mfu"), "wall_time_s": run.wall_time_s}


def table_keys(runs: list[Run], keys: list[str]) -> list[str]:
  """The differing `keys` worth a column: not the fields of a node whose kind differs between
  the runs (they come and go with the kind, which its own `.kind` column shows)."""
  switched = [k[:-len("kind")] for k in keys if k.endswith(".kind") or k == "kind"]
  def follows_kind(key):
    return any(key.startswith(p) and key != f"{p}kind" and any(key not in r.config for r in runs)
               for p in switched)
  return [k for k in keys if not follows_kind(k)]


def chosen_columns(runs: list[Run], wanted: list[str]) -> list[str]:
  """The config keys --columns names (whole keys, or an end of one that names one key)."""
  known = sorted({k for r in runs for k in r.config})
  out = []
  for name in wanted:
    matches = [k for k in known if k == name or k.endswith("." + name)]
    exact = [k for k in matches if k == name]
    if exact or len(matches) == 1:
      out.append((exact or matches)[0])
    elif matches:
      raise UserError(f"runs: --columns: '{name}' ends several config keys ({', '.join(matches[:4])}"
                      f"{' ...' if len(matches) > 4 else ''}); give more of the key")
    else:
      ends = sorted({k.rsplit(".", 1)[-1] for k in known})
      raise UserError(f"runs: --columns: '{name}' is no config key of these runs"
                      f"{suggest(name, known) or suggest(name, ends)}")
  return out


def label(run: Run, keys: list[str]) -> str:
  return ", ".join(f"{k}={show_value(run.config.get(k))}" for k in keys) or run.name


def _pyplot():
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise UserError(f"runs: --plot needs matplotlib, which is not installed; {PLOT_INSTALL}") \
        from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


# Runs drawn in colour and named in the legend, best first (the table's order); the others
# are drawn thin and gray under one legend entry, so the legend stays readable for any sweep.
LEGEND_RUNS = 10
_LABEL_CHARS = 60  # a longer label is cut with "..."
_TITLE_CHARS = 70  # a longer title (many PATHs: a shell glob) becomes "axtrain runs: N runs"


def _short(text: str, limit: int) -> str:
  return text if len(text) <= limit else text[:limit - 3] + "..."


def figure(runs: list[Run], keys: list[str], *, title: str = ""):
  """The matplotlib figure of `plot`: train loss (lines) and eval loss (dashed, markers)
  against steps; the first LEGEND_RUNS runs in colour and by name in a legend right of the
  axes (a fixed place: matplotlib's search for a free spot inside is slow and warns about it
  with many points), the rest gray."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(11, 5), dpi=100, layout="constrained")
  for i, run in enumerate(runs):
    shown = i < LEGEND_RUNS
    style = {"color": f"C{i}", "linewidth": 1.5} if shown else {
        "color": "0.6", "linewidth": 0.8, "alpha": 0.7, "zorder": 1}
    ax.plot([r["step"] for r in run.train], [r.get("loss") for r in run.train],
            label=_short(label(run, keys), _LABEL_CHARS) if shown else None, **style)
    if run.evals:
      ax.plot([r["step"] for r in run.evals], [r.get("eval_loss") for r in run.evals],
              linestyle="--", marker="o", markersize=4 if shown else 2, **style)
  if len(runs) > LEGEND_RUNS:
    ax.plot([], [], color="0.6", linewidth=0.8,
            label=f"{len(runs) - LEGEND_RUNS} more runs (gray; `axtrain runs` lists them)")
  ax.plot([], [], color="black", label="train loss (solid)")
  ax.plot([], [], color="black", linestyle="--", marker="o", markersize=4,
          label="eval loss (dashed)")
  ax.set_xlabel("step")
  ax.set_ylabel("loss")
  title = title or "axtrain runs"
  ax.set_title(title if len(title) <= _TITLE_CHARS else f"axtrain runs: {len(runs)} runs")
  ax.grid(alpha=0.3)
  ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
  return fig


def plot(runs: list[Run], keys: list[str], path: pathlib.Path, *, title: str = "") -> None:
  """Writes `figure` to `path`, in the format of its suffix: drawn in memory, then written whole
  (trainer/disk.py): a full disk leaves the file as it was and raises NoSpace."""
  plt = _pyplot()
  fig = figure(runs, keys, title=title)
  drawn = io.BytesIO()
  fig.savefig(drawn, format=PLOT_FORMATS[pathlib.Path(path).suffix.lower()])
  plt.close(fig)
  disk.write_atomic(path, drawn.getvalue())


PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}  # --plot's suffix: the format


def check_plot_path(target: pathlib.Path) -> None:
  """UserError unless --plot names a .png/.svg/.pdf file in an existing directory outside every
  run directory (a run holding a file it did not write can no longer be resumed or extended)."""
  if target.suffix.lower() not in PLOT_FORMATS:
    raise UserError(f"runs: --plot={target}: name a {', '.join(PLOT_FORMATS)} file (the suffix "
                    f"chooses the format)")
  parent = target.absolute().parent
  existing = next(p for p in (parent, *parent.parents) if p.exists())
  if not existing.is_dir():
    raise UserError(f"runs: --plot={target}: {existing} is a file, not a directory")
  if not parent.is_dir():
    raise UserError(f"runs: --plot={target}: directory {target.parent} does not exist")
  if target.is_dir():
    raise UserError(f"runs: --plot={target} is a directory; name a file in it")
  folders.check_outside_runs(target, flag="runs: --plot")


def parse_args(argv: list[str]) -> tuple[list[str], dict]:
  paths, opts = [], {"json": False, "plot": None, "columns": None}
  for arg in argv[1:]:
    if arg in ("-h", "--help"):
      sys.stdout.write(__doc__.strip() + "\n")
      raise SystemExit(0)
    if not arg.startswith("-"):
      paths.append(arg)
      continue
    name, sep, value = arg.lstrip("-").partition("=")
    if name not in _FLAGS:
      raise UserError(f"runs: unknown flag '{arg}'{suggest(name, _FLAGS)}; {USAGE}")
    if name == "json":
      opts["json"] = True
    elif name == "columns":
      opts["columns"] = [c for c in value.split(",") if c]
      if not opts["columns"]:
        raise UserError(f"runs: --columns needs config keys (--columns=learning_rate,seed); {USAGE}")
    elif not value:
      raise UserError(f"runs: --plot needs a file name (--plot=FILE.png); {USAGE}")
    else:
      opts["plot"] = pathlib.Path(os.path.expanduser(value))
  if not paths:
    raise UserError(f"runs: give at least one run directory or glob; {USAGE}")
  return paths, opts


def main(argv: list[str]) -> int:
  paths, opts = parse_args(argv)
  target = opts["plot"]
  if target is not None:
    _pyplot()  # a missing matplotlib is a usage error before any work
    check_plot_path(target)
  runs, keys = collect(paths)
  if opts["json"]:
    sys.stdout.write(json.dumps([as_dict(r, keys) for r in runs], indent=2) + "\n")
  else:
    shown = (table_keys(runs, keys) if opts["columns"] is None
             else chosen_columns(runs, opts["columns"]))
    width = (shutil.get_terminal_size().columns
             if sys.stdout.isatty() or os.environ.get("COLUMNS") else None)
    text, left = fitted(runs, shown, width)
    sys.stdout.write(text)
    if left:
      print(f"axtrain: note: runs: left out to fit {width} characters: "
            f"{cut_text(', '.join(left), 100)}; --columns=KEY,... chooses the config columns, --json "
            f"lists everything", file=sys.stderr)
  if target is not None:
    plot(runs, keys, target, title="axtrain runs " + " ".join(paths))
    print(f"axtrain: wrote {target}", file=sys.stderr)
  return 0
