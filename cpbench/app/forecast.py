"""The time model's two commands (docs/predict.md): `python -m cpbench.calibrate`, a run whose points
then calibrate the machine's figures (calibration.yaml), and `python -m cpbench.forecast`, which
predicts step and job times from figures without starting a rank (forecast.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import date
from typing import Any

import pandas as pd
import torch
from hydra.utils import instantiate

from cpbench.app.invocation import Invocation
from cpbench.app.measure import measure
from cpbench.core import ConfigError, Shape, Topology
from cpbench.probe.trace import TraceSpec
from cpbench.record.metadata import cpu_model
from cpbench.report.forecast import against_table, forecast_table, planning_table
from cpbench.results.folder import RunFolder
from cpbench.results.pooled import pooled_comm_ops, pooled_results, run_folders
from cpbench.runtime.fresh_process import call_in_fresh_process
from cpbench.runtime.rank import threads_per_rank
from cpbench.settings.schema import BenchConfig
from cpbench.steptime.calibrate import CommPoint, calibrated
from cpbench.steptime.hardware import hardware_text, load_hardware
from cpbench.steptime.predicted import Target, forecast_at, phase_scales, smallest_fit
from cpbench.steptime.timed_steps import at_run_speed, time_ops
from cpbench.workloads.base import Workload


def _say(line: str) -> None:
    print(f"cpbench: {line}", file=sys.stderr)


def calibrate(call: Invocation) -> int:
    """`python -m cpbench.calibrate`: the run, then each op timed in real steps at the run's N, the
    link fitted to the collectives the run measured, the figures written to calibration.yaml and
    shown beside the run's own steps. The calibration runs in a fresh process: this one forked the
    run's ranks, and real steps and the count's backward would initialise CUDA here
    (cpbench/runtime/fresh_process.py)."""
    if not call.run.launcher.starts_runs:
        print("cpbench: error: python -m cpbench.calibrate starts its own ranks: run it without torchrun",
              file=sys.stderr)  # fmt: skip
        return 2
    code = measure(call)
    return code or call_in_fresh_process(_calibrate, str(call.folder.root), call.run.settings)


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
    alone = {_shape(r): r.walltime_ms / 1e3 for r in ok.itertuples() if r.cp == 1}
    timed, ratios = at_run_speed(dict(zip(shapes, timed, strict=True)), alone)
    if ratios:
        _say(f"calibrate: the run's cp=1 steps over the steps here: {', '.join(f'{r:.3f}' for r in ratios)}")
    ops = pooled_comm_ops(runs)
    comm = [CommPoint(o.calls, o.fwd_bytes + o.bwd_bytes, o.seconds) for o in ops.itertuples() if o.cp > 1]
    spec = TraceSpec.of(settings)  # the run's cap, and the device its ranks ran on
    if spec.autocast_device == "cpu":  # a device is a rank's share of the cores
        threads = threads_per_rank(settings.dist.cpu_threads, settings.topology.cp)
        name, devices = f"{cpu_model()}, {threads} thread(s) a rank", max(1, (os.cpu_count() or 1) // threads)
    else:
        name, devices = str(ok["device"].iloc[0]), torch.cuda.device_count()
    pooled = f", each step the median of {len(runs)} runs" if len(runs) > 1 else ""
    source = (f"python -m cpbench.calibrate, {date.today().isoformat()}: {workload_name(settings)} at N="
              f"{', '.join(str(s.n_tokens) for s in shapes)}{pooled}")  # fmt: skip
    hw = calibrated(name, timed, comm, devices, settings.dtype.value, spec.chunk_cap_gib, source)
    check = _against(settings, workload, spec, Target(hw, hw.devices_per_node), ok)
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


def _against(
    settings: BenchConfig, workload: Workload, spec: TraceSpec, target: Target, rows: pd.DataFrame
) -> list[str]:
    """Each measured row of a run beside its prediction, the real job's step left out: the error the
    figures make there."""
    measured, target = [], replace(target, scales=None)
    for r in rows.sort_values(["topology", "cp", "N_tokens"]).itertuples():
        grid = [int(x) for x in str(r.grid).split("x")] if r.topology == "2d" else None
        topology = Topology.from_config(r.topology, int(r.cp), grid)
        cap = r.budget_gib if pd.notna(r.budget_gib) else None  # the row's cap (results column): its chunks
        at_cap = replace(spec, chunk_cap_gib=cap)
        measured.append((r, forecast_at(settings, workload, topology, int(r.N_tokens), at_cap, target)))
    return against_table(measured)


def forecast(call: Invocation) -> int:
    """`python -m cpbench.forecast`: the predicted steps at forecast.n_tokens x forecast.cp, the
    measured rows of forecast.against beside theirs, and the planning table; printed and kept in
    forecast.md. No rank starts."""
    folder, settings, workload = call.folder, call.run.settings, call.run.workload
    f = settings.forecast
    try:
        if f.hardware is None:
            raise ConfigError("forecast.hardware: name a preset (h100_sxm, ...) or a calibration file")
        hw = load_hardware(f.hardware)
        ranks_per_node = f.ranks_per_node or hw.devices_per_node
        cps = f.cp or [settings.topology.cp]
        topologies = [Topology.from_config(settings.topology.kind, cp, None) for cp in cps]
        against = run_folders("forecast.against", f.against) if f.against else []
        spec = TraceSpec.of(settings, hw.memory_gib)  # the cap: memory.budget_gib, else the device's memory
        if f.plan_n_tokens and spec.chunk_cap_gib is None:
            raise ConfigError("forecast.plan_n_tokens: the planning table needs a per-rank cap: set "
                              "memory.budget_gib (the figures name no memory_gib)")  # fmt: skip
    except ConfigError as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        return 2
    target = Target(hw, ranks_per_node, phase_scales({c.setting: c.scale for c in call.changes if c.scale}))
    try:
        text = _forecast_text(settings, workload, spec, target, topologies, against)
    except ValueError as err:  # figures the machine does not have (a link between nodes)
        print(f"cpbench: error: {err} (forecast.ranks_per_node: the ranks a node)", file=sys.stderr)
        return 2
    folder.write_text(folder.forecast, text)
    print(text, end="")
    return 0


def _forecast_text(
    settings: BenchConfig,
    workload: Workload,
    spec: TraceSpec,
    target: Target,
    topologies: Sequence[Topology],
    against: Sequence[RunFolder],
) -> str:
    f, hw = settings.forecast, target.hw
    lines = [f"# Forecast: {workload_name(settings)}, {settings.workflow.value}, {settings.dtype.value}", "",
             f"Figures: {hw.name} ({f.hardware}); {target.ranks_per_node} ranks a node, "
             f"{hw.devices_per_node} devices a node."]  # fmt: skip
    if hw.dtype != settings.dtype.value:
        lines.append(f"Caution: the figures are for {hw.dtype}, the run computes in {settings.dtype.value}.")
    forecasts = []
    for topology in topologies:
        for n in f.n_tokens or settings.sweep.n_tokens:
            _say(f"forecast: counting {topology.kind} cp={topology.cp} at N={n}")
            forecasts.append(forecast_at(settings, workload, topology, n, spec, target))
    lines += ["", "## Predicted step", "", *forecast_table(forecasts)]
    if target.scales is None:
        lines += ["", "The real job runs a loop cpbench does not time apart: its step is not estimated."]
    if against:
        pooled = f" (each point's median over {len(against)} runs)" if len(against) > 1 else ""
        measured = pooled_results(against)
        rows = _against(settings, workload, spec, target, measured) if not measured.empty else []
        lines += ["", f"## Against the measured rows of {f.against}{pooled}", "",
                  *(rows or ["No point of these runs was measured ok."])]  # fmt: skip
    if f.plan_n_tokens:
        fits = [smallest_fit(settings, workload, n, kind, spec, target, _say)
                for n in f.plan_n_tokens for kind in ("1d", "2d")]  # fmt: skip
        cap = f"{spec.chunk_cap_gib:g} GiB a rank"
        lines += ["", f"## Planning table ({cap}, CP sizes up to {f.plan_max_cp})", "",
                  *planning_table(fits)]  # fmt: skip
    return "\n".join(lines) + "\n"
