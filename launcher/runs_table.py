"""`axtrain runs`' table: a run per row, the differing config keys and the run's figures as
columns, fitted to a terminal's width. launcher/runs.py reads the runs (its `Run`: the `runs`
here) and chooses the keys."""

from __future__ import annotations

import json


def show_value(value) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:g}"
  if isinstance(value, (list, dict)):
    return json.dumps(value, separators=(",", ":"))
  return str(value)


def _duration(seconds: float | None) -> str:
  if seconds is None:
    return ""
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _num(value: float | None, fmt: str) -> str:
  return "" if value is None else format(value, fmt)


def short_names(keys: list[str]) -> dict[str, str]:
  """Each key's shortest end (whole dotted parts) that no other of `keys` ends with."""
  out = {}
  for key in keys:
    parts = key.split(".")
    for n in range(1, len(parts) + 1):
      end = ".".join(parts[-n:])
      if not any(k != key and (k == end or k.endswith("." + end)) for k in keys):
        break
    out[key] = end
  return out


_CELL_CHARS = 24  # a config value or run name cut to fit a narrow table ...
_NAME_CHARS = 12  # ... and a run name at the narrowest


# The columns after the config keys: heading -> the cell of a run.
STATS = {
    "status": lambda r: r.status,
    "steps": lambda r: f"{'?' if r.steps is None else r.steps}/{show_value(r.max_steps)}",
    "loss": lambda r: _num(r.final_loss, ".4f"),
    "best eval": lambda r: _num(r.best_eval_loss, ".4f"),
    "final eval": lambda r: _num(r.final_eval_loss, ".4f"),
    "tokens/s": lambda r: _num(r.median("tokens_per_sec"), ",.0f"),
    "MFU": lambda r: _num(r.median("mfu"), ".2%"),
    "wall": lambda r: _duration(r.wall_time_s),
}


# What a narrow table leaves out first, in this order, before any config column; and the
# headings it shortens to their figures' width.
SPARE = ("wall", "MFU", "tokens/s", "best eval")
_NARROW = {"final eval": "final"}


def cut_text(text: str, limit: int | None) -> str:
  return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def fitted(runs: list, keys: list[str], width: int | None) -> tuple[str, list[str]]:
  """(the table within `width` characters a line, the columns left out of it). None: any
  width. Too wide: the config columns take the shortest unique ends of their keys, config
  values are cut to _CELL_CHARS and run names to what is left (_NAME_CHARS at least); then the
  SPARE columns are left out, then config columns (the `.kind` ones last, else from the last),
  until it fits (or none is left)."""
  text = table(runs, keys)
  if width is None or _widest(text) <= width:
    return text, []
  names = {**short_names(keys), **_NARROW}
  tries = [(keys, [s for s in STATS if s not in SPARE[:n]]) for n in range(len(SPARE) + 1)]
  kept = sorted(keys, key=lambda k: (not (k == "kind" or k.endswith(".kind")), keys.index(k)))
  tries += [([k for k in keys if k in kept[:n]], [s for s in STATS if s not in SPARE])
            for n in range(len(keys) - 1, -1, -1)]
  for shown, stats in tries:
    text = table(runs, shown, stats=stats, names=names, cut=_CELL_CHARS)
    excess = _widest(text) - width
    name_width = max(len(cut_text(r.name, _CELL_CHARS)) for r in runs)
    if 0 < excess <= name_width - _NAME_CHARS:
      text = table(runs, shown, stats=stats, names=names, cut=_CELL_CHARS,
                   name_cut=name_width - excess)
    if _widest(text) <= width:
      break
  return text, [s for s in STATS if s not in stats] + [k for k in keys if k not in shown]


def _widest(text: str) -> int:
  return max(map(len, text.splitlines()), default=0)


def table(runs: list, keys: list[str], *, stats=tuple(STATS),
          names: dict[str, str] | None = None, cut: int | None = None,
          name_cut: int | None = None) -> str:
  """The runs as a table: their names, the config `keys`, the `stats` columns; `names`:
  headings other than the keys and column names; `cut`: the most characters of a config value
  (and of a run's name, unless `name_cut`)."""
  names = names or {}
  header = ["run", *(names.get(k, k) for k in keys), *(names.get(c, c) for c in stats)]
  rows = [header]
  for r in runs:
    rows.append([cut_text(r.name, name_cut or cut),
                 *(cut_text(show_value(r.config.get(k)), cut) for k in keys),
                 *(STATS[c](r) for c in stats)])
  widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
  status = len(keys) + 1 if "status" in stats else None
  numeric = set(range(len(keys) + 1, len(header))) - {status}  # the figures: right-aligned
  return "".join("  ".join(cell.rjust(w) if i in numeric else cell.ljust(w)
                           for i, (cell, w) in enumerate(zip(row, widths))).rstrip() + "\n"
                 for row in rows)
