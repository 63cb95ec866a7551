"""The torchrun launcher: someone else started the ranks (`torchrun -m cpbench`), and this process is
one of them. The only module that reads torchrun's environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from cpbench.core import ConfigError, Topology
from cpbench.launch.base import Caution, Finished, Launcher, Notify, check_gpus
from cpbench.rank import RunSpec, run_rank
from cpbench.settings.schema import BenchConfig
from cpbench.workloads.base import Workload


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def leads_here() -> bool:
    """This process is rank 0 of its world, or no rank of one at all: it owns the run folder."""
    return os.environ.get("RANK", "0") == "0"


@dataclass(frozen=True)
class World:
    """The world this rank belongs to, as its starter exported it (torch.distributed's variables)."""

    rank: int
    size: int
    local_size: int  # ranks on this node

    @classmethod
    def here(cls) -> World:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        return cls(int(os.environ.get("RANK", "0")), size, local)


SHARED_STORE = (
    "torchrun restarts the ranks (--max-restarts) and shares its rendezvous store with them: a restart "
    "can read the last attempt's addresses and fail to connect (pytorch/pytorch#135712); give torchrun "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
)


def _restarts_left_to_findings(probes: bool, world_size: int) -> str | None:
    """The caution for a probe under torch's agent: a rank out of memory alone ends its world (its peers
    wait in a collective it never joins), and the agent counts that restart against --max-restarts as
    it counts a crash. Its `_invoke_run` (torch/distributed/elastic/agent/server/api.py) decrements
    `_remaining_restarts` for every FAILED or UNHEALTHY group, and a worker's non-zero exit makes its
    group FAILED whatever the code; it restarts uncounted only on a membership change (a new agent
    waiting in the rendezvous), which a worker cannot ask for. So a lone out-of-memory restart cannot
    be kept off the count here, as the local launcher keeps it (docs/cluster.md)."""
    if not probes or world_size < 2 or "TORCHELASTIC_MAX_RESTARTS" not in os.environ:
        return None
    restarts = int(os.environ["TORCHELASTIC_MAX_RESTARTS"])
    return (
        f"torchrun counts every restart of the ranks against --max-restarts ({restarts} here), a rank "
        "out of memory alone included, which the probe meets near its edge: when they run out, run the "
        "same command again (it resumes), or give --max-restarts room for the probe's steps; "
        "`python -m cpbench` on one node does not count them (docs/cluster.md)"
    )


def _restarts_share_the_store() -> bool:
    """torch's elastic agent exports both to its workers: a restart is allowed, and the workers' process
    group uses the agent's own store, whose keys a restart does not clear."""
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    return restarts > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


class TorchrunLauncher(Launcher):
    """Each process is one rank: it runs its rank here and returns. Runs of their own (the baseline,
    accuracy's reference, repeat_check) cannot start from a rank."""

    named = "torchrun"

    def __init__(self, backend: str | None, probes: bool = False):
        self.backend, self.probes = backend, probes

    @classmethod
    def chosen(cls, settings: BenchConfig) -> bool:
        return under_torchrun()

    @classmethod
    def from_settings(cls, settings: BenchConfig, in_sweep: bool) -> TorchrunLauncher:
        return cls(settings.dist.backend, settings.probe.enabled)

    @property
    def world(self) -> World:
        return World.here()

    def validate(self, topology: Topology, ranks_run: bool = True) -> None:
        if not ranks_run:
            return
        world = self.world
        if world.size != topology.cp:
            raise ConfigError(
                f"topology.cp={topology.cp}: torchrun started {world.size} rank(s); give them the same number"
            )
        # torchrun's agent starts its node's ranks with one environment; tasks started one by one (by
        # SLURM, by submitit) may each be bound to a GPU of their own.
        check_gpus(
            self.backend, topology.cp, world.local_size, bound_apart="TORCHELASTIC_RUN_ID" not in os.environ
        )

    @property
    def leads(self) -> bool:
        return self.world.rank == 0

    @property
    def starts_runs(self) -> bool:
        return False

    def start(self, spec: RunSpec, workload: Workload | None, notify: Notify) -> Finished:
        if self.leads and self.restart == 0:
            findings = _restarts_left_to_findings(self.probes, spec.topology.cp)
            for line in (SHARED_STORE if _restarts_share_the_store() else None, findings):
                if line:
                    notify(Caution(line))
        allowed = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))  # torchrun's --max-restarts
        run_rank(replace(spec, restart=self.restart, max_restarts=allowed), workload)
        return Finished()

    @property
    def restart(self) -> int:
        """How many times torchrun started this world's ranks before (its --max-restarts)."""
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
