"""One run as one SLURM job through submitit: sized from topology.cp, built (sbatch script) without a
cluster, run for real through submitit's local executor (one task per rank, the same code path as on
SLURM), failed, and requeued mid-point."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import FAST, TESTS, cpbench, ok, results
from omegaconf import OmegaConf

from cpbench.launch import slurm
from cpbench.results.folder import RunFolder
from cpbench.settings.slurm import SlurmConfig
from cpbench.settings.validate import ConfigError

QUICK = FAST
LOCAL = ["slurm.enabled=true", "slurm.cluster=local", "slurm.gpus_per_node=0"]

SLOW_STEPS = """
import time

from adapters.fold_cp_style import build_batch, build_model
from adapters.fold_cp_style import run_step as _run_step


def run_step(model, batch, train):
    time.sleep(0.25)  # slow enough to be interrupted in the middle of a point
    return _run_step(model, batch, train)
"""


def _slurm(**overrides) -> OmegaConf:
    return OmegaConf.structured(SlurmConfig(**overrides))


@pytest.mark.parametrize(
    "cp,overrides,expected",
    [
        (1, {}, (1, 1, 1)),
        (8, {}, (1, 8, 8)),
        (16, {}, (2, 8, 8)),
        (12, {}, (2, 6, 6)),  # two nodes of six ranks, not 8 + 4
        (32, {"gpus_per_node": 4}, (8, 4, 4)),
        (8, {"gpus_per_node": 8, "ranks_per_node": 4}, (2, 4, 4)),
        (4, {"gpus_per_node": 0}, (1, 4, 0)),  # CPU ranks, all on one node
        (6, {"gpus_per_node": 0, "ranks_per_node": 4}, (2, 3, 0)),
    ],
)
def test_layout_sizes_the_job_from_cp(cp, overrides, expected):
    shape = slurm.layout(cp, _slurm(**overrides))
    assert (shape.nodes, shape.tasks_per_node, shape.gpus_per_node) == expected
    assert shape.nodes * shape.tasks_per_node == cp


@pytest.mark.parametrize(
    "cp,overrides,message",
    [
        (9, {}, "topology.cp=9: does not split evenly over 2 nodes of at most 8 ranks"),
        (16, {"cluster": "local"}, "slurm.cluster=local runs on this one machine; 2 nodes were needed"),
        (4, {"ranks_per_node": 16}, "slurm.ranks_per_node=16: more ranks than slurm.gpus_per_node=8"),
        (4, {"cluster": "pbs"}, "slurm.cluster=pbs: allowed values are slurm, local"),
    ],
)
def test_layouts_that_cannot_be_built_are_rejected_by_name(cp, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        slurm.layout(cp, _slurm(**overrides))


def test_executor_parameters_follow_cp_and_the_slurm_keys(tmp_path):
    cfg = OmegaConf.create(
        {"slurm": OmegaConf.to_container(_slurm(partition="gpu", account="proj", time_min=90, mem_gb=400))}
    )
    params = slurm.executor_parameters(cfg, 16)
    assert params == {
        "name": "cpbench-cp16",
        "timeout_min": 90,
        "nodes": 2,
        "tasks_per_node": 8,
        "gpus_per_node": 8,
        "mem_gb": 400,
        "slurm_partition": "gpu",
        "slurm_account": "proj",
        "slurm_signal_delay_s": 120,
        "slurm_exclusive": True,
        "slurm_srun_args": ["--kill-on-bad-exit=1"],
    }
    # submitit itself takes them (its local executor needs no cluster; it ignores the slurm_ ones).
    local = OmegaConf.merge(cfg, {"slurm": {"cluster": "local", "gpus_per_node": 0}})
    executor = slurm.build_executor(local, RunFolder(tmp_path), 4)
    assert executor.cluster == "local" and executor.folder == (tmp_path / "slurm" / "%j").resolve()
    assert {k: executor.parameters[k] for k in ("tasks_per_node", "nodes", "timeout_min")} == {
        "tasks_per_node": 4,
        "nodes": 1,
        "timeout_min": 90,
    }


def test_the_sbatch_script_is_built_without_a_cluster(tmp_path):
    out = tmp_path / "out"
    proc = ok(
        cpbench(
            "slurm.enabled=true",
            "slurm.dry_run=true",
            "slurm.partition=gpu",
            "slurm.account=proj",
            "slurm.time_min=90",
            "+slurm.additional_parameters.exclusive=true",
            "topology.cp=16",
            f"output_dir={out}",
            cwd=tmp_path,
        )
    )
    script = (out / "slurm" / "cpbench.sbatch").read_text()
    assert proc.stdout.strip() == script.strip()
    folder = out.resolve() / "slurm" / "%j"
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --time=90",
        "#SBATCH --signal=USR2@120",  # the warning before the time limit: checkpoint and requeue
        "#SBATCH --exclusive",
        "#SBATCH --job-name=cpbench-cp16",
        f"#SBATCH --output={folder}/%j_0_log.out",
        f"#SBATCH --error={folder}/%j_0_log.err",
    ):
        assert line in script.splitlines(), (line, script)
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert f"--output {folder}/%j_%t_log.out" in srun and f"--error {folder}/%j_%t_log.err" in srun
    assert "--kill-on-bad-exit=1" in srun and srun.endswith(f"-m submitit.core._submit {folder}")
    assert [p.name for p in out.iterdir()] == ["slurm"]  # nothing submitted, nothing measured


@pytest.mark.unit
def test_a_jobs_master_port_is_its_ids_and_below_the_ephemeral_ports():
    """Every task and every requeue of a job computes the same port from the job id; no job's port is
    one the kernel hands to outgoing connections (Linux's default ephemeral range starts at 32768).
    submitit's own pick for job 4385302 (20000-60000, from the id) was 35151, which a connection on the
    machine held: that job's rank 0 failed with EADDRINUSE in a run of the suite."""
    from cpbench.launch.slurm.job import master_port

    ids = [str(4385300 + i) for i in range(2000)] + ["4385302_7"]  # an array task's id too
    ports = [master_port(job) for job in ids]
    assert ports == [master_port(job) for job in ids]
    assert min(ports) >= 20000 and max(ports) < 32768
    assert len(set(ports)) > 1800  # spread over the range, as submitit's are over theirs


@pytest.mark.unit
def test_the_end_of_a_job_passes_every_except_exception():
    """submitit's USR2 handler raises UncompletedJobError where the rank is when it will not requeue the
    job. The FLOP count catches Exception (a step it cannot trace) and took it for that: the rank went
    on measuring until SLURM's kill, and the job left no result. Within `job_end_escapes` it passes."""
    from submitit.core.utils import UncompletedJobError

    from cpbench.launch.slurm.job import job_end_escapes

    ended = UncompletedJobError("Job not requeued because: timed-out too many times.")

    def submitits_handler(signum, frame):
        raise ended

    before = signal.signal(signal.SIGUSR2, submitits_handler)
    swallowed = []
    try:
        with pytest.raises(UncompletedJobError) as caught, job_end_escapes():
            try:
                signal.raise_signal(signal.SIGUSR2)  # in the middle of a FLOP count, say
            except Exception as err:  # what the count does with a step it cannot trace
                swallowed.append(err)
        assert caught.value is ended and not swallowed  # submitit records it as the task's result
        assert signal.getsignal(signal.SIGUSR2) is submitits_handler  # given back on the way out
        with pytest.raises(UncompletedJobError):  # and outside it, as submitit made it
            signal.raise_signal(signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_a_run_as_submitit_tasks_one_per_rank(tmp_path):
    out = tmp_path / "out"
    proc = ok(
        cpbench(*LOCAL, "topology.cp=2", "sweep.n_tokens=[16,32]", *QUICK, f"output_dir={out}", cwd=tmp_path)
    )
    frame = results(out)
    assert list(frame["N_tokens"]) == [16, 32] and set(frame["status"]) == {"ok"}
    assert set(frame["cp"]) == {2} and (frame["comm_ms"] > 0).all()
    note = json.loads((out / "slurm" / "submitted.json").read_text())
    assert note["layout"] == {"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 0}
    job = out / "slurm" / note["job_id"]
    assert {p.name for p in job.glob("*_log.err")} == {f"{note['job_id']}_{t}_log.err" for t in (0, 1)}
    assert {"rank0.log", "rank1.log"} <= {p.name for p in (out / "logs").iterdir()}
    assert f"submitted local job {note['job_id']} (1 node(s) x 2 rank(s) (CPU ranks))" in proc.stderr


def test_a_failed_job_records_the_failing_task(tmp_path):
    out = tmp_path / "out"
    proc = cpbench(
        *LOCAL, "topology.cp=2", "workload=adapter", "workload.module=adapters.fold_cp_style",
        "workload.contract=native",        "sweep.n_tokens=[16,32]", *QUICK, f"output_dir={out}",
        cwd=tmp_path, env={"CPBENCH_TEST_FAIL": "1:32"},
    )  # fmt: skip
    assert proc.returncode == 1
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["status"], strict=True)) == [(16, "ok"), (32, "error")]
    failure = json.loads((out / "failure.json").read_text())
    assert failure["error"].endswith("task 1: ValueError: injected failure at N=32")
    assert "task logs are in" in proc.stderr


def test_multirun_sizes_each_slurm_job_by_its_own_cp(tmp_path):
    out = tmp_path / "sweep"
    ok(
        cpbench(
            "-m", *LOCAL, "topology.cp=1,2", "sweep.n_tokens=[16]", *QUICK, f"output_dir={out}", cwd=tmp_path
        )
    )
    for job, cp in (("0_cp1", 1), ("1_cp2", 2)):
        note = json.loads((out / job / "slurm" / "submitted.json").read_text())
        assert note["layout"]["tasks_per_node"] == cp
        assert len(list((out / job / "slurm" / note["job_id"]).glob("*_log.err"))) == cp
    assert list(results(out)["cp"]) == [1, 2]


def _task_pid(job_id: str, task: int) -> int | None:
    """The process of one task of a submitit local job."""
    return submitit_task_pid(f"SUBMITIT_LOCAL_JOB_ID={job_id}", f"SUBMITIT_LOCAL_GLOBALID={task}")


def submitit_task_pid(*marks: str) -> int | None:
    """The process of a submitit task whose environment holds every one of `marks` ("NAME=value")."""
    wanted = [m.encode() for m in marks]
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if all(m in env for m in wanted) and b"submitit.core._submit" in cmdline:
            return int(proc.name)
    return None


def _wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_preempted_job_requeues_and_resumes_mid_sweep(tmp_path, monkeypatch):
    """SIGUSR2 (SLURM's warning before a timeout or preemption) on task 0: submitit checkpoints and
    requeues; the point in flight is measured again, the points done are not."""
    from hydra import compose, initialize_config_module

    from cpbench.rank import RunSpec
    from cpbench.settings.schema import register

    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS)
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}:{tmp_path}")  # the tasks import the workload
    out = tmp_path / "out"
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        cfg = compose(
            "config",
            [*LOCAL, "topology.cp=2", "workload=adapter", "workload.module=slow_steps",
             "workload.contract=native", "sweep.n_tokens=[16,32,48]", *QUICK, f"output_dir={out}"],
        )  # fmt: skip
    spec = RunSpec(settings=OmegaConf.to_object(cfg), output_dir=str(out))
    job = slurm.submit(spec, 2)
    try:
        state = out / "state.json"

        def measuring_32() -> bool:
            flight = json.loads(state.read_text())["in_flight"] if state.exists() else None
            return bool(flight) and flight["N_tokens"] == 32

        _wait_for(measuring_32)
        before = results(out)
        os.kill(_task_pid(job.job_id, 0), signal.SIGUSR2)
        assert slurm.failure_of(job) is None
    finally:
        job.cancel()
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["status"], strict=True)) == [(16, "ok"), (32, "ok"), (48, "ok")]
    pd.testing.assert_frame_equal(frame.iloc[: len(before)], before)  # measured before the requeue: kept
    log = (out / "slurm" / job.job_id / f"{job.job_id}_0_log.err").read_text()
    assert "Caught signal SIGUSR2" in log
    assert [line.split(": ")[1] for line in log.splitlines() if "point(s) to measure" in line] == [
        "3 point(s) to measure -> " + str(out),
        "2 point(s) to measure -> " + str(out),
    ]


def test_hydra_slurm_launcher_config_runs_one_task_per_job(tmp_path):
    """hydra/launcher=cpbench_slurm: one executor config for a whole sweep (one task per job, which
    launches its own cp ranks), requeued on timeout, its submitit files under the output dir."""
    from hydra import compose, initialize_config_module

    from cpbench.settings.schema import register

    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        cfg = compose(
            "config",
            ["hydra/launcher=cpbench_slurm", "hydra.launcher.partition=gpu", f"output_dir={tmp_path}"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (1, 1, 8)
    assert launcher.max_num_timeout == 3 and launcher.partition == "gpu"
    assert launcher.submitit_folder == f"{tmp_path}/.submitit/%j"
    assert list(cfg.hydra.callbacks) == ["check_output_dir", "merge_sweep"]
