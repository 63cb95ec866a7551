"""A private one-node SLURM cluster for the tests: its own munged, slurmctld and slurmd, every file of
theirs under one folder and on free ports, so nothing of the machine's own SLURM or munge is touched.

The scheduler settings make a requeued job start again within seconds rather than minutes: a requeued
job waits `cred_expire` (default 120 s) before it may start, and a pending job waits for the next main
scheduling loop (`sched_interval`, default 60 s) or backfill pass."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "srun")
INSTALL = "apt-get install slurm-wlm munge"
# How long a requeued job must wait before it starts again (AuthInfo's cred_expire), and how often the
# scheduler looks at pending jobs; both seconds.
REQUEUE_WAIT_S = 5
SCHED_INTERVAL_S = 1


def missing_binaries() -> list[str]:
    """The SLURM and munge programs this machine lacks (a developer's laptop lacks them all)."""
    return [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]


def skip_without_slurm() -> None:
    """Skip the calling test module (or fixture) where SLURM is not installed: one reason, from one place,
    so pytest's summary says it in one line however many tests it skips."""
    if missing := missing_binaries():
        pytest.skip(f"SLURM tests need {', '.join(missing)}: `{INSTALL}` (as root)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _real_memory_mib() -> int:
    """What slurmd itself measures (`slurmd -C`): a node that claims more is set INVALID."""
    found = re.search(r"RealMemory=(\d+)", subprocess.check_output(["slurmd", "-C"], text=True))
    assert found, "slurmd -C printed no RealMemory"
    return int(found.group(1))


@dataclass
class Cluster:
    """One slurmctld and one slurmd on localhost; `env` points SLURM's commands at it."""

    root: Path
    node: str
    cpus: int
    env: dict[str, str]
    _daemons: list[subprocess.Popen] = field(default_factory=list)

    @property
    def ctld_log(self) -> Path:
        return self.root / "log" / "slurmctld.log"

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            args, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=60, check=check
        )

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, NodeList, StartTime, ...)."""
        text = self.command("scontrol", "show", "job", "-o", job_id).stdout
        return dict(item.split("=", 1) for item in text.split() if "=" in item)

    def ended(self, job_id: str, timeout: float = 60) -> dict[str, str]:
        """The job once SLURM has ended it (its tasks may leave their results a moment before)."""
        deadline = time.monotonic() + timeout
        while (job := self.job(job_id))["JobState"] in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED"):
            assert time.monotonic() < deadline, f"job {job_id} still {job['JobState']} after {timeout}s"
            time.sleep(0.5)
        return job

    def queue(self) -> list[str]:
        """The ids of the jobs slurmctld holds that have not ended."""
        return self.command("squeue", "-h", "-o", "%i").stdout.split()

    def node_state(self) -> str:
        return self.command("sinfo", "-h", "-n", self.node, "-o", "%T", check=False).stdout.strip()

    def cancel_all(self, timeout: float = 60) -> None:
        """End every job, and wait until none is left (the next test starts on an idle node)."""
        self.command("scancel", "--full", "--user", "root", check=False)
        deadline = time.monotonic() + timeout
        while self.queue() and time.monotonic() < deadline:
            time.sleep(0.5)

    def stop(self) -> None:
        try:
            self.cancel_all()
        finally:
            for proc in reversed(self._daemons):
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()


def _slurm_conf(root: Path, node: str, cpus: int, memory: int, socket_path: Path) -> str:
    ports = _free_port(), _free_port()
    return "\n".join(
        [
            "ClusterName=cpbench-tests",
            # Job ids of its own: submitit derives MASTER_PORT from the job id, and two test clusters on
            # one machine (pytest-xdist workers) would otherwise run jobs of the same id side by side.
            f"FirstJobId={ports[0] * 100}",
            f"SlurmctldHost={node}(127.0.0.1)",
            f"SlurmctldPort={ports[0]}",
            f"SlurmdPort={ports[1]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={socket_path},cred_expire={REQUEUE_WAIT_S}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "ReturnToService=2",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            f"SchedulerParameters=sched_interval={SCHED_INTERVAL_S},bf_interval={SCHED_INTERVAL_S}",
            "MinJobAge=600",  # ended jobs stay visible to scontrol for the tests that read them
            "KillWait=5",
            f"DefMemPerCPU={memory // cpus}",  # a job is sized by its CPUs, not given the whole memory
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN",
            f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _daemon(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("ab") as out:  # the daemon keeps its own copy of the descriptor
        return subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_for(what: str, condition, timeout: float, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            log = cluster.ctld_log.read_text() if cluster.ctld_log.exists() else ""
            cluster.stop()
            raise RuntimeError(f"the test cluster: {what} within {timeout:.0f}s\n{log[-3000:]}")
        time.sleep(0.2)


def start(root: Path) -> Cluster:
    """Start munged, slurmctld and slurmd under `root`; return once the node is idle."""
    for sub in ("munge", "state", "spool", "run", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key, socket_path = root / "munge" / "munge.key", root / "munge" / "munge.socket"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node, cpus = socket.gethostname().split(".")[0], os.cpu_count() or 1
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, node, cpus, _real_memory_mib(), socket_path))
    cluster = Cluster(root, node, cpus, {"SLURM_CONF": str(conf)})
    munge = ["munged", "--foreground", "--force", f"--socket={socket_path}", f"--key-file={key}"]
    munge += [f"--pid-file={root / 'munge' / 'munged.pid'}", f"--seed-file={root / 'munge' / 'munged.seed'}"]
    munge += [f"--log-file={root / 'log' / 'munged.log'}"]
    cluster._daemons.append(_daemon(munge, cluster.env, root / "log" / "munged.out"))
    _wait_for("munged listening", socket_path.exists, 30, cluster)
    for daemon in ("slurmctld", "slurmd"):
        cmd = [daemon, "-D", "-f", str(conf)]
        cluster._daemons.append(_daemon(cmd, cluster.env, root / "log" / f"{daemon}.out"))
    _wait_for(f"node {node} idle", lambda: cluster.node_state() == "idle", 60, cluster)
    return cluster
