"""A private SLURM cluster for the tests: its own munged, slurmctld and slurmd, every file of theirs
under one folder and on free ports, so nothing of the machine's own SLURM or munge is touched. One node
(this host), or several: one slurmd a node on this host (`slurmd -N`), each on its own port, whose names
resolve through lines in /etc/hosts that live as long as the cluster (the rendezvous of a job's ranks
reaches its first node by name, as on a real cluster).

The scheduler settings make a requeued job start again within seconds rather than minutes: a requeued
job waits `cred_expire` (default 120 s) before it may start, and a pending job waits for the next main
scheduling loop (`sched_interval`, default 60 s) or backfill pass."""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
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
HOSTS = Path("/etc/hosts")


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
    """One slurmctld and a slurmd for each of `nodes` on localhost; `env` points SLURM's commands at it.
    `cpus`: each node's (all this host's: the nodes share its cores)."""

    root: Path
    nodes: tuple[str, ...]
    cpus: int
    env: dict[str, str]
    _daemons: list[subprocess.Popen] = field(default_factory=list)
    _hosts_lines: list[str] = field(default_factory=list)

    @property
    def node(self) -> str:
        """The first node: a job's MASTER_ADDR."""
        return self.nodes[0]

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

    def idle(self) -> bool:
        """Every node is up and free."""
        listed = self.command("sinfo", "-h", "-N", "-n", ",".join(self.nodes), "-o", "%N %T", check=False)
        states = dict(line.split() for line in listed.stdout.splitlines() if line.strip())
        return all(states.get(node) == "idle" for node in self.nodes)

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
            self._end()

    def _end(self) -> None:
        """End its daemons and take its lines out of /etc/hosts."""
        for proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._hosts_lines:
            _edit_hosts(lambda lines: [line for line in lines if line not in self._hosts_lines])
            self._hosts_lines = []

    def _name_nodes(self) -> None:
        """One line in /etc/hosts for each node, marked with this cluster's folder, until `_end`."""
        mark = f"# cpbench test cluster {self.root}"
        lines = [
            f"{addr} {node}  {mark}\n" for addr, node in zip(_addresses(self.nodes), self.nodes, strict=True)
        ]
        _edit_hosts(lambda before: [*before, *lines])
        self._hosts_lines = lines


def _edit_hosts(edit: Callable[[list[str]], list[str]]) -> None:
    """Rewrite /etc/hosts in place (a container's may be a bind mount, which a rename would not reach),
    under a lock: the clusters of other test workers edit it too."""
    with HOSTS.open("r+") as hosts:
        fcntl.flock(hosts, fcntl.LOCK_EX)
        text = hosts.read()
        lines = edit((text if text.endswith("\n") or not text else text + "\n").splitlines(keepends=True))
        hosts.seek(0)
        hosts.write("".join(lines))
        hosts.truncate()


def _node_names(count: int) -> tuple[str, ...]:
    """The host itself for one node; for several, names no other cluster (another test worker's, another
    session's) uses at the same time."""
    if count == 1:
        return (socket.gethostname().split(".")[0],)
    tag = secrets.token_hex(3)
    return tuple(f"cpb-{tag}-{i}" for i in range(1, count + 1))


def _addresses(nodes: tuple[str, ...]) -> list[str]:
    """Each node's address: 127.0.0.1 for the host; for named nodes 127.0.0.2, .3, ..., loopback addresses
    too (Linux routes all of 127/8 to this host), but each node its own, as on a real cluster."""
    return ["127.0.0.1"] if len(nodes) == 1 else [f"127.0.0.{i + 2}" for i in range(len(nodes))]


def _slurm_conf(root: Path, nodes: tuple[str, ...], cpus: int, memory: int, socket_path: Path) -> str:
    ports = _free_port(), _free_port()
    # One node is the host itself; several share it, each slurmd on a port of its own.
    node_lines = [
        f"NodeName={node} NodeAddr={address} CPUs={cpus} RealMemory={memory} State=UNKNOWN"
        + ("" if len(nodes) == 1 else f" Port={_free_port()}")
        for node, address in zip(nodes, _addresses(nodes), strict=True)
    ]
    return "\n".join(
        [
            "ClusterName=cpbench-tests",
            # Job ids of its own: submitit derives MASTER_PORT from the job id, and two test clusters on
            # one machine (pytest-xdist workers) would otherwise run jobs of the same id side by side.
            f"FirstJobId={ports[0] * 100}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={ports[0]}",
            f"SlurmdPort={ports[1]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={socket_path},cred_expire={REQUEUE_WAIT_S}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool' / '%n'}",  # %n: the node's name, for each slurmd its own
            f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
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
            *node_lines,
            f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _daemon(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("ab") as out:  # the daemon keeps its own copy of the descriptor
        return subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_for(what: str, condition: Callable[[], bool], timeout: float, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            log = cluster.ctld_log.read_text() if cluster.ctld_log.exists() else ""
            raise RuntimeError(f"the test cluster: {what} within {timeout:.0f}s\n{log[-3000:]}")
        time.sleep(0.2)


def skip_without_hosts_file() -> None:
    """Skip where this user cannot write /etc/hosts: several nodes need their names there."""
    try:
        HOSTS.open("r+").close()
    except OSError as err:
        pytest.skip(f"2-node SLURM tests add their node names to {HOSTS}, not writable here ({err.strerror})")


def start(root: Path, nodes: int = 1) -> Cluster:
    """Start munged, slurmctld and `nodes` slurmd under `root` (several: their names in /etc/hosts until
    `stop`); return once every node is idle."""
    names, cpus = _node_names(nodes), os.cpu_count() or 1
    for sub in ("munge", "state", "run", "log", *(f"spool/{node}" for node in names)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key, socket_path = root / "munge" / "munge.key", root / "munge" / "munge.socket"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, names, cpus, _real_memory_mib(), socket_path))
    cluster = Cluster(root, names, cpus, {"SLURM_CONF": str(conf)})
    munge = ["munged", "--foreground", "--force", f"--socket={socket_path}", f"--key-file={key}"]
    munge += [f"--pid-file={root / 'munge' / 'munged.pid'}", f"--seed-file={root / 'munge' / 'munged.seed'}"]
    munge += [f"--log-file={root / 'log' / 'munged.log'}"]
    try:
        if nodes > 1:
            cluster._name_nodes()
        cluster._daemons.append(_daemon(munge, cluster.env, root / "log" / "munged.out"))
        _wait_for("munged listening", socket_path.exists, 30, cluster)
        ctld = ["slurmctld", "-D", "-f", str(conf)]
        cluster._daemons.append(_daemon(ctld, cluster.env, root / "log" / "slurmctld.out"))
        for node in names:
            slurmd = ["slurmd", "-D", "-f", str(conf), *(["-N", node] if nodes > 1 else [])]
            cluster._daemons.append(_daemon(slurmd, cluster.env, root / "log" / f"slurmd-{node}.out"))
        _wait_for(f"nodes {','.join(names)} idle", cluster.idle, 60, cluster)
    except BaseException:
        cluster._end()
        raise
    return cluster
