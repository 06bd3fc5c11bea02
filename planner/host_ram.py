"""Host RAM of a run whose train state lives in host memory (trainer.state_memory=host): what
one host holds in each phase of the run, against its RAM (`axtrain plan`'s host verdict).

    in steps     the process [measured: runtime, imports, compiled programs, data pipeline]
                 + the train step's host bytes, its state included [compiler] (the state
                 alone [exact] where the compiler reports none)
    a save       the process + the state + what it holds of the state at once (a batch of
                 copies, or the blocks of the arrays it streams) [exact] + the save's own
                 buffers beyond those [measured]
    a restore    the process + the state + what it reads at once (a group of arrays, or blocks
                 of their shards) [exact] + the restore's own [measured]
    a first run  in steps + the compiler's freed heap [model: per byte of the train program's
                 code], held until the first save trims it; a run whose programs come from the
                 compilation cache (a second run of the setting, a resume) has none

The measured figures are those of the platform (planner/calibration.py:host_ram_for). Where
none was measured (GPU, Trainium) only the exact parts are counted, and the report says which
are not. The verdict is the largest phase: a setting whose save does not fit the host is
refused, though its steps fit.
"""

from __future__ import annotations

import dataclasses

from planner import calibration, memory_model
from trainer import experiment as experiment_lib
from trainer.meshes import Entry


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostNeed:
  """One host's RAM in each phase of the run (bytes)."""
  platform: str
  devices: int  # devices on one host
  ram: int  # the host's RAM (the mesh entry's fact); 0 where the entry names none
  state: int  # the train state in host memory, on one host [exact]
  step: int  # the train step's host bytes on one host, the state included [compiler]; 0: none
  save_batch: int  # what a save holds of the state in host RAM at once [exact]
  restore_batch: int  # what a restore reads at once [exact]
  code: int = 0  # the train program's generated code, bytes [compiler]
  # Measured on the platform (planner/calibration.py:HostRam), 0 with `source` "" where not:
  process: int = 0  # runtime, imports, compiled programs, data pipeline
  save_over: int = 0  # a save's own bytes beyond its save_batch
  restore_over: int = 0  # a restore's own bytes beyond its restore_batch
  compile_heap: int = 0  # the compiler's freed heap after an uncached compile [model]
  source: str = ""

  @property
  def measured(self) -> bool:
    return bool(self.source)

  @property
  def steps(self) -> int:
    return self.process + max(self.step, self.state)

  @property
  def save(self) -> int:
    return self.process + self.state + self.save_batch + self.save_over

  @property
  def restore(self) -> int:
    return self.process + self.state + self.restore_batch + self.restore_over

  @property
  def first_run(self) -> int:
    return self.steps + self.compile_heap

  def phases(self) -> dict[str, int]:
    return {"in steps": self.steps, "a save": self.save, "a restore": self.restore,
            "a first run's steps": self.first_run}

  @property
  def peak(self) -> str:
    """The phase that needs the most (the first of equals)."""
    phases = self.phases()
    return max(phases, key=phases.get)

  @property
  def needed(self) -> int:
    return max(self.phases().values())

  @property
  def fits(self) -> bool:
    return not self.ram or self.needed <= self.ram


def host_need(exp: experiment_lib.Experiment, entry: Entry, *, devices: int, step_host: int,
              code: int) -> HostNeed:
  """What one host of `entry` needs for `exp` with its state in host memory; `step_host` and
  `code`: the compiled train step's host bytes per device and its generated code."""
  per_host = entry.hardware.devices_per_host
  per_host = min(per_host if per_host > 0 else devices, devices)
  save, restore = memory_model.checkpoint_batches(exp, per_host, entry.hardware.platform)
  need = HostNeed(platform=entry.hardware.platform, devices=per_host,
                  ram=(entry.hardware.host_memory_bytes or 0) * per_host,
                  state=memory_model.state_bytes(exp).total * per_host,
                  step=step_host * per_host, save_batch=save, restore_batch=restore, code=code)
  figures = calibration.host_ram_for(entry.hardware)
  if figures is None:
    return need
  return dataclasses.replace(need, process=int(figures.process),
                             save_over=int(figures.save_over_batch),
                             restore_over=int(figures.restore_over_batch),
                             compile_heap=int(figures.heap_per_code_byte * code),
                             source=figures.source)
