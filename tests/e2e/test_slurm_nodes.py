"""Jobs over two SLURM nodes through `python -m cpbench`, on a real two-node cluster (two slurmd on this
host, tests/support/slurm_cluster.py): the ranks of one run spread over both nodes meet at the first
node's name, and a rank 0 that cannot be reached fails in one line that says what to set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.processes import FAST, cpbench, ok, results
from support.slurm_cluster import skip_without_slurm
from support.slurm_jobs import submitted_job_id, task_log

from cpbench.launch.slurm.job import master_port

skip_without_slurm()

ON_SLURM = ["slurm.enabled=true", "slurm.gpus_per_node=0", "sweep.n_tokens=[32]", *FAST]


@pytest.fixture
def cluster(two_node_cluster):
    """The two-node cluster, with no job on it when a test starts or ends."""
    two_node_cluster.cancel_all()
    yield two_node_cluster
    two_node_cluster.cancel_all()


def _check_spread(cluster, out: Path, tasks_per_node: int) -> None:
    """The job ran on both nodes, `tasks_per_node` ranks on each, in node order (rank 0 on the first)."""
    job_id = submitted_job_id(out)
    job = cluster.ended(job_id)
    assert (job["JobState"], job["NumNodes"], job["NumTasks"]) == ("COMPLETED", "2", str(2 * tasks_per_node))
    assert sorted(cluster.command("scontrol", "show", "hostnames", job["NodeList"]).stdout.split()) == sorted(
        cluster.nodes
    )
    for task in range(2 * tasks_per_node):
        node, local = divmod(task, tasks_per_node)
        env = (
            f"local_rank={local}({tasks_per_node}), node={node}(2), global_rank={task}({2 * tasks_per_node})"
        )
        assert env in task_log(out, job_id, task)


def test_a_cp2_job_spreads_one_rank_on_each_node(cluster, tmp_path):
    out = tmp_path / "out"
    proc = ok(
        cpbench(
            *ON_SLURM, "slurm.ranks_per_node=1", "topology.cp=2", f"output_dir={out}",
            cwd=tmp_path, env=cluster.env, timeout=240,
        )
    )  # fmt: skip
    _check_spread(cluster, out, tasks_per_node=1)
    assert "(2 node(s) x 1 rank(s) (CPU ranks))" in proc.stderr
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["cp"], frame["status"], strict=True)) == [(32, 2, "ok")]


def test_a_2x2_job_runs_two_ranks_on_each_node(cluster, tmp_path):
    out = tmp_path / "out"
    ok(
        cpbench(
            *ON_SLURM, "topology.kind=2d", "topology.cp=4", "slurm.ranks_per_node=2", f"output_dir={out}",
            cwd=tmp_path, env=cluster.env, timeout=300,
        )
    )  # fmt: skip
    _check_spread(cluster, out, tasks_per_node=2)
    frame = results(out)
    assert list(zip(frame["cp"], frame["status"], strict=True)) == [(4, "ok")]


def test_a_multirun_sizes_each_job_by_its_cp(cluster, tmp_path):
    """-m topology.cp=1,2 with one rank a node: a one-node job, then a two-node one, merged at the end."""
    out = tmp_path / "sweep"
    ok(
        cpbench(
            "-m", *ON_SLURM, "slurm.ranks_per_node=1", "topology.cp=1,2", f"output_dir={out}",
            cwd=tmp_path, env=cluster.env, timeout=300,
        )
    )  # fmt: skip
    jobs = [cluster.ended(submitted_job_id(out / run)) for run in ("0_cp1", "1_cp2")]
    assert [(job["JobState"], job["NumNodes"]) for job in jobs] == [("COMPLETED", "1"), ("COMPLETED", "2")]
    merged = results(out)
    assert list(zip(merged["run"], merged["cp"], merged["status"], strict=True)) == [
        ("0_cp1", 1, "ok"),
        ("1_cp2", 2, "ok"),
    ]


def test_a_master_address_no_node_reaches_fails_in_one_line_within_the_timeout(cluster, tmp_path):
    """MASTER_ADDR exported (kept over the first node's name) as a name that resolves nowhere: every
    rank gives up after dist.timeout_s, and the console names the address and what to set, once."""
    out, address, timeout_s = tmp_path / "out", "cpbench-unreachable.invalid", 5
    proc = cpbench(
        *ON_SLURM, "slurm.ranks_per_node=1", "topology.cp=2", f"dist.timeout_s={timeout_s}",
        f"output_dir={out}", cwd=tmp_path, env={**cluster.env, "MASTER_ADDR": address}, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    job_id = submitted_job_id(out)
    job = cluster.ended(job_id)
    assert job["JobState"] == "FAILED"
    hours, minutes, seconds = map(int, job["RunTime"].split(":"))
    assert hours * 3600 + minutes * 60 + seconds < 60, job["RunTime"]  # not torch's default 300 s
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if address in line]
    assert len(said) == 1, proc.stdout + proc.stderr
    at = re.escape(f"{address}:{master_port(job_id)}")
    expected = (
        rf"cpbench: SLURM job {job_id} task [01]: \S*RendezvousFailed: rank [01] could not reach "
        rf"(rank 0|its own address) at {at} within dist\.timeout_s={timeout_s}: "
        rf"MASTER_ADDR={re.escape(address)} was exported: export an address every node reaches; task logs"
    )
    assert re.match(expected, said[0]), said[0]
    assert json.loads((out / "failure.json").read_text())["error"] in said[0]
