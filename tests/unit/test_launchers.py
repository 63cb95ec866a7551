"""The launch layer's one interface (cpbench/launch/base.py): the registry picks each run's launcher from
its settings and the process's environment, and a new launcher is one class and one registry line: the
app runs it, tells its refusal in one line and closes its run, with nothing else changed."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from support.processes import BASE, FAST, results

from cpbench.app.campaign import run
from cpbench.app.preflight import check_runs_of_its_own
from cpbench.core import ConfigError, Topology
from cpbench.launch import registry
from cpbench.launch.base import Finished, Launcher, Notify
from cpbench.launch.local import LocalLauncher
from cpbench.launch.slurm import SlurmLauncher
from cpbench.launch.torchrun import TorchrunLauncher
from cpbench.rank import RunSpec, run_rank
from cpbench.settings.schema import BenchConfig, register
from cpbench.workloads.base import Workload


def _cfg(*overrides: str):
    register()
    with initialize_config_module("cpbench.configs", version_base="1.3"):
        return compose("config", [*BASE, *FAST, *overrides])


def _settings(*overrides: str) -> BenchConfig:
    return OmegaConf.to_object(_cfg("output_dir=unused", *overrides))


@pytest.fixture
def plain_process(monkeypatch):
    """No torchrun and no submitit job around this process, whatever ran the tests."""
    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_registry_picks_the_launcher_from_settings_then_environment(plain_process):
    local = registry.launcher_for(_settings())
    assert type(local) is LocalLauncher and local.leads and local.runs_here and local.starts_runs
    assert not local.settings.in_process  # cp=2: the ranks are processes of their own
    assert registry.launcher_for(_settings("topology.cp=1")).settings.in_process
    assert not registry.launcher_for(_settings("topology.cp=1"), in_sweep=True).settings.in_process
    on_slurm = registry.launcher_for(_settings("slurm.enabled=true"))
    assert type(on_slurm) is SlurmLauncher and not on_slurm.runs_here and not on_slurm.starts_runs
    plain_process.setenv("TORCHELASTIC_RUN_ID", "x")
    plain_process.setenv("WORLD_SIZE", "2")
    plain_process.setenv("RANK", "1")
    ranked = registry.launcher_for(_settings())
    assert type(ranked) is TorchrunLauncher and not ranked.leads and not ranked.starts_runs
    with pytest.raises(ConfigError, match=r"^topology.cp=4: torchrun started 2 rank\(s\)"):
        ranked.validate(Topology.from_config("1d", 4, None))
    assert type(registry.launcher_for(_settings("slurm.enabled=true"))) is SlurmLauncher  # asked for: first


class InThisProcess(Launcher):
    """A launcher written for this test alone: one rank, here; it refuses every cp but 1."""

    named = "the test's launcher"
    started: list[str] = []

    @classmethod
    def chosen(cls, settings: BenchConfig) -> bool:
        return settings.seed == 7  # chosen by a setting, as slurm.enabled chooses SLURM

    @classmethod
    def from_settings(cls, settings: BenchConfig, in_sweep: bool) -> InThisProcess:
        return cls()

    def validate(self, topology: Topology, ranks_run: bool = True) -> None:
        if topology.cp != 1:
            raise ConfigError(f"topology.cp={topology.cp}: the test's launcher runs cp=1 only")

    @property
    def starts_runs(self) -> bool:
        return False

    def start(self, spec: RunSpec, workload: Workload | None, notify: Notify) -> Finished:
        InThisProcess.started.append(spec.output_dir)
        run_rank(spec, workload)
        return Finished()


def test_a_new_launcher_is_one_class_and_one_registry_line(plain_process, tmp_path, capsys):
    plain_process.setattr(registry, "LAUNCHERS", (InThisProcess, *registry.LAUNCHERS))
    plain_process.chdir(tmp_path)
    refused = tmp_path / "refused"
    assert run(_cfg("seed=7", "topology.cp=2", f"output_dir={refused}")) == 2
    said = capsys.readouterr().err.strip()
    assert said == "cpbench: error: topology.cp=2: the test's launcher runs cp=1 only"
    assert not refused.exists() and InThisProcess.started == []  # refused before any rank started
    with pytest.raises(ConfigError, match="^mode=accuracy: .* not the test's launcher$"):
        check_runs_of_its_own(_settings("seed=7", "topology.cp=1", "mode=accuracy"))
    out = tmp_path / "out"
    assert run(_cfg("seed=7", "topology.cp=1", "sweep.n_tokens=[16]", f"output_dir={out}")) == 0
    assert InThisProcess.started == [str(out.resolve())]
    frame = results(out)
    assert list(zip(frame["N_tokens"], frame["cp"], frame["status"], strict=True)) == [(16, 1, "ok")]
    assert not (out / "baseline").exists()  # it does not start runs of its own
