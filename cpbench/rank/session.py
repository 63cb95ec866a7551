"""What every phase of a rank shares: its settings, context, control group, run folder and records.
Built once per rank; the phases read it and never change the settings in it."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import torch.distributed as dist

from cpbench.core import RankContext
from cpbench.measure import flops
from cpbench.measure.cap import Cap, cap_rank, warm_before_cap
from cpbench.measure.fault import Fault
from cpbench.measure.memory import alloc_conf
from cpbench.measure.point import PointSettings, comm_timing
from cpbench.record import metadata, run_record
from cpbench.record.mllog import RunLog
from cpbench.record.peaks import Peak, run_peak
from cpbench.record.run_record import Change, DevicePeak, MemoryCap
from cpbench.results.folder import RunFolder
from cpbench.runtime import logs
from cpbench.runtime.logs import LOG
from cpbench.runtime.rank import pick_backend
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import BenchConfig, Mode, Workflow
from cpbench.workloads.base import Workload, traits


def broadcast(value: Any, group: dist.ProcessGroup) -> Any:
    """Rank 0's value on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


@dataclass
class RankSession:
    settings: BenchConfig
    ctx: RankContext
    control: dist.ProcessGroup  # agreement and result reductions, apart from the workload's groups
    folder: RunFolder
    workload: Workload
    cap: Cap | None  # the per-rank memory cap, applied
    heartbeat: logs.Heartbeat
    mllog: RunLog
    peak: Peak  # what MFU divides by: every rank has rank 0's

    @classmethod
    def open(
        cls, settings: BenchConfig, ctx: RankContext, control: dist.ProcessGroup, folder: RunFolder,
        workload: Workload,
    ) -> RankSession:  # fmt: skip
        lead = ctx.rank == 0
        heartbeat = logs.Heartbeat(settings.log.heartbeat_s if lead else None)
        mllog = RunLog(folder.mllog if lead else None)
        peak = broadcast(run_peak(settings, ctx.device), control)  # on CPU every rank's GEMM runs at once
        if settings.measure.count_flops:
            flops.load_counter()  # what the counter loads on first use sits under the cap, not in it
        # NCCL connects each peer and algorithm at its first use, with buffers of its own: all of them
        # before the cap is measured, or it counts their memory as the rank's (measure/cap.py).
        warmed = warm_before_cap(ctx, settings.memory, control)
        cap = cap_rank(settings.memory, ctx.device, warmed)
        return cls(settings, ctx, control, folder, workload, cap, heartbeat, mllog, peak)

    @property
    def lead(self) -> bool:
        return self.ctx.rank == 0

    @property
    def train(self) -> bool:
        return self.settings.workflow in (Workflow.training, Workflow.convergence)

    @cached_property
    def config_hash(self) -> str:  # hashing the settings costs a tenth of a second; they never change
        return config_hash(self.settings)

    @property
    def workload_name(self) -> str:
        return traits(self.workload).name

    def broadcast(self, value: Any) -> Any:
        return broadcast(value, self.control)

    def record_start(
        self, what_changed: list[Change], point_settings: PointSettings, restarted: bool
    ) -> None:
        """run.json's metadata and mllog's submission (rank 0); a restart of the run keeps its plan."""
        if not self.lead:
            return
        settings, ctx, cap = self.settings, self.ctx, self.cap
        found = metadata.collect(
            ctx.device, pick_backend(settings.dist.backend), ctx.topology, ctx.world_size,
            int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)), self.config_hash,
        )  # fmt: skip
        applied = MemoryCap(None, None)
        if cap is not None:
            applied = MemoryCap(cap.gib, cap.baseline_gib, cap.held_gib, cap.nccl_gib)
        timing, peak = comm_timing(ctx.device, point_settings), DevicePeak(**self.peak.as_json())
        meta = replace(found, seed=settings.seed, memory=applied, alloc_conf=alloc_conf(), comm_timing=timing,
                       peak=peak, workload=metadata.workload_settings(settings))  # fmt: skip
        run_record.start(self.folder, meta, tuple(what_changed), restarted)
        self.mllog.submission(
            meta, self.workload_name, settings.workflow.value, ctx.topology.cp, settings.seed
        )
        if meta.ranks_per_device > 1:
            LOG.warning(
                "oversubscribed: %s; walltimes and the comm share are not meaningful",
                meta.oversubscribed.removeprefix("yes (").removesuffix(")"),
            )

    def point_settings(self) -> PointSettings:
        """How every point of the run is measured, from the settings (the time budget may trim its
        repeats: a new PointSettings, never this one changed)."""
        settings = self.settings
        measured = PointSettings(
            timing=replace(settings.timing), cap=self.cap, fault=Fault(settings.fault),
            agree_wait_s=settings.dist.agree_timeout_s, seed=settings.seed,
            counts_comm=traits(self.workload).counts_comm,
            profile_comm=settings.measure.profile_comm, progress=self.heartbeat.step,
        )  # fmt: skip
        # Runs compared with each other take the same steps (training moves the weights).
        return measured.fixed() if settings.mode is Mode.accuracy else measured
