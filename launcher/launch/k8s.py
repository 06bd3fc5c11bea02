"""`axtrain launch --backend=k8s`: an Indexed Job with one pod per host, and a headless Service.

Pod i runs process i (JOB_COMPLETION_INDEX). GPU pods get JAX_COORDINATOR_ADDRESS (pod 0's DNS
name through the headless Service), JAX_NUM_PROCESSES and JAX_PROCESS_ID, which axtrain reads
(launcher/distributed.py); TPU pods get `--distributed=tpu`, and JAX reads the slice from the
variables GKE gives TPU pods of an Indexed Job (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES).

Restarts: `restartPolicy: Never` with a pod failure policy. A pod that exits 75 (preempted, a
checkpoint saved) or is disrupted (node drained, lost or preempted: the DisruptionTarget
condition) is replaced without counting against `backoffLimit`; any other failure counts, up
to --max_restarts per pod (`backoffLimit` = max_restarts x pods). A replaced pod resumes the
run from its last checkpoint, and a pod whose peer died fails in turn (its collectives end with
an error, or JAX's heartbeat gives up), so the pods start over together.

The run directory must be on storage that every pod mounts at the same path (--volume).
"""

from __future__ import annotations

import dataclasses
import pathlib
import posixpath
import re
import shlex
import shutil
import subprocess

from absl import flags

from launcher.errors import UserError
from launcher.launch.job import Backend, Job, header
from launcher.preemption import EXIT_PREEMPTED

DEFAULT_PORT = 8476  # the coordinator's port on pod 0
# GKE's node label values for TPU slices, by mesh family (cloud.google.com/gke-tpu-accelerator).
GKE_TPU_ACCELERATORS = {"tpu-v4": "tpu-v4-podslice", "tpu-v5e": "tpu-v5-lite-podslice",
                        "tpu-v5p": "tpu-v5p-slice", "tpu-v6e": "tpu-v6e-slice"}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*"
                        r"[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _define(fv: flags.FlagValues) -> None:
  flags.DEFINE_string("image", None, "Container image holding axtrain (k8s, required).",
                      flag_values=fv)
  flags.DEFINE_string("namespace", "default", "Kubernetes namespace.", flag_values=fv)
  flags.DEFINE_multi_string("node_selector", [], "A node label KEY=VALUE the pods need "
                            "(repeat for several; TPU entries add GKE's TPU labels).",
                            flag_values=fv)
  flags.DEFINE_multi_string("volume", [], "CLAIM:MOUNT_PATH: a PersistentVolumeClaim every pod "
                            "mounts (repeat for several); the run directory must be under one.",
                            flag_values=fv)
  flags.DEFINE_integer("coordinator_port", DEFAULT_PORT, "k8s: the coordinator's port on pod 0.",
                       flag_values=fv)


FLAG_NAMES = ("image", "namespace", "node_selector", "volume", "coordinator_port")


def _selectors(values: list[str]) -> dict[str, str]:
  out = {}
  for item in values:
    key, sep, value = item.partition("=")
    if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value) or len(value) > 63:
      raise UserError(f"--node_selector={item}: expected a node label KEY=VALUE, e.g. "
                      f"cloud.google.com/gke-nodepool=train")
    out[key] = value
  return out


def _volumes(values: list[str]) -> list[tuple[str, str]]:
  out = []
  for item in values:
    claim, sep, path = item.partition(":")
    if not sep or not _NAME.match(claim) or not path.startswith("/"):
      raise UserError(f"--volume={item}: expected CLAIM:MOUNT_PATH, a PersistentVolumeClaim "
                      f"name and an absolute path, e.g. runs-pvc:/runs")
    out.append((claim, path))
  return out


def _check(job: Job, fv: flags.FlagValues) -> None:
  layout = job.layout
  if not fv.image:
    raise UserError("--backend=k8s needs --image=IMAGE, a container image holding axtrain "
                    "(e.g. built from this checkout)")
  if not _NAME.match(fv.namespace) or len(fv.namespace) > 63:
    raise UserError(f"--namespace={fv.namespace}: not a Kubernetes namespace name")
  if not _NAME.match(job.name) or len(job.name) > 50:
    raise UserError(f"--job_name={job.name}: Kubernetes needs lowercase letters, digits and "
                    f"'-', at most 50 characters (pod names add '-<index>')")
  if not 1 <= fv.coordinator_port <= 65535:
    raise UserError(f"--coordinator_port={fv.coordinator_port}: expected 1 to 65535")
  if layout.platform not in ("gpu", "tpu"):
    raise UserError(f"--backend=k8s launches GPU and TPU entries; --mesh={layout.mesh} is "
                    f"{layout.platform}")
  if layout.processes_per_host != 1:
    raise UserError("--backend=k8s runs one pod (one process) per host; drop "
                    "--process_per=device")
  if layout.num_slices > 1:
    raise UserError(f"--mesh={layout.mesh} is {layout.num_slices} TPU slices; on Kubernetes that "
                    f"takes a JobSet per slice, which axtrain does not write: launch it with "
                    f"--backend=tpu-vm, or one slice")
  if layout.platform == "tpu" and _family(layout.mesh) not in GKE_TPU_ACCELERATORS:
    raise UserError(f"--mesh={layout.mesh}: no GKE TPU node label known for it")
  _selectors(fv.node_selector)
  _check_shared(job, _volumes(fv.volume))


def _check_shared(job: Job, volumes: list[tuple[str, str]]) -> None:
  """Refuses a run directory that is not under a --volume mount: it would be on each pod's own
  disk, a copy per pod (several hosts cannot share a checkpoint) that goes with the pod."""
  run_dir = pathlib.PurePosixPath(job.run_dir)
  if not run_dir.is_absolute() and job.workdir:
    run_dir = pathlib.PurePosixPath(job.workdir) / run_dir
  mounts = [pathlib.PurePosixPath(path) for _, path in volumes]
  if run_dir.is_absolute():
    run_dir = pathlib.PurePosixPath(posixpath.normpath(run_dir))
    if any(run_dir.is_relative_to(mount) for mount in mounts):
      return
  where = (f"not under a --volume mount ({', '.join(map(str, mounts))})" if mounts else
           "on no --volume")
  raise UserError(f"--backend=k8s: the run directory {job.run_dir} is {where}, so it would be on "
                  f"each pod's own disk and go with the pod; mount shared storage and give the "
                  f"run directory under it, e.g. --volume=runs:/runs with --output_dir=/runs/NAME")


def _family(mesh: str) -> str:
  return mesh.rsplit("-", 1)[0]


def _labels(job: Job) -> dict:
  """The objects' labels: a fresh dict each call, since YAML writes a shared one as an anchor."""
  return {"app.kubernetes.io/name": "axtrain", "axtrain/job": job.name}


def _service(job: Job, fv: flags.FlagValues) -> dict:
  """The headless Service that gives pod i the DNS name <name>-i.<name>.<namespace>.svc."""
  return {
      "apiVersion": "v1", "kind": "Service",
      "metadata": {"name": job.name, "namespace": fv.namespace, "labels": _labels(job)},
      "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
               "selector": {"axtrain/job": job.name},
               "ports": [{"name": "coordinator", "port": fv.coordinator_port}]},
  }


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Devices:
  """What a pod of the entry's platform asks for and is given to join the others."""
  resources: dict  # the device resource per pod
  selectors: dict  # node labels the platform needs (GKE's TPU labels)
  env: list  # JAX_* variables (GPU pods of several processes)
  args: tuple[str, ...]  # extra axtrain flags (TPU pods of several hosts)


def _devices(job: Job, fv: flags.FlagValues) -> _Devices:
  layout, n = job.layout, job.layout.num_processes
  if layout.platform == "gpu":
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    env = [{"name": "JAX_COORDINATOR_ADDRESS",
            "value": f"{job.name}-0.{job.name}.{fv.namespace}.svc:{fv.coordinator_port}"},
           {"name": "JAX_NUM_PROCESSES", "value": str(n)},
           {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": index}}}]
    return _Devices(resources={"nvidia.com/gpu": layout.devices_per_process}, selectors={},
                    env=env if n > 1 else [], args=())
  selectors = {"cloud.google.com/gke-tpu-accelerator": GKE_TPU_ACCELERATORS[_family(layout.mesh)],
               "cloud.google.com/gke-tpu-topology": layout.topology.split(":", 1)[1]}
  return _Devices(resources={"google.com/tpu": layout.devices_per_process},
                  selectors=selectors, env=[], args=("--distributed=tpu",) if n > 1 else ())


def _container(job: Job, fv: flags.FlagValues, devices: _Devices,
               volumes: list[tuple[str, str]]) -> dict:
  tpu = job.layout.platform == "tpu"  # TPU workers also talk on the tpu-runtime port
  return {
      "name": "axtrain",
      "image": fv.image,
      "command": job.argv(*devices.args),
      **({"workingDir": job.workdir} if job.workdir else {}),
      **({"env": devices.env} if devices.env else {}),
      "ports": [{"name": "coordinator", "containerPort": fv.coordinator_port},
                *([{"name": "tpu-runtime", "containerPort": 8471}] if tpu else [])],
      "resources": {"limits": devices.resources, "requests": dict(devices.resources)},
      **({"volumeMounts": [{"name": f"volume-{i}", "mountPath": path}
                           for i, (_, path) in enumerate(volumes)]} if volumes else {}),
  }


def _pod(job: Job, fv: flags.FlagValues) -> dict:
  """The pod template: one axtrain container, its devices, node selectors and volumes."""
  devices, volumes = _devices(job, fv), _volumes(fv.volume)
  selectors = {**devices.selectors, **_selectors(fv.node_selector)}
  return {
      "metadata": {"labels": _labels(job)},
      "spec": {
          "subdomain": job.name,  # pod i is <name>-i.<name>.<namespace>.svc
          "restartPolicy": "Never",
          # SIGTERM (eviction, drain) lets the processes agree on a step and checkpoint it.
          "terminationGracePeriodSeconds": 300,
          **({"nodeSelector": selectors} if selectors else {}),
          "containers": [_container(job, fv, devices, volumes)],
          **({"volumes": [{"name": f"volume-{i}", "persistentVolumeClaim": {"claimName": claim}}
                          for i, (claim, _) in enumerate(volumes)]} if volumes else {}),
      },
  }


def manifest(job: Job, fv: flags.FlagValues) -> list[dict]:
  """The Service and the Job, as Kubernetes objects (dicts)."""
  n = job.layout.num_processes
  job_object = {
      "apiVersion": "batch/v1", "kind": "Job",
      "metadata": {"name": job.name, "namespace": fv.namespace, "labels": _labels(job)},
      "spec": {
          "completionMode": "Indexed",
          "completions": n,
          "parallelism": n,
          "backoffLimit": fv.max_restarts * n,
          "podFailurePolicy": {"rules": [
              {"action": "Ignore", "onExitCodes": {"containerName": "axtrain",
                                                   "operator": "In",
                                                   "values": [EXIT_PREEMPTED]}},
              {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
          ]},
          "template": _pod(job, fv),
      },
  }
  return [_service(job, fv), job_object]


def _render(job: Job, fv: flags.FlagValues) -> dict[str, str]:
  import yaml  # pylint: disable=import-outside-toplevel
  body = yaml.safe_dump_all(manifest(job, fv), sort_keys=False, default_flow_style=False,
                            width=100)
  return {"k8s.yaml": header(job, "Kubernetes objects of `axtrain launch --backend=k8s`: "
                                  "kubectl apply -f this file; docs/launch.md.") + body}


def _start(job: Job, fv: flags.FlagValues, files: dict[str, pathlib.Path]) -> int:
  del fv
  done = subprocess.run(["kubectl", "apply", "-f", str(files["k8s.yaml"])], capture_output=True,
                        text=True, timeout=300, check=False)
  if done.returncode != 0:
    reason = " ".join(done.stderr.split()) or f"exit {done.returncode}"
    raise UserError(f"kubectl apply -f {files['k8s.yaml']} failed: {reason[:400]}")
  print(done.stdout.strip())
  print(f"axtrain launch: follow it with `kubectl get pods -l axtrain/job={job.name}` and "
        f"`kubectl logs -f {job.name}-0-<suffix>`", flush=True)
  return 0


def _hint(job: Job, files: dict[str, pathlib.Path]) -> str:
  del job
  have = "" if shutil.which("kubectl") else " (kubectl is not on PATH here)"
  return (f"apply it with: kubectl apply -f {shlex.quote(str(files['k8s.yaml']))}{have}  "
          f"(or add --submit)")


BACKEND = Backend(name="k8s", summary="an Indexed Job + headless Service (pod failure policy "
                  "for exit 75 and lost nodes)", tool="kubectl", flag_names=FLAG_NAMES,
                  define=_define, check=_check, render=_render, start=_start, submit_hint=_hint,
                  runs_here=False, own_workdir=True, axtrain=("axtrain",),
                  port=lambda fv: fv.coordinator_port)
