"""A real one-node Slurm cluster in a temporary directory, for tests (Debian's `slurm-wlm`).

slurmctld and slurmd run as root in the foreground, with `auth/none`, loopback ports chosen
free, `proctrack/linuxproc` and their own slurm.conf, state, spool and log directories; every
client command reads SLURM_CONF. Job completions are logged by `jobcomp/filetxt`, which
`sacct --completion` reads (no accounting database). A requeued job may start again after
`cred_expire` seconds: 5 here (Slurm's default is 120), and the scheduler looks at pending jobs
every second (its default: 60).
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import socket
import subprocess
import time

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sacct", "sinfo")


def missing() -> str | None:
  """Why a cluster cannot start here (None: it can)."""
  absent = [p for p in (*DAEMONS, *CLIENTS) if shutil.which(p) is None
            and not os.path.exists(f"/usr/sbin/{p}")]
  if absent:
    return (f"Slurm is not installed ({', '.join(absent)} missing): apt-get install slurm-wlm "
            f"(.ci/run installs it)")
  if os.geteuid() != 0:
    return "the test Slurm cluster runs slurmd as root; run the tests as root (as .ci/run does)"
  return None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _daemon(name: str) -> str:
  return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
  def __init__(self, root: pathlib.Path, *, cpus: int = 2):
    self.root = pathlib.Path(root)
    self.conf = self.root / "slurm.conf"
    self.jobcomp = self.root / "jobcomp.txt"
    self.cpus = cpus
    self.node = socket.gethostname()
    self._procs: list[subprocess.Popen] = []

  @property
  def env(self) -> dict:
    return {"SLURM_CONF": str(self.conf)}

  def write_conf(self) -> None:
    for sub in ("state", "spool", "log"):
      (self.root / sub).mkdir(parents=True, exist_ok=True)
    # JAX's coordinator port in a Slurm job is 61440 + job id % 4096: a random first job id
    # keeps two test clusters on one machine (parallel checkouts) off each other's ports.
    first_job = random.randrange(1000, 4_000_000)
    r = self.root
    self.conf.write_text(f"""\
ClusterName=axtest
SlurmctldHost={self.node}(127.0.0.1)
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=5
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=10
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
FirstJobId={first_job}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")

  def start(self, timeout_s: float = 60) -> "Cluster":
    self.write_conf()
    env = {**os.environ, **self.env}
    for name, args in (("slurmctld", ["-D", "-c", "-i"]), ("slurmd", ["-D", "-c"])):
      log = open(self.root / "log" / f"{name}.stderr", "wb")  # pylint: disable=consider-using-with
      self._procs.append(subprocess.Popen([_daemon(name), *args], env=env, stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
      log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      for proc in self._procs:
        if proc.poll() is not None:
          raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}: "
                             f"{self._logs()[-2000:]}")
      state = self.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
      if state in ("idle", "mixed", "allocated"):
        return self
      time.sleep(0.3)
    raise RuntimeError(f"the Slurm node did not become idle in {timeout_s} s: {self._logs()[-2000:]}")

  def _logs(self) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((self.root / "log").glob("*")))

  def stop(self) -> None:
    """Cancels every job, then stops the daemons by pid (SIGTERM, SIGKILL after 10 s)."""
    if all(p.poll() is None for p in self._procs):
      self.run("scancel", "--full", "--user=root", check=False)
    for proc in reversed(self._procs):
      if proc.poll() is None:
        proc.terminate()
    for proc in reversed(self._procs):
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    self._procs = []

  def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """A Slurm client command against this cluster."""
    return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True,
                          text=True, timeout=timeout, check=check)

  def job_state(self, job_id: str) -> str:
    """The job's state (PENDING, RUNNING, COMPLETED, ...); from the completion log once done."""
    out = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()
    if out:
      return out
    states = [line.split("JobState=")[1].split()[0]
              for line in self.completions() if f"JobId={job_id} " in line]
    return states[-1] if states else "UNKNOWN"

  def completions(self) -> list[str]:
    return self.jobcomp.read_text().splitlines() if self.jobcomp.exists() else []

  def wait(self, job_id: str, *, until: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED",
                                                            "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
           timeout_s: float = 600) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      state = self.job_state(job_id)
      if state in until and not self.run("squeue", "-h", "-j", job_id, check=False).stdout.strip():
        return state
      time.sleep(0.5)
    raise AssertionError(f"Slurm job {job_id} not done in {timeout_s} s: {self.job_state(job_id)}")
