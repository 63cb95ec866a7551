"""The top-level loop of one rank: its runtime, its session, then its phases in turn."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from cpbench.core import DoesNotFit
from cpbench.measure.cap import lift_cap
from cpbench.measure.memory import set_alloc_conf
from cpbench.measure.oom import KernelFault
from cpbench.measure.point import OutOfMemoryAlone
from cpbench.models.pairformer import chunking
from cpbench.probe.trace import TraceSpec
from cpbench.rank.budget import budget_spent, fit_probe, fit_work, probe_step_over
from cpbench.rank.convergence import converge
from cpbench.rank.points import Measurer, measure_points
from cpbench.rank.probe import run_probe_phase
from cpbench.rank.session import RankSession, broadcast
from cpbench.rank.spec import RunSpec, walltime_points
from cpbench.record import metadata, run_record
from cpbench.record.mllog import constants
from cpbench.report.single import write_report
from cpbench.results.folder import RunFolder
from cpbench.results.row import shape_key
from cpbench.runtime import logs
from cpbench.runtime.logs import LOG
from cpbench.runtime.rank import rank_runtime
from cpbench.runtime.seed import deterministic
from cpbench.settings.schema import Mode, Workflow
from cpbench.workloads.base import Workload


def run_rank(
    spec: RunSpec, workload: Workload | None = None, relaunch: Callable[[], None] | None = None
) -> None:
    """One rank. `workload` is the one the launching process already built, when it is this rank.
    `relaunch` starts the ranks again after this one ran out of memory alone or met a kernel fault,
    where no launching process does (a SLURM job requeues itself); it runs once that N is recorded."""
    settings = spec.settings
    traced = TraceSpec.of(settings)  # the precision, backend and cap the estimate traces this rank with
    torch.set_float32_matmul_precision(settings.matmul_precision)  # set every run: a process may run many
    deterministic(settings.mode is Mode.accuracy)  # before CUDA starts: it sets the cuBLAS workspace
    # Before CUDA starts: the allocator reads it once (a GPU rank's default: expandable segments).
    set_alloc_conf(settings.memory.alloc_conf, gpu=traced.autocast_device == "cuda")
    d = settings.dist
    runtime = rank_runtime(spec.topology, d.backend, d.timeout_s, traced.dtype, settings.seed, d.cpu_threads,
                           socket_ifname=d.socket_ifname)  # fmt: skip
    with runtime as ctx:
        ctx.data_path = settings.data.path
        # Agreement and result reductions run on their own CPU group, apart from the workload's.
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=d.timeout_s))
        folder = RunFolder(broadcast(spec.output_dir, control))  # rank 0 decides, the others follow
        logs.setup(ctx.rank, settings.log.all_ranks, folder.rank_log(ctx.rank))
        try:
            session = RankSession.open(
                settings, ctx, control, folder, workload or instantiate(settings.workload)
            )
            baseline = RunFolder(spec.reference_dir) if spec.reference_dir and session.lead else None
            # `auto` chunks sized for the memory cap as set, as the fake-tensor estimate sizes them: not as
            # measured (free memory differs by rank on a GPU, and so would the chunks and collectives).
            chunks = chunking.sized_for(traced.chunk_cap_gib)
            with session.heartbeat, session.mllog, chunks:
                try:
                    _run(session, spec, baseline)
                finally:
                    # Whatever ended the run, what follows is not capped; but after a kernel fault a GPU's
                    # context is dead and takes no more calls (older torch asks cudaMemGetInfo to lift it:
                    # CUDACachingAllocator.cpp `setMemoryFraction`).
                    if ctx.device.type != "cuda" or not isinstance(sys.exc_info()[1], KernelFault):
                        lift_cap(ctx.device)
        except Exception as err:
            # Record the root cause before teardown: once this rank leaves, its peers fail too, and
            # the launcher must be able to tell which rank failed first and why.
            ErrorHandler().record_exception(err)
            if isinstance(err, (OutOfMemoryAlone, DoesNotFit, KernelFault)) and ctx.world_size > 1:
                # Its peers are stuck in a collective it will never join, and tearing down the process
                # group would wait for them (after a kernel fault, on a dead CUDA context): leave at
                # once, and the launcher ends them too.
                if relaunch is not None and isinstance(err, (OutOfMemoryAlone, KernelFault)):
                    recorded = "oom" if isinstance(err, OutOfMemoryAlone) else "a kernel fault"
                    LOG.warning("%s; recorded as %s, the ranks restart to go on", err, recorded)
                    relaunch()
                logging.shutdown()
                os._exit(1)
            raise


def _run(session: RankSession, spec: RunSpec, baseline: RunFolder | None) -> None:
    settings, folder = session.settings, session.folder
    session.mllog.start(constants.INIT_START)
    if session.lead and (again := folder.point_in_flight.resume(spec.max_restarts)):
        LOG.warning("N=%s was in flight when the last run stopped: measured again", again["N_tokens"])
    point_settings = session.point_settings()
    session.record_start(spec.what_changed, point_settings, spec.restart > 0)
    measurer = Measurer.open(session, baseline)
    session.mllog.end(constants.INIT_STOP)
    session.mllog.start(constants.RUN_START)
    if settings.workflow is Workflow.convergence:
        converge(measurer, point_settings, baseline)
        return
    done = frozenset(session.broadcast(folder.done_keys(session.config_hash) if session.lead else None))
    todo = [shape for shape in walltime_points(settings) if shape_key("point", shape) not in done]
    work = fit_work(measurer, todo, point_settings, spec.prediction, spec.restart)
    if work is None:  # the time budget refused it: nothing runs
        return
    # With no estimate the points run as set until the budget is spent; the probe stops short of it always.
    bound = work.deadline if work.clock is None else None
    points = measure_points(measurer, work.points, work.point_settings, spec.prediction, work.warmed, done,
                            spent=lambda: budget_spent(session, bound))  # fmt: skip
    if settings.probe.enabled:
        probe = fit_probe(measurer, work, spec.prediction, points.largest)
        over = probe_step_over(session, work.deadline, probe.warmup)
        run_probe_phase(measurer, probe, work.point_settings, spec, points.done, over)
    lift_cap(session.ctx.device)  # the cap is for the measured steps: the report is not one of them
    if session.lead:
        # When it ended, so that a merge can tell runs that overlapped on one host.
        planned = run_record.read(folder).time_budget
        if planned is not None and planned.planned_at is not None:  # the estimate's error, shown
            planned = replace(planned, took_s=time.time() - planned.planned_at)
        run_record.update(folder, time_budget=planned, finished=metadata.now())
        LOG.info("report: %s", write_report(folder.root))
