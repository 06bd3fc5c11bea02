"""Console progress: one line updated in place on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _rate(x: float) -> str:
  for unit, scale in (("M", 1e6), ("k", 1e3)):
    if x >= scale:
      return f"{x / scale:.1f}{unit}"
  return f"{x:.0f}"


def header(*, mesh_shape: dict, devices: list, num_params: int, state_bytes: int,
           run_dir=None, state_memory: str = "device") -> list[str]:
  """The first lines of a run: where it runs, how big it is, where its state lives, where to
  look."""
  kinds = sorted({f"{d.platform} {d.device_kind}" for d in devices})
  where = (" in host memory between updates (trainer.state_memory=host: docs/offload.md)"
           if state_memory == "host" else "")
  lines = [f"mesh {mesh_shape} over {len(devices)} device(s) ({', '.join(kinds)}); "
           f"{num_params:,} parameters; train state {state_bytes / 2**20:,.1f} MiB per device"
           + where]
  if run_dir is not None:
    lines.append(f"run directory {run_dir}; view with: tensorboard --logdir {run_dir}")
  return lines


class Progress:
  def __init__(self, max_steps: int, stream=None, enabled: bool = True):
    self.max_steps = max_steps
    self.stream = stream or sys.stderr
    self.enabled = enabled
    self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
    self._open_line = False

  def step(self, record: dict) -> None:
    if not self.enabled:
      return
    eta = (self.max_steps - record["step"]) * record.get("step_time_s", 0.0)
    line = (f"step {record['step']}/{self.max_steps} | loss {record['loss']:.4f} | "
            f"{_rate(record.get('tokens_per_sec', 0.0))} tok/s | ETA {_duration(eta)}")
    if self.tty:
      self.stream.write("\r\033[K" + line)
      self._open_line = True
    else:
      self.stream.write(line + "\n")
    self.stream.flush()

  def message(self, text: str) -> None:
    if not self.enabled:
      return
    if self._open_line:
      self.stream.write("\n")
      self._open_line = False
    self.stream.write(text + "\n")
    self.stream.flush()

  def close(self) -> None:
    self.message("") if self._open_line else None


class Timer:
  """Wall time between host syncs."""

  def __init__(self):
    self.t = time.perf_counter()

  def lap(self) -> float:
    now = time.perf_counter()
    dt, self.t = now - self.t, now
    return dt
