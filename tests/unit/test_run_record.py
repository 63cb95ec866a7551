"""run.json through its one module: typed sections, one section replaced at a time, and a run.json
written by an earlier version still read where the code reads one (a cached baseline, a plan's
finished run, a report, a merge)."""

from __future__ import annotations

import json

from cpbench.app.baseline import refusal
from cpbench.preview.changes import budget_rows
from cpbench.record import run_record
from cpbench.record.run_record import (
    Change,
    ConvergenceSummary,
    Footprint,
    MemoryCap,
    RepeatCheck,
    RunMetadata,
    RunRecord,
    TimeBudget,
)
from cpbench.report.merge import collect
from cpbench.report.single import write_report
from cpbench.results.folder import RunFolder

# As cpbench wrote run.json before the NVML metadata, SMT and comm timing (e714ab7~1) and before the
# time budget's second estimate: no smt, comm_timing or GPU state; a time budget of line, cuts, refusal.
OLD_RUN_JSON = {
    "date": "2026-01-01 00:00:00 UTC", "host": "box", "device": "NVIDIA H100 80GB HBM3", "device_count": 8,
    "cpu_cores": 64, "backend": "nccl", "torch": "2.13.0", "cuda": "12.8", "topology": "1d", "cp": 2,
    "grid": "2x1", "world_size": 2, "clocks_locked": "unknown", "devices_shared": "no",
    "ranks_per_device": 0.25, "oversubscribed": "no", "config_hash": "c0ffee", "commit": "0123abc",
    "seed": 0, "budget_gib": None, "baseline_gib": None,
    "what_changed": [{"what": "N_tokens", "benchmark": "sweep 64", "real": "2048",
                      "setting": "sweep.n_tokens", "why": "N sets memory"}],
    "time_budget": {"line": "plan: 1 point", "cuts": [], "refusal": "the plan needs 40 min of 8"},
    "finished": "2026-01-01 00:05:00 UTC",
}  # fmt: skip
ROW = {"workload": "axial_mix", "workflow": "inference", "topology": "1d", "cp": 2, "grid": "2x1",
       "N_tokens": 64, "N_atoms": 576, "MSA_depth": 16, "dtype": "float32", "status": "ok", "kind": "point",
       "walltime_ms": 10.0, "walltime_iqr_ms": 0.1, "peak_mem_gib": 1.0, "config_hash": "c0ffee"}  # fmt: skip


def _old_folder(tmp_path) -> RunFolder:
    folder = RunFolder(tmp_path / "old")
    folder.write_json(folder.run_json, {**OLD_RUN_JSON, "a_key_no_longer_written": [1, 2]})
    folder.append_results([ROW])
    return folder


def test_a_run_json_of_an_earlier_version_reads_as_typed_fields(tmp_path):
    folder = _old_folder(tmp_path)
    record = run_record.read(folder)
    meta = record.metadata
    assert (meta.device, meta.cp, meta.clocks_locked, meta.ranks_per_device) == ("NVIDIA H100 80GB HBM3", 2,
                                                                                 "unknown", 0.25)  # fmt: skip
    assert meta.smt is None and meta.comm_timing is None and meta.gpu_driver is None  # not recorded then
    assert meta.memory == MemoryCap(None, None)  # recorded: no cap
    assert record.what_changed == (Change("N_tokens", "sweep 64", "2048", "sweep.n_tokens", "N sets memory"),)
    assert record.time_budget == TimeBudget("plan: 1 point", (), "the plan needs 40 min of 8")
    assert record.time_budget.probe_line is None and record.convergence is None
    # Where the code reads it: a cached baseline's refusal, a plan's finished run, the report, a merge.
    assert refusal(folder) == "the plan needs 40 min of 8"
    assert run_record.is_finished(folder)
    text = write_report(folder.root, plots=False).read_text()
    assert "| clocks locked | unknown |" in text and "| memory budget GiB (per rank) |  |" in text
    assert "SMT" not in text and "comm ms measured by" not in text
    assert "- refused: the plan needs 40 min of 8" in text
    [run] = collect([folder.root]).runs
    assert run.cp == 2 and run.record.finished == "2026-01-01 00:05:00 UTC"


def test_update_replaces_one_section_and_keeps_the_rest(tmp_path):
    folder = _old_folder(tmp_path)
    run_record.update(folder, footprint=Footprint((), "nothing left behind"))
    raw = json.loads(folder.run_json.read_text())
    assert raw["footprint"] == {"left": [], "line": "nothing left behind"}
    sections = ("what_changed", "time_budget")  # rewritten with the fields they lacked as defaults
    assert {k: raw[k] for k in OLD_RUN_JSON if k not in sections} == {
        k: v for k, v in OLD_RUN_JSON.items() if k not in sections
    }
    assert raw["what_changed"] == [{**OLD_RUN_JSON["what_changed"][0], "limitation": False, "scale": None}]
    assert raw["time_budget"] == {
        **OLD_RUN_JSON["time_budget"], "probe_line": None, "took_s": None, "estimate_s": None,
        "planned_at": None, "restarts": [],
    }  # fmt: skip
    assert "a_key_no_longer_written" not in raw  # the record writes only what it knows
    assert [p.name for p in folder.root.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_a_record_reads_back_as_written(tmp_path):
    folder = RunFolder(tmp_path)
    meta = RunMetadata(host="box", cp=4, gpu_processes="unknown (NVML: gone)", memory=MemoryCap(0.5, 0.27))
    run_record.start(
        folder, meta, (Change("dtype", "float32", "bfloat16", "dtype", "precision", scale=None),)
    )
    walltime = {"min": 1.0, "max": 1.1, "spread": 0.1, "relative": 0.1}
    point = {"N_tokens": 16, "N_atoms": 144, "MSA_depth": 16, "walltime_ms": walltime}
    spread = {"runs": 2, "tolerance": {"walltime_ms": 0.1}, "points": [point]}
    run_record.update(folder, repeat_check=RepeatCheck.from_json(spread), finished="later")
    run_record.update(folder, convergence=ConvergenceSummary("key", 3, reference="ref.csv", match=True))
    record = run_record.read(folder)
    assert record.metadata == meta and record.finished == "later"
    assert record.repeat_check.points[0].figures["walltime_ms"].relative == 0.1
    assert json.loads(folder.run_json.read_text())["repeat_check"] == spread  # the same JSON as before
    assert RunRecord.from_json(record.to_json()) == record
    assert record.convergence.match and record.convergence.reference == "ref.csv"


def test_a_restart_of_the_run_keeps_its_time_budget_and_a_new_run_does_not(tmp_path):
    folder, asked = RunFolder(tmp_path), (Change("dtype", "float32", "bfloat16", "dtype", "precision"),)
    run_record.start(folder, RunMetadata(host="box"), asked)
    cuts = ("timing.repeats 5 -> 3 (the floor is budget.min_repeats=3)",)
    planned = TimeBudget("plan: 3 point(s)", cuts, planned_at=1e9, restarts=("restart 1, 4 min left",))
    run_record.update(folder, what_changed=asked + tuple(budget_rows(cuts)), time_budget=planned)
    run_record.start(folder, RunMetadata(host="box2"), asked, restarted=True)
    record = run_record.read(folder)
    assert record.metadata.host == "box2" and record.time_budget == planned
    assert record.what_changed == asked + tuple(budget_rows(cuts))  # the cut's row stays with its plan
    assert RunRecord.from_json(record.to_json()) == record
    run_record.start(folder, RunMetadata(host="box3"), asked)  # a new command into the same folder
    assert run_record.read(folder) == RunRecord(RunMetadata(host="box3"), asked)
    run_record.update(folder, time_budget=planned, finished="then")
    run_record.start(folder, RunMetadata(host="box4"), asked, restarted=True)  # the run had ended
    assert run_record.read(folder) == RunRecord(RunMetadata(host="box4"), asked)


def test_no_run_json_or_a_torn_one_is_an_empty_record(tmp_path):
    folder = RunFolder(tmp_path)
    assert run_record.read(folder) == RunRecord() and not run_record.is_finished(folder)
    folder.run_json.write_text('{"cp": 2, "ho')
    assert run_record.read(folder) == RunRecord()
