"""The time model's two commands (docs/predict.md): `python -m cpbench.calibrate`, a run whose points
then calibrate the machine's figures (calibration.yaml), and `python -m cpbench.forecast`, which
predicts step and job times from figures without starting a rank (forecast.md)."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Sequence
from datetime import date
from typing import Any

import pandas as pd
import torch
from hydra.utils import instantiate

from cpbench.core import ConfigError, Shape, Topology
from cpbench.measure.cap import cap_gib
from cpbench.record.metadata import cpu_model
from cpbench.record.run_record import Change
from cpbench.report.cells import table
from cpbench.results.folder import RunFolder
from cpbench.results.pooled import pooled_comm_ops, pooled_results, run_folders
from cpbench.runtime.fresh_process import call_in_fresh_process
from cpbench.runtime.rank import device_type, pick_backend, threads_per_rank
from cpbench.settings.schema import BenchConfig
from cpbench.steptime.calibrate import CommPoint, calibrated
from cpbench.steptime.hardware import hardware_text, load_hardware
from cpbench.steptime.model import Hardware
from cpbench.steptime.predicted import Forecast, SmallestFit, forecast_at, phase_scales, smallest_fit
from cpbench.steptime.timed_steps import time_ops
from cpbench.workloads.base import Workload


def _say(line: str) -> None:
    print(f"cpbench: {line}", file=sys.stderr)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "not estimated"
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def calibrate(folder: RunFolder, settings: BenchConfig) -> int:
    """After the run: each op timed in real steps at the run's N, the link fitted to the
    collectives the run measured, the figures written to calibration.yaml and shown beside the
    run's own steps. In a fresh process: this one forked the run's ranks, and real steps and the
    count's backward would initialise CUDA here (cpbench/runtime/fresh_process.py)."""
    return call_in_fresh_process(_calibrate, str(folder.root), settings)


def _calibrate(root: str, settings: BenchConfig) -> int:
    folder, workload = RunFolder(root), instantiate(settings.workload)
    pool = settings.forecast.pool
    runs = run_folders("forecast.pool", pool, [folder.root]) if pool else [folder]
    ok = pooled_results(runs)
    if ok.empty:
        _say("calibrate: the run measured no step that fits: nothing to calibrate on")
        return 1
    shapes = sorted({_shape(r) for r in ok.itertuples()}, key=lambda s: s.n_tokens)
    timed = time_ops(settings, workload, shapes, _say)
    # The op-timed steps ran in one minute, the run's over many: one factor, the median over N of
    # the run's cp=1 step over this process's plain step, takes them to the run's speed.
    alone = {_shape(r): r.walltime_ms / 1e3 for r in ok.itertuples() if r.cp == 1}
    ratios = [alone[s] / t.step_s for s, t in zip(shapes, timed, strict=True) if s in alone]
    drift = statistics.median(ratios) if ratios else 1.0
    if ratios:
        _say(f"calibrate: the run's cp=1 steps over the steps here: {', '.join(f'{r:.3f}' for r in ratios)}")
    timed = [t.scaled_to(t.step_s * drift) for t in timed]
    ops = pooled_comm_ops(runs)
    comm = [CommPoint(o.calls, o.fwd_bytes + o.bwd_bytes, o.seconds) for o in ops.itertuples() if o.cp > 1]
    on = device_type(pick_backend(settings.dist.backend))
    if on == "cpu":  # a device is a rank's share of the cores
        threads = threads_per_rank(settings.dist.cpu_threads, settings.topology.cp)
        name, devices = f"{cpu_model()}, {threads} thread(s) a rank", max(1, (os.cpu_count() or 1) // threads)
    else:
        name, devices = str(ok["device"].iloc[0]), torch.cuda.device_count()
    pooled = f", each step the median of {len(runs)} runs" if len(runs) > 1 else ""
    source = (f"python -m cpbench.calibrate, {date.today().isoformat()}: {workload_name(settings)} at N="
              f"{', '.join(str(s.n_tokens) for s in shapes)}{pooled}")  # fmt: skip
    hw = calibrated(name, timed, comm, devices, settings.dtype.value, cap_gib(settings.memory, on), source)
    check = _against(settings, workload, hw, hw.devices_per_node, ok)
    notes = [f"The time model's figures for {name} (docs/predict.md), fitted by {source}.",
             "Each op's fixed cost (kernel_s) and rate (per_s: FLOPs or bytes a second) from its timed runs;",
             "the link from the run's collectives (comm_ops.csv)." if comm else "No CP run: no link figures.",
             "The run's own steps against the figures:", *check]  # fmt: skip
    folder.write_text(folder.calibration, hardware_text(hw, notes))
    print("\n".join(check))
    print(f"calibration: {folder.calibration}")
    return 0


def _shape(row: Any) -> Shape:
    """A results row's shape."""
    samples = None if pd.isna(row.diffusion_samples) else int(row.diffusion_samples)
    return Shape(int(row.N_tokens), int(row.N_atoms), int(row.MSA_depth), samples)


def workload_name(settings: BenchConfig) -> str:
    return settings.workload_preset or "the workload"


def _against(settings: BenchConfig, workload: Workload, hw: Hardware, ranks_per_node: int,
             rows: pd.DataFrame) -> list[str]:  # fmt: skip
    """Each measured row of a run beside its prediction: the error the figures make there."""
    body = []
    for r in rows.sort_values(["topology", "cp", "N_tokens"]).itertuples():
        grid = [int(x) for x in str(r.grid).split("x")] if r.topology == "2d" else None
        topology = Topology.from_config(r.topology, int(r.cp), grid)
        budget = r.budget_gib if pd.notna(r.budget_gib) else None  # the row's cap: its chunks
        predicted = forecast_at(
            settings, workload, topology, int(r.N_tokens), hw, ranks_per_node, None, budget
        )
        s = predicted.seconds
        measured = r.walltime_ms / 1e3
        comm = "" if pd.isna(r.comm_ms) else _ms(r.comm_ms / 1e3)
        error = f"{s.total / measured - 1:+.1%}"
        where = f"{r.topology} cp={r.cp}"
        body.append(
            (
                where,
                r.N_tokens,
                _ms(measured),
                comm,
                _ms(s.total),
                _ms(s.comm_total),
                error,
                f"{predicted.shared:g}",
                f"{r.runs} ({r.walltime_spread:.0%})" if r.runs > 1 else "1",
            )
        )
    return table(["topology", "N_tokens", "measured step", "measured comm", "predicted step",
                  "predicted comm", "error", "ranks per device", "runs (spread)"], body)  # fmt: skip


def forecast(folder: RunFolder, settings: BenchConfig, workload: Workload, changes: Sequence[Change]) -> int:
    """The predicted steps at forecast.n_tokens x forecast.cp, the measured rows of
    forecast.against beside theirs, and the planning table; printed and kept in forecast.md."""
    f = settings.forecast
    try:
        if f.hardware is None:
            raise ConfigError("forecast.hardware: name a preset (h100_sxm, ...) or a calibration file")
        hw = load_hardware(f.hardware)
        ranks_per_node = f.ranks_per_node or hw.devices_per_node
        cps = f.cp or [settings.topology.cp]
        topologies = [Topology.from_config(settings.topology.kind, cp, None) for cp in cps]
        against = run_folders("forecast.against", f.against) if f.against else []
    except ConfigError as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        return 2
    budget = settings.memory.budget_gib or hw.memory_gib or cap_gib(settings.memory, "cpu")
    scales = phase_scales({c.setting: c.scale for c in changes if c.scale})
    try:
        text = _forecast_text(settings, workload, hw, ranks_per_node, topologies, budget, scales, against)
    except ValueError as err:  # figures the machine does not have (a link between nodes)
        print(f"cpbench: error: {err} (forecast.ranks_per_node: the ranks a node)", file=sys.stderr)
        return 2
    folder.write_text(folder.forecast, text)
    print(text, end="")
    return 0


def _forecast_text(
    settings: BenchConfig,
    workload: Workload,
    hw: Hardware,
    ranks_per_node: int,
    topologies: Sequence[Topology],
    budget: float,
    scales: dict[str, float] | None,
    against: Sequence[RunFolder],
) -> str:
    f = settings.forecast
    lines = [f"# Forecast: {workload_name(settings)}, {settings.workflow.value}, {settings.dtype.value}", "",
             f"Figures: {hw.name} ({f.hardware}); {ranks_per_node} ranks a node, "
             f"{hw.devices_per_node} devices a node."]  # fmt: skip
    if hw.dtype != settings.dtype.value:
        lines.append(f"Caution: the figures are for {hw.dtype}, the run computes in {settings.dtype.value}.")
    forecasts = []
    for topology in topologies:
        for n in f.n_tokens or settings.sweep.n_tokens:
            _say(f"forecast: counting {topology.kind} cp={topology.cp} at N={n}")
            forecasts.append(forecast_at(settings, workload, topology, n, hw, ranks_per_node, scales, budget))
    lines += ["", "## Predicted step", "", *_forecast_table(forecasts)]
    if scales is None:
        lines += ["", "The real job runs a loop cpbench does not time apart: its step is not estimated."]
    if against:
        pooled = f" (each point's median over {len(against)} runs)" if len(against) > 1 else ""
        measured = pooled_results(against)
        rows = _against(settings, workload, hw, ranks_per_node, measured) if not measured.empty else []
        lines += ["", f"## Against the measured rows of {f.against}{pooled}", "",
                  *(rows or ["No point of these runs was measured ok."])]  # fmt: skip
    if f.plan_n_tokens:
        fits = [smallest_fit(settings, workload, n, kind, hw, ranks_per_node, budget, scales, _say)
                   for n in f.plan_n_tokens for kind in ("1d", "2d")]  # fmt: skip
        lines += ["", f"## Planning table ({budget:g} GiB a rank, CP sizes up to {f.plan_max_cp})", "",
                  *_planning_table(fits)]  # fmt: skip
    return "\n".join(lines) + "\n"


def _forecast_table(forecasts: Sequence[Forecast]) -> list[str]:
    body = []
    for fc in forecasts:
        s = fc.seconds
        held, comm_held = s.dominant("compute"), s.dominant("comm")
        where, share = f"{fc.topology.kind} cp={fc.topology.cp}", f"{s.comm_total / s.total:.0%}"
        compute, comm = _ms(s.total - s.comm_total), _ms(s.comm_total)
        comm_op = comm_held[0] if comm_held[1] else ""
        body.append(
            (
                where,
                fc.n_tokens,
                _ms(s.total),
                compute,
                comm,
                share,
                held[0],
                comm_op,
                _ms(fc.job_s),
                f"{fc.shared:g}",
            )
        )
    return table(["topology", "N_tokens", "step", "compute", "comm", "comm share", "compute held by",
                  "comm held by", "real job's step", "ranks per device"], body)  # fmt: skip


def _planning_table(fits: Sequence[SmallestFit]) -> list[str]:
    body = []
    for p in fits:
        if p.forecast is None:
            body.append((p.n_tokens, p.kind, "none fits", "", "", "", ""))
            continue
        fc = p.forecast
        s, at = fc.seconds, f"cp={fc.topology.cp} ({fc.topology.label})"
        share = f"{s.comm_total / s.total:.0%}"
        body.append((fc.n_tokens, p.kind, at, f"{p.peak_gib:.1f}", _ms(s.total), _ms(fc.job_s), share))
    return table(["N_tokens", "topology", "smallest CP size that fits", "peak GiB a rank", "step",
                  "real job's step", "comm share"], body)  # fmt: skip
