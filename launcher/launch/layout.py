"""How many hosts and processes a launch starts, and each process's devices, from the mesh entry.

A named entry with a fixed size (docs/meshes.md: `gpu-h100-8x2`, `tpu-v5e-16`) fixes the hosts and
the devices per host: one process per host (`--process_per=host`), or on GPUs one per device
(`--process_per=device`, JAX's usual Slurm layout). A count given on the command line that
disagrees with it is refused. A generic entry (`cpu`, `gpu`, `auto`) has no fixed size: local
and Slurm launches then take `--num_processes` (and Slurm's `--nodes`), Kubernetes and TPU VMs
need a named entry.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from launcher.errors import UserError
from trainer import meshes

ProcessPer = Literal["host", "device"]
PROCESS_PER: tuple[str, ...] = ("host", "device")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
  mesh: str  # the --mesh value of the training arguments (an entry name or `auto`)
  platform: str | None  # cpu / gpu / tpu / neuron; None: `auto` on a cluster (not known here)
  num_hosts: int  # machines (Slurm nodes, pods, TPU VM workers), all slices together
  processes_per_host: int
  devices_per_process: int | None  # None: every device its host shows
  num_slices: int = 1  # TPU slices joined over the data-center network
  topology: str | None = None  # TPU slice shape, e.g. v5e:4x4
  fixed: bool = False  # sized by a named entry (else by flags)

  @property
  def num_processes(self) -> int:
    return self.num_hosts * self.processes_per_host

  @property
  def num_devices(self) -> int | None:
    """Devices of the whole job; None where each process takes all its host shows (not
    known here)."""
    if self.devices_per_process is None:
      return None
    return self.num_processes * self.devices_per_process

  @property
  def hosts_per_slice(self) -> int:
    return self.num_hosts // self.num_slices

  def devices_of(self, local_index: int) -> list[int] | None:
    """The device ids (on its host) that process `local_index` of a host drives; None: all."""
    if self.devices_per_process is None:
      return None
    first = local_index * self.devices_per_process
    return list(range(first, first + self.devices_per_process))

  def describe(self) -> str:
    hosts = f"{self.num_hosts} host{'s' if self.num_hosts != 1 else ''}"
    if self.num_slices > 1:
      hosts += f" in {self.num_slices} slices"
    per = f"{self.processes_per_host} process{'es' if self.processes_per_host != 1 else ''} each"
    devices = ("" if self.devices_per_process is None else
               f", {self.devices_per_process} {self.platform or ''} device"
               f"{'s' if self.devices_per_process != 1 else ''} per process".replace("  ", " "))
    return f"{self.num_processes} processes: {hosts} x {per}{devices} (--mesh={self.mesh})"


def resolve(mesh: str, *, num_processes: int | None, devices_per_process: int | None,
            process_per: str = "host", nodes: int | None = None,
            local_platform: str | None = None, sized_by_flags: bool = True) -> Layout:
  """The layout for `mesh` and the launch flags; UserError (one line) when they disagree.

  `nodes`: Slurm's --nodes (None: one, or the entry's hosts). `local_platform`: the platform of
  this machine (local launches of `--mesh=auto`). `sized_by_flags`: whether a generic entry may
  be sized by --num_processes (local, Slurm) or must be a named one (Kubernetes, TPU VMs).
  """
  if process_per not in PROCESS_PER:
    raise UserError(f"--process_per={process_per}: expected one of {', '.join(PROCESS_PER)}")
  for flag, value in (("num_processes", num_processes), ("devices_per_process",
                                                         devices_per_process), ("nodes", nodes)):
    if value is not None and value < 1:
      raise UserError(f"--{flag}={value}: must be at least 1")
  entry = None if mesh == "auto" else meshes.lookup(mesh)
  if entry is not None and entry.num_devices is not None:
    return _named(entry, num_processes=num_processes, devices_per_process=devices_per_process,
                  process_per=process_per, nodes=nodes)
  platform = entry.hardware.platform if entry is not None else local_platform
  if not sized_by_flags:
    raise UserError(f"--mesh={mesh} has no fixed size; name an entry that has one "
                    f"(docs/meshes.md), e.g. gpu-h100-8x2 or tpu-v5e-16")
  if num_processes is None:
    raise UserError(f"--mesh={mesh} has no fixed size: give --num_processes=N (and "
                    f"--devices_per_process), or name an entry with one (docs/meshes.md), e.g. "
                    f"gpu-h100-8x2")
  if process_per != "host":
    raise UserError(f"--process_per={process_per} needs a named GPU entry (its devices per host),"
                    f" e.g. --mesh=gpu-h100-8x2")
  if platform == "tpu":
    raise UserError("TPU hosts run one process each over all their chips; launch a named TPU "
                    "entry with --backend=tpu-vm or --backend=k8s")
  if devices_per_process is not None and platform not in ("cpu", "gpu"):
    raise UserError(f"--devices_per_process with --mesh={mesh}: name the platform of the hosts, "
                    f"--mesh=cpu or --mesh=gpu")
  hosts = nodes or 1
  if num_processes % hosts:
    raise UserError(f"--num_processes={num_processes} does not split evenly over --nodes={hosts}")
  return Layout(mesh=mesh, platform=platform, num_hosts=hosts,
                processes_per_host=num_processes // hosts,
                devices_per_process=devices_per_process)


def _named(entry: meshes.Entry, *, num_processes, devices_per_process, process_per,
           nodes) -> Layout:
  hw = entry.hardware
  if process_per == "device" and hw.platform != "gpu":
    raise UserError(f"--process_per=device is for GPU entries; {entry.name} runs one process per "
                    f"host")
  per_host = 1 if process_per == "host" else hw.devices_per_host
  layout = Layout(mesh=entry.name, platform=hw.platform, num_hosts=entry.num_hosts,
                  processes_per_host=per_host,
                  devices_per_process=hw.devices_per_host // per_host,
                  num_slices=entry.num_slices, topology=entry.topology, fixed=True)
  shape = (f"{entry.num_hosts} host{'s' if entry.num_hosts != 1 else ''} x {per_host} "
           f"process{'es' if per_host != 1 else ''} (--process_per={process_per}) with "
           f"{layout.devices_per_process} device{'s' if layout.devices_per_process != 1 else ''}"
           f" each")
  if nodes is not None and nodes != entry.num_hosts:
    raise UserError(f"--nodes={nodes} does not match --mesh={entry.name}: {shape}; drop --nodes "
                    f"or choose the entry for {nodes} hosts")
  if num_processes is not None and num_processes != layout.num_processes:
    raise UserError(f"--num_processes={num_processes} does not match --mesh={entry.name}: "
                    f"{shape} = {layout.num_processes}; drop --num_processes or choose another "
                    f"entry (docs/meshes.md)")
  if devices_per_process is not None and devices_per_process != layout.devices_per_process:
    raise UserError(f"--devices_per_process={devices_per_process} does not match "
                    f"--mesh={entry.name}: {shape}")
  return layout
