"""Phases timed inside the step (cpbench/core/phases.py): the timer itself, their reduction over
ranks and repeats, and the real job's step the report builds from them (the fold model's trunk pass
and sampling step measured through `python -m cpbench`: tests/e2e/test_phases_runs.py)."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from support.settings import settings

from cpbench.core import phases
from cpbench.core.phases import phase, slowest_median_ms, timing
from cpbench.preview.changes import what_changed
from cpbench.record.run_record import Change, RunRecord
from cpbench.report.markdown import render
from cpbench.workloads.fold import FoldWorkload

CPU = torch.device("cpu")


def test_phases_nest_and_a_recursive_phase_counts_once():
    with timing(CPU) as timer:
        for _ in range(2):
            with phase("outer"):
                time.sleep(0.02)
                with phase("inner"), phase("inner"):  # re-entered while open: one span
                    time.sleep(0.01)
    assert {name: len(spans) for name, spans in timer.spans.items()} == {"outer": 2, "inner": 2}
    seconds = timer.per_pass()
    assert 0.01 <= seconds["inner"] < seconds["outer"]
    assert seconds["outer"] >= 0.03  # the outer pass includes the inner one


def test_phase_is_a_no_op_outside_a_timed_step_and_a_failed_span_is_not_recorded():
    assert phases._active is None
    with phase("trunk"):
        pass
    with timing(CPU) as outer:
        with timing(CPU) as inner, pytest.raises(RuntimeError), phase("trunk"):
            raise RuntimeError("out of memory")
        assert phases._active is outer  # the outer timer is back
        with phase("trunk"):
            pass
    assert phases._active is None
    assert inner.spans == {} and list(outer.spans) == ["trunk"]


def test_phases_reduce_as_walltime_slowest_rank_per_repeat_then_median():
    rank0 = [{"trunk": 0.010, "sampling_step": 0.002}, {"trunk": 0.030, "sampling_step": 0.002}]
    rank1 = [{"trunk": 0.020, "sampling_step": 0.004}, {"trunk": 0.020}]  # no sampling step in repeat 2
    assert slowest_median_ms([rank0, rank1]) == pytest.approx({"trunk": 25.0})
    assert slowest_median_ms([[{"trunk": 0.001}], [{"trunk": 0.003}]]) == pytest.approx({"trunk": 3.0})
    assert slowest_median_ms([[], []]) == {}


def test_a_cuda_timer_records_events_without_waiting_inside_the_step():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    device = torch.device("cuda")
    a = torch.randn(1024, 1024, device=device)
    with timing(device) as timer:
        for _ in range(3):
            with phase("matmul"):
                a = a @ a / 1024
    torch.cuda.synchronize(device)
    assert all(isinstance(start, torch.cuda.Event) for start, _ in timer.spans["matmul"])
    assert timer.per_pass()["matmul"] > 0


def _changes() -> tuple[Change, ...]:
    """fold_small's what-changed rows against AF3's inference."""
    structured = OmegaConf.structured(settings("workload=fold_small"))
    return tuple(what_changed(OmegaConf.to_container(structured, resolve=True, enum_to_str=True),
                              FoldWorkload.real_job))  # fmt: skip


def _row(**measured: float) -> dict:
    return dict(kind="point", status="ok", N_tokens=64, N_atoms=576, MSA_depth=16, walltime_iqr_ms=1.0,
                comm_ms=1.0, config_hash="x", workload="fold", workflow="inference", dtype="float32",
                topology="1d", cp=2, grid="2x1", n_cycles=1, sampling_steps=4, **measured)  # fmt: skip


def test_the_report_gives_the_real_jobs_step_as_a_formula_of_the_phases():
    changes = _changes()
    frame = pd.DataFrame([_row(walltime_ms=50.0, trunk_ms=20.0, sampling_step_ms=5.0)])
    text = render(frame, RunRecord(what_changed=changes))
    # 1 x 20 + 4 x 5 ms measured, 10 ms rest; AF3 runs 11 trunk passes and 200 sampling steps
    formula = "11 trunk passes x 20 ms + 200 sampling steps x 5 ms + 10 ms rest = **1.23 s**"
    assert f"- cp=2, N_tokens=64: {formula} (the measured step ran 1 and 4 of them: 50 ms)" in text
    assert "at most" not in text
    frame = pd.DataFrame([_row(walltime_ms=50.0, sampling_step_ms=5.0)])  # no trunk_ms
    text = render(frame, RunRecord(what_changed=changes))
    assert "trunk passes were not timed apart (trunk_ms blank), so the real job's step is not" in text


def test_the_estimate_is_at_the_largest_n_of_each_layout():
    rows = [_row(walltime_ms=50.0, trunk_ms=20.0, sampling_step_ms=5.0), {**_row(walltime_ms=9.0,
            trunk_ms=4.0, sampling_step_ms=1.0), "N_tokens": 32}, {**_row(walltime_ms=80.0, trunk_ms=30.0,
            sampling_step_ms=10.0), "cp": 4, "topology": "2d", "grid": "2x2"}]  # fmt: skip
    text = render(pd.DataFrame(rows), RunRecord(what_changed=_changes()))
    estimates = [line for line in text.splitlines() if "trunk passes x" in line]
    assert [line.split(":")[0] for line in estimates] == ["- cp=2 1d, N_tokens=64", "- cp=4 2d, N_tokens=64"]
    assert "+ 10 ms rest = **1.23 s**" in estimates[0] and "+ 10 ms rest = **2.34 s**" in estimates[1]


def test_a_loop_the_real_job_runs_as_often_is_part_of_the_rest():
    changes = tuple(c for c in _changes() if c.setting != "workload.n_cycles")
    frame = pd.DataFrame([_row(walltime_ms=50.0, trunk_ms=20.0, sampling_step_ms=5.0)])
    text = render(frame, RunRecord(what_changed=changes))
    assert "1 trunk passes x 20 ms + 200 sampling steps x 5 ms + 10 ms rest = **1.03 s**" in text
