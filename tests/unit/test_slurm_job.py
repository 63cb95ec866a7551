"""One run as one SLURM job, built without a cluster: sized from topology.cp, its executor's parameters,
its master port, the end of a job, and hydra's SLURM launcher config."""

from __future__ import annotations

import signal

import pytest
from omegaconf import OmegaConf

from cpbench.launch import slurm
from cpbench.results.folder import RunFolder
from cpbench.settings.slurm import SlurmConfig
from cpbench.settings.validate import ConfigError


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
