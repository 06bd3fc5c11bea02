"""`axtrain launch`: what each backend writes, and every mistake refused in one line.

The Kubernetes manifests (a GPU and a TPU entry) and the TPU VM scripts (one slice, two
slices) are golden files in tests/testdata/launch/ (regenerate with UPDATE_GOLDEN=1 and review
the diff); the manifests are also parsed back as YAML and checked for the fields Kubernetes
requires. Real runs: tests/test_distributed.py (local), tests/test_slurm.py (Slurm); job names,
layouts and the local supervisor: tests/test_launch_local.py.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess

import pytest
import yaml

from launcher.launch.job import default_name
from tests.conftest import ROOT, cli, cli_batch

GOLDEN = ROOT / "tests" / "testdata" / "launch"
CONFIG = "--config=configs/llm_1b.py"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
REMOTE = pathlib.Path(f"/axtrain-test-remote-{os.getpid()}")  # a path only the cluster has


def written(tmp_path) -> list[str]:
  return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


# -- mistakes: one line, exit 2, nothing written ---------------------------------------------

def mistakes(out: str) -> list[tuple[list[str], str]]:
  """(launch arguments, a part of the one error line)."""
  run = [CONFIG, f"--output_dir={out}"]
  return _launch_flag_mistakes(run) + _backend_mistakes(run)


def _launch_flag_mistakes(run: list[str]) -> list[tuple[list[str], str]]:
  """Mistakes in launch's own flags, the layout and the training arguments."""
  return [
      (["--backend=slurmm", "--", *run, "--mesh=gpu-h100-8x2"], "did you mean 'slurm'"),
      (["--backend=ssh", "--", *run], "unknown --backend=ssh"),
      (["--backend", "--dry_run", "--", *run], "--backend is given no value (the next argument, "
                                               "--dry_run, is a flag); write --backend=VALUE"),
      (["--", *run], "--backend is required"),
      (["--backend=local", "--num_processes=2"], "axtrain arguments after `--`"),
      (["--backend=slurm", "--num_processes=3", "--", *run, "--mesh=gpu-h100-8x2"],
       "--num_processes=3 does not match --mesh=gpu-h100-8x2: 2 hosts"),
      (["--backend=slurm", "--nodes=4", "--", *run, "--mesh=gpu-h100-8x2"],
       "--nodes=4 does not match"),
      (["--backend=slurm", "--", *run], "--mesh=auto has no fixed size"),
      (["--backend=k8s", "--image=r/a:1", "--", *run, "--mesh=gpu"], "--mesh=gpu has no fixed"),
      (["--backend=tpu-vm", "--tpu_name=t", "--zone=us-west4-a", "--", *run, "--mesh=cpu"],
       "--mesh=cpu has no fixed size"),
      (["--backend=local", "--", *run, "--mesh=cpu"], "give --num_processes=N"),
      (["--backend=local", "--num_processes=2", "--", *run, "--mesh=gpu-h100-8x2"],
       "spans 2 hosts"),
      (["--backend=slurm", "--dry_run", "--submit", "--", *run, "--mesh=gpu-h100-8x2"],
       "choose one"),
      (["--backend=local", "--submit", "--num_processes=2", "--", *run], "--submit is for"),
      (["--backend=slurm", "--image=r/a:1", "--", *run, "--mesh=gpu-h100-8x2"],
       "--image is a --backend=k8s flag"),
      (["--backend=slurm", "--num_procs=2", "--", *run], "unknown flag --num_procs"),
      (["--backend=local", "--num_processes=0", "--", *run, "--mesh=cpu"], "must be at least 1"),
      (["--backend=local", "--num_processes=2", "--", *run, "--process_id=1"],
       "drop --process_id from the axtrain arguments"),
      (["--backend=slurm", "--", *run, "--mesh=gpu-h100-8x2", "--config.trainer.max_stepz=3"],
       "max_stepz"),
      (["--backend=slurm", "--", *run, "--mesh=gpu-h200-8x"], "--mesh=gpu-h200-8x: unknown mesh"),
      (["--backend=slurm", "--", "--config=configs/nope.py", run[1]], "nope.py"),
      (["--backend=slurm", "--job_name=a b", "--", *run, "--mesh=gpu-h100-8"],
       "--job_name=a b: letters, digits"),
      (["--backend=slurm", "--workdir=/elsewhere", "--", CONFIG, "--mesh=gpu-h100-8"],
       "give an absolute --output_dir"),
      (["--backend=local", "--num_processes=2", "--", *run, "--mesh=cpu", "--dry_run"],
       "--dry_run is a launch flag, not an axtrain one: put it before `--`"),
      (["--backend=local", "--dry_run", "--num_processes=2", "--", CONFIG, "--output_dir=",
        "--mesh=cpu"], "--output_dir is empty"),
      (["--backend=local", "--dry_run", "--", *run, "--mesh=gpu-h100-8"],
       "--mesh=gpu-h100-8 is a gpu mesh but this machine runs cpu"),
      (["--backend=slurm", "--record_dir=/tmp", "--", *run, "--mesh=gpu-h100-8"],
       "--record_dir is for k8s and tpu-vm"),
      # A batch the processes' devices cannot split: refused here, as each process would.
      (["--backend=local", "--dry_run", "--num_processes=2", "--devices_per_process=2", "--",
        "--config=configs/tiny.py", run[1], "--mesh=cpu", "--config.data.batch_size=6"],
       "data.batch_size 6 is not divisible by the 4 batch shards"),
      # ... also where the processes pick their entry themselves (--mesh=auto, the default).
      (["--backend=local", "--dry_run", "--num_processes=2", "--devices_per_process=2", "--",
        "--config=configs/tiny.py", run[1], "--config.data.batch_size=6"],
       "data.batch_size 6 is not divisible by the 4 batch shards"),
  ]


def _backend_mistakes(run: list[str]) -> list[tuple[list[str], str]]:
  """Mistakes in one backend's flags, or a layout that backend cannot start."""
  return [
      (["--backend=k8s", "--", *run, "--mesh=gpu-h100-8x2"], "needs --image=IMAGE"),
      (["--backend=k8s", "--image=r/a:1", "--", *run, "--mesh=tpu-v5e-16x2"],
       "takes a JobSet per slice"),
      (["--backend=k8s", "--image=r/a:1", "--node_selector=pool", "--", *run,
        "--mesh=gpu-h100-8"], "--node_selector=pool: expected a node label KEY=VALUE"),
      (["--backend=k8s", "--image=r/a:1", "--volume=runs", "--", *run, "--mesh=gpu-h100-8"],
       "--volume=runs: expected CLAIM:MOUNT_PATH"),
      (["--backend=k8s", "--image=r/a:1", "--job_name=My_Job", "--", *run,
        "--mesh=gpu-h100-8"], "--job_name=My_Job: Kubernetes needs lowercase"),
      (["--backend=k8s", "--image=r/a:1", "--", *run, "--mesh=gpu-h100-8"],
       "is on no --volume, so it would be on each pod's own disk"),
      (["--backend=k8s", "--image=r/a:1", "--volume=runs:/runs", "--", *run, "--mesh=gpu-h100-8"],
       "is not under a --volume mount (/runs)"),
      (["--backend=tpu-vm", "--tpu_name=t", "--zone=us-west4-a", "--", CONFIG,
        "--output_dir=runs/llm_1b/x", "--mesh=tpu-v5e-16"],
       "the run directory runs/llm_1b/x is relative, so each of the 4 workers"),
      (["--backend=tpu-vm", "--zone=us-west4-a", "--", *run, "--mesh=tpu-v5e-16"],
       "needs --tpu_name=NAME"),
      (["--backend=tpu-vm", "--tpu_name=t", "--", *run, "--mesh=tpu-v5e-16"], "needs --zone"),
      (["--backend=tpu-vm", "--tpu_name=t", "--zone=us-west4-a", "--", *run,
        "--mesh=gpu-h100-8"], "launches Cloud TPU entries"),
      (["--backend=slurm", "--", *run, "--mesh=tpu-v5e-16"], "is a Cloud TPU slice"),
      (["--backend=slurm", "--process_per=device", "--", *run, "--mesh=tpu-v5e-16"],
       "--process_per=device is for GPU entries"),
      (["--backend=slurm", "--process_per=gpu", "--", *run, "--mesh=gpu-h100-8"],
       "--process_per=gpu: expected one of host, device"),
      (["--backend=slurm", "--time=4h", "--", *run, "--mesh=gpu-h100-8"],
       "--time=4h: expected a Slurm time limit"),
      (["--backend=slurm", "--time=5", "--signal_before_s=300", "--", *run, "--mesh=gpu-h100-8"],
       "is not shorter than --time=5 (300 s)"),
      (["--backend=slurm", "--sbatch=qos=high", "--", *run, "--mesh=gpu-h100-8"],
       "give one sbatch option"),
  ]


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict:
  """Every in-process launch command of this file, run in one process (tests/cli_batch.py):
  name -> (result, its directory)."""
  root = tmp_path_factory.mktemp("launch")
  commands: dict[str, tuple[list[str], object]] = {}
  for i, (args, _) in enumerate(mistakes(str(root / "mistakes" / "run"))):
    commands[f"mistake-{i}"] = (["launch", *args], root / "mistakes")
  foreign = root / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  commands["foreign"] = (["launch", "--backend=slurm", "--", CONFIG, f"--output_dir={foreign}",
                          "--mesh=gpu-h100-8x2"], foreign)
  for name, (flags_, train) in GOLDEN_CASES.items():
    commands[name] = (["launch", "--dry_run", "--nocheck_fit", "--job_name=llm-1b", *flags_,
                       f"--record_dir={root / name}", "--", CONFIG, "--output_dir=/runs/llm_1b",
                       *train], root / name)
  for name, args in SCRIPTS.items():
    commands[name] = (["launch", *args(root / name)], root / name)
  # The default mesh (auto): no entry to plan for here, the processes pick theirs.
  commands["local-auto"] = (["launch", "--backend=local", "--dry_run", "--num_processes=2",
                             "--devices_per_process=2", "--", "--config=tests/testdata/ckpt_lm.py",
                             f"--output_dir={root / 'local-auto'}"], root / "local-auto")
  commands.update(run_dir_states(root / "l2"))
  commands.update(fit_checks(root))
  commands.update(records(root))
  results = cli_batch([argv for argv, _ in commands.values()])
  return {name: (result, where) for (name, (_, where)), result in zip(commands.items(), results)}


def run_dir_states(l2: pathlib.Path) -> dict[str, tuple[list[str], pathlib.Path]]:
  """A completed 1-step run in `l2`, then launches into it (in this order): a changed learning
  rate, the same config, a run nested in it, and --overwrite."""
  train = ["--config=tests/testdata/ckpt_lm.py", "--config.trainer.max_steps=1", "--mesh=cpu"]
  launch = ["launch", "--backend=local", "--dry_run", "--num_processes=2",
            "--devices_per_process=1", "--", *train]
  return {
      "l2-train": ([*train, f"--output_dir={l2}", "--progress=false"], l2),
      "l2-changed-lr": ([*launch, f"--output_dir={l2}", "--config.optimizer.learning_rate=1e-3"],
                        l2),
      "l2-completed": ([*launch, f"--output_dir={l2}"], l2),
      "l2-nested": ([*launch, f"--output_dir={l2 / 'inner'}"], l2),
      "l2-overwrite": ([*launch, f"--output_dir={l2}", "--overwrite"], l2),
  }


def test_launch_checks_the_run_directory_as_the_run_does_before_writing(batch):
  """A launch that its processes would refuse (a changed config, a nested run) is refused before
  it writes its record; a completed run is left alone; --overwrite then finds nothing foreign."""
  assert batch["l2-train"][0].returncode == 0, batch["l2-train"][0].stderr
  changed, completed, nested, overwrite = (batch[f"l2-{name}"][0] for name in (
      "changed-lr", "completed", "nested", "overwrite"))
  l2 = batch["l2-train"][1]
  [line] = changed.stderr.strip().splitlines()
  assert changed.returncode == 2 and line.startswith(f"axtrain: error: {l2} holds a run with a "
                                                     f"different config"), line
  assert "optimizer.learning_rate" in line
  assert completed.returncode == 0 and "already completed; nothing to do" in completed.stderr
  assert completed.stdout == ""  # nothing printed as written
  assert nested.returncode == 2 and "runs never nest" in nested.stderr
  assert not (l2 / "inner").exists()
  assert overwrite.returncode == 0, overwrite.stderr
  # Only the --overwrite launch left a record: the refused and the completed ones wrote nothing.
  [record] = (l2 / "launch").iterdir()
  assert record.name == "001-local.sh" and "--overwrite" in record.read_text()


# The test model with batches of 1024 x 8192 bytes: 2.5 TB of temporaries on a 16 GB chip.
TOO_BIG = ["--config=configs/llama.py:size=test", "--mesh=tpu-v5e-1",
           "--config.data.batch_size=1024", "--config.data.seq_len=8192", "--output_dir=/runs/x"]


def fit_checks(root: pathlib.Path) -> dict[str, tuple[list[str], pathlib.Path]]:
  """A job whose step needs more than its chip has, launched as is and with --force."""
  tpu = ["launch", "--backend=tpu-vm", "--dry_run", "--tpu_name=t", "--zone=us-west4-a"]
  return {"too-big": ([*tpu, f"--record_dir={root / 'too-big'}", "--", *TOO_BIG],
                      root / "too-big"),
          "too-big-forced": ([*tpu, "--force", f"--record_dir={root / 'forced'}", "--", *TOO_BIG],
                             root / "forced")}


def test_a_step_that_does_not_fit_its_mesh_is_refused_before_anything_is_written(batch):
  """launch compiles the step as `axtrain plan` does and refuses a job whose step does not fit
  the entry's devices, in one line with the figure, or with --force launches it with a warning."""
  refused, where = batch["too-big"]
  error = refused.stderr.strip().splitlines()[-1]
  assert refused.returncode == 2, refused.stderr
  m = re.match(r"axtrain: error: launch: the step does not fit tpu-v5e-1: it needs (\S+) GiB "
               r"per device of (\S+) GiB usable \(TPU compiler peak\); `axtrain plan "
               r"--config=configs/llama.py:size=test --config.data.batch_size=1024 "
               r"--config.data.seq_len=8192 --mesh=tpu-v5e-1 --sweep` ranks settings that fit; "
               r"--force launches it anyway$", error)
  assert m and float(m[1]) > float(m[2]), error
  assert not where.exists()
  forced, where = batch["too-big-forced"]
  assert forced.returncode == 0, forced.stderr
  assert "axtrain launch: warning: the step does not fit tpu-v5e-1: it needs " in forced.stderr
  # The plan's compile says what it compiles as it goes, through launch's own lines.
  assert "axtrain launch: plan: compiling the train step\n" in forced.stderr, forced.stderr
  assert [p.name for p in where.iterdir()] == ["001-tpu-vm.sh"]


def records(root: pathlib.Path) -> dict[str, tuple[list[str], pathlib.Path]]:
  """Launches whose records land beside earlier ones, one outside the cluster's run directory,
  and one into a directory whose name needs quoting."""
  tpu = ["launch", "--backend=tpu-vm", "--dry_run", "--nocheck_fit", "--tpu_name=t",
         "--zone=us-west4-a",
         f"--record_dir={root / 'tpu-records'}", "--", CONFIG, "--output_dir=/runs/llm_1b"]
  quoted = root / "it's a run"
  return {
      "tpu-16x2": ([*tpu, "--mesh=tpu-v5e-16x2"], root / "tpu-records"),
      "tpu-16": ([*tpu, "--mesh=tpu-v5e-16"], root / "tpu-records"),
      "k8s-remote": (["launch", "--backend=k8s", "--dry_run", "--nocheck_fit", "--image=r/a:1",
                      f"--volume=runs:{REMOTE}", f"--record_dir={root / 'k8s-remote'}", "--",
                      CONFIG, f"--output_dir={REMOTE / '1b'}", "--mesh=gpu-h100-8"],
                     root / "k8s-remote"),
      "slurm-quoted": (["launch", "--backend=slurm", "--nocheck_fit", "--", CONFIG,
                        f"--output_dir={quoted}", "--mesh=gpu-h100-8"], quoted),
  }


def test_each_launch_keeps_its_own_record(batch):
  first, second = batch["tpu-16x2"][0], batch["tpu-16"][0]
  assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
  where = batch["tpu-16"][1]
  assert sorted(p.name for p in where.iterdir()) == ["001-tpu-vm.sh", "002-tpu-vm.sh"]
  assert "--mesh=tpu-v5e-16x2" in (where / "001-tpu-vm.sh").read_text()
  assert "--mesh=tpu-v5e-16 " in (where / "002-tpu-vm.sh").read_text()
  assert f"wrote {where / '002-tpu-vm.sh'}" in second.stderr


def test_a_cluster_run_directory_is_not_created_here(batch):
  """The k8s run directory names the pods' volume: the record goes to --record_dir here."""
  result, where = batch["k8s-remote"]
  assert result.returncode == 0, result.stderr
  assert not REMOTE.exists()
  assert [p.name for p in where.iterdir()] == ["001-k8s.yaml"]
  assert f"--output_dir={REMOTE / '1b'}" in (where / "001-k8s.yaml").read_text()


def test_printed_commands_are_shell_quoted(batch):
  result, quoted = batch["slurm-quoted"]
  assert result.returncode == 0, result.stderr
  hint = result.stderr.split("submit it with: ", 1)[1].split("  (or add --submit)")[0]
  assert shlex.split(hint) == ["sbatch", str(quoted / "launch" / "001-slurm.sbatch")]
  assert (quoted / "launch" / "001-slurm.sbatch").is_file()


def test_mistakes_are_one_line_exit_2_and_write_nothing(batch):
  cases = mistakes("")
  for i, (args, part) in enumerate(cases):
    result, where = batch[f"mistake-{i}"]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (args, result.returncode, result.stderr)
    assert lines[0].startswith("axtrain: error: ") and part in lines[0], (args, lines[0])
  assert not where.exists()


def test_submit_without_the_scheduler_on_path(tmp_path):
  empty = tmp_path / "bin"
  empty.mkdir()
  out = tmp_path / "run"
  for backend, tool, extra, mesh in (("slurm", "sbatch", [], "gpu-h100-8x2"),
                                     ("k8s", "kubectl", ["--image=r/a:1"], "gpu-h100-8x2"),
                                     ("tpu-vm", "gcloud", ["--tpu_name=t", "--zone=us-west4-a"],
                                      "tpu-v5e-16")):
    result = cli("launch", f"--backend={backend}", "--submit", *extra, "--", CONFIG,
                 f"--output_dir={out}", f"--mesh={mesh}", env={"PATH": str(empty)})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"runs `{tool}`, which is not on PATH here" in lines[0]
  assert written(tmp_path) == ["bin"]


def test_a_foreign_run_directory_is_refused_before_anything_is_written(batch):
  result, where = batch["foreign"]
  assert result.returncode == 2 and "holds files that axtrain did not write" in result.stderr
  assert sorted(p.name for p in where.iterdir()) == ["notes.txt"]



# -- what each backend writes ----------------------------------------------------------------

GOLDEN_CASES = {
    "k8s-gpu-h100-8x2.yaml": (["--backend=k8s", "--image=registry.example.com/axtrain:v1",
                               "--volume=runs:/runs", "--node_selector=pool=h100"],
                              ["--mesh=gpu-h100-8x2"]),
    "k8s-tpu-v5e-16.yaml": (["--backend=k8s", "--image=registry.example.com/axtrain:v1",
                             "--volume=runs:/runs", "--namespace=train", "--max_restarts=3"],
                            ["--mesh=tpu-v5e-16"]),
    "tpu-vm-tpu-v5e-16.sh": (["--backend=tpu-vm", "--tpu_name=my-tpu", "--zone=us-west4-a",
                              "--workdir=/home/me/axtrain"], ["--mesh=tpu-v5e-16"]),
    "tpu-vm-tpu-v5e-16x2.sh": (["--backend=tpu-vm", "--tpu_name=my-tpu", "--zone=us-west4-a",
                                "--project=my-project", "--workdir=/home/me/axtrain"],
                               ["--mesh=tpu-v5e-16x2"]),
}


@pytest.fixture(scope="module")
def rendered(batch) -> dict[str, str]:
  """Each golden case's written file (run directory /runs/llm_1b), its --record_dir written as
  launches/llm-1b."""
  out = {}
  for name in GOLDEN_CASES:
    result, where = batch[name]
    assert result.returncode == 0, result.stderr
    [path] = where.iterdir()
    assert path.name in ("001-k8s.yaml", "001-tpu-vm.sh")
    text = path.read_text()
    assert text in result.stdout  # printed as written
    out[name] = text.replace(str(where), "launches/llm-1b")
  return out


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden(name, rendered):
  golden = GOLDEN / name
  if os.environ.get("UPDATE_GOLDEN"):
    golden.parent.mkdir(parents=True, exist_ok=True)
    golden.write_text(rendered[name])
  assert golden.exists(), f"no golden file {golden}; run with UPDATE_GOLDEN=1"
  assert rendered[name] == golden.read_text(), f"{name} changed; UPDATE_GOLDEN=1 and review"


def _k8s(text: str) -> tuple[dict, dict]:
  service, job = yaml.safe_load_all(text)
  for obj in (service, job):
    assert {"apiVersion", "kind", "metadata", "spec"} <= set(obj)
    assert _DNS_LABEL.match(obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 63
  assert (service["apiVersion"], service["kind"], job["apiVersion"], job["kind"]) == (
      "v1", "Service", "batch/v1", "Job")
  spec, pod = job["spec"], job["spec"]["template"]["spec"]
  # A headless Service whose selector picks the Job's pods, named as their subdomain.
  assert service["spec"]["clusterIP"] == "None"
  assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"][
      "labels"].items()
  assert pod["subdomain"] == service["metadata"]["name"]
  # One pod per process, indexed; a pod failure policy needs restartPolicy Never.
  assert spec["completionMode"] == "Indexed"
  assert spec["completions"] == spec["parallelism"]
  assert pod["restartPolicy"] == "Never"
  rules = spec["podFailurePolicy"]["rules"]
  assert {"action": "Ignore", "onExitCodes": {"containerName": "axtrain", "operator": "In",
                                              "values": [75]}} in rules
  assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
  assert spec["backoffLimit"] >= 1
  [container] = pod["containers"]
  assert {"name", "image", "command"} <= set(container)
  assert container["command"][0] == "axtrain" and CONFIG in container["command"]
  return service, job


def test_k8s_gpu_manifest(rendered):
  service, job = _k8s(rendered["k8s-gpu-h100-8x2.yaml"])
  spec, pod = job["spec"], job["spec"]["template"]["spec"]
  [container] = pod["containers"]
  assert spec["completions"] == 2 and spec["backoffLimit"] == 5 * 2
  assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
  env = {e["name"]: e for e in container["env"]}
  name = job["metadata"]["name"]
  # Pod 0's DNS name through the headless Service, in the job's namespace.
  port = service["spec"]["ports"][0]["port"]
  assert env["JAX_COORDINATOR_ADDRESS"]["value"] == f"{name}-0.{name}.default.svc:{port}"
  assert env["JAX_NUM_PROCESSES"]["value"] == "2"
  assert "job-completion-index" in env["JAX_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
  assert pod["nodeSelector"] == {"pool": "h100"}
  assert container["volumeMounts"][0]["mountPath"] == "/runs"
  assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "runs"


def test_k8s_tpu_manifest(rendered):
  _, job = _k8s(rendered["k8s-tpu-v5e-16.yaml"])
  spec, pod = job["spec"], job["spec"]["template"]["spec"]
  [container] = pod["containers"]
  assert job["metadata"]["namespace"] == "train"
  assert spec["completions"] == 4 and spec["backoffLimit"] == 3 * 4
  assert container["resources"]["limits"] == {"google.com/tpu": 4}
  assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                 "cloud.google.com/gke-tpu-topology": "4x4"}
  assert container["command"][-1] == "--distributed=tpu" and "env" not in container


def _worker_commands(script: str) -> list[tuple[str, list[str]]]:
  """(slice, the command a worker runs, split) for each gcloud ssh line of a tpu-vm script."""
  out = []
  for line in script.splitlines():
    if line.startswith("gcloud compute tpus tpu-vm ssh"):
      words = shlex.split(line.replace('"$coordinator"', "10.0.0.2").removesuffix(" &"))
      command = next(w for w in words if w.startswith("--command=")).removeprefix("--command=")
      out.append((words[5], shlex.split(command)))
  return out


def test_tpu_vm_scripts(rendered):
  for name in ("tpu-vm-tpu-v5e-16.sh", "tpu-vm-tpu-v5e-16x2.sh"):
    check = subprocess.run(["bash", "-n"], input=rendered[name], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
  [(tpu, words)] = _worker_commands(rendered["tpu-vm-tpu-v5e-16.sh"])
  assert tpu == "my-tpu" and "--worker=all" in rendered["tpu-vm-tpu-v5e-16.sh"]
  assert words[:3] == ["cd", "/home/me/axtrain", "&&"]
  assert words[3:] == [".venv/bin/axtrain", CONFIG, "--output_dir=/runs/llm_1b",
                       "--mesh=tpu-v5e-16", "--distributed=tpu"]
  slices = _worker_commands(rendered["tpu-vm-tpu-v5e-16x2.sh"])
  assert [tpu for tpu, _ in slices] == ["my-tpu-0", "my-tpu-1"]
  for i, (_, words) in enumerate(slices):
    env = dict(w.split("=", 1) for w in words[3:7])
    assert env == {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8080", "MEGASCALE_NUM_SLICES": "2",
                   "MEGASCALE_SLICE_ID": str(i), "MEGASCALE_PORT": "8080"}
    assert words[7:] == [".venv/bin/axtrain", CONFIG, "--output_dir=/runs/llm_1b",
                         "--mesh=tpu-v5e-16x2", "--distributed=tpu"]


SCRIPTS = {
    "slurm-gpu": lambda out: [
        "--backend=slurm", "--time=2-00:00:00", "--partition=h100", "--account=lm",
        "--sbatch=--qos=high", "--sbatch=--exclusive", "--max_restarts=7", "--nocheck_fit", "--",
        CONFIG,
        f"--output_dir={out}", "--mesh=gpu-h100-8x2"],
    "slurm-per-gpu": lambda out: [
        "--backend=slurm", "--process_per=device", "--nocheck_fit", "--", CONFIG,
        f"--output_dir={out}",
        "--mesh=gpu-h100-8x2"],
    "local-cpu": lambda out: [
        "--backend=local", "--dry_run", "--num_processes=2", "--devices_per_process=4", "--",
        "--config=tests/testdata/ckpt_lm.py", f"--output_dir={out}", "--mesh=cpu"],
}


def test_a_local_launch_of_the_default_mesh_checks_its_layout_and_starts(batch):
  """--mesh=auto (no --mesh): the layout is checked on the cpu entry the processes will take,
  and no memory check is asked of an entry that is not known until they start."""
  result = batch["local-auto"][0]
  assert result.returncode == 0, result.stderr


def test_slurm_script_and_local_dry_run(batch):
  results = [batch[name][0] for name in SCRIPTS]
  gpu, per_gpu, cpu = (batch[name][1] for name in SCRIPTS)
  for result in results:
    assert result.returncode == 0, result.stderr
  script = (gpu / "launch" / "001-slurm.sbatch").read_text()
  options = re.findall(r"^#SBATCH (\S+)$", script, re.M)
  assert options == [f"--job-name={default_name(gpu)}", "--nodes=2", "--ntasks-per-node=1",
                     "--gpus-per-node=8", "--time=2-00:00:00", "--signal=TERM@300",
                     "--partition=h100", "--account=lm", "--requeue", "--open-mode=append",
                     f"--output={gpu / 'launch' / 'slurm-%j.out'}", "--qos=high", "--exclusive"]
  assert "export JAX_LOCAL_DEVICE_IDS=0,1,2,3,4,5,6,7\n" in script
  assert "srun --kill-on-bad-exit=1 " in script and "${SLURM_RESTART_COUNT:-0}\" -lt 7" in script
  assert 'scontrol requeue "$SLURM_JOB_ID"' in script
  assert subprocess.run(["bash", "-n", gpu / "launch" / "001-slurm.sbatch"]).returncode == 0
  per_device = (per_gpu / "launch" / "001-slurm.sbatch").read_text()
  assert "#SBATCH --ntasks-per-node=8\n" in per_device and "JAX_LOCAL_DEVICE_IDS" not in per_device
  assert "#SBATCH --time" not in per_device and "#SBATCH --signal" not in per_device
  # local --dry_run: the two commands, one coordinator, nothing started.
  local = (cpu / "launch" / "001-local.sh").read_text()
  lines = [shlex.split(line.removesuffix(" &")) for line in local.splitlines()
           if "--process_id=" in line]
  assert [words[0] for words in lines] == ["XLA_FLAGS=--xla_force_host_platform_device_count=4"] * 2
  assert [w for w in lines[0] if w.startswith("--process_id")] == ["--process_id=0"]
  assert [w for w in lines[1] if w.startswith("--process_id")] == ["--process_id=1"]
  address = {w for words in lines for w in words if w.startswith("--coordinator_address=127.0.0.1:")}
  assert len(address) == 1
  assert sorted(p.name for p in cpu.iterdir()) == [".lock", "launch"]  # as a run leaves it
  assert "run it with: axtrain launch --backend=local --num_processes=2" in results[2].stderr
