"""The run folder's owner: atomic writes, the point in flight, abandon and close_failed."""

from __future__ import annotations

import os

import pytest

from cpbench.app.outcome import close_failed
from cpbench.probe.in_flight import InFlight
from cpbench.probe.search import Trial
from cpbench.probe.state import ProbeState
from cpbench.results.folder import RepeatedCrash, RunFolder

ROW = {"workload": "axial_mix", "workflow": "inference", "topology": "1d", "cp": 2, "grid": "2x1",
       "N_tokens": 16, "N_atoms": 144, "MSA_depth": 16, "dtype": "float32", "kind": "point",
       "config_hash": "abc"}  # fmt: skip


def test_atomic_write_leaves_no_temporary_and_a_plain_mode(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.write_json(folder.run_json, {"cp": 2})
    assert folder.read_json(folder.run_json) == {"cp": 2}
    assert sorted(p.name for p in folder.root.iterdir()) == ["run.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert folder.run_json.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_file(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_json(folder.run_json, {"cp": 2})
    with pytest.raises(TypeError):
        folder.write_json(folder.run_json, {"cp": object()})  # not JSON: fails mid-write
    assert folder.read_json(folder.run_json) == {"cp": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_in_flight_finish_close_and_abandon(tmp_path):
    folder = RunFolder(tmp_path)
    flight = folder.point_in_flight
    assert flight.row() is None and flight.close("crashed", "x") is None
    flight.start(ROW)
    assert flight.row() == ROW
    flight.abandon()  # interrupted, not broken: no row, measured again
    assert flight.row() is None and not folder.results.exists()
    flight.start(ROW)
    closed = flight.close("crashed", "the run died")
    assert closed["status"] == "crashed" and flight.row() is None
    frame = folder.read_results()
    assert list(frame["status"]) == ["crashed"] and list(frame["config_hash"]) == ["abc"]
    assert folder.done_keys("abc") == {"point:16:144:16"} and folder.done_keys("other") == set()


def test_probe_state_interrupt_keeps_the_trials_and_retries_the_n(tmp_path):
    folder = RunFolder(tmp_path)
    state = ProbeState(folder, "abc")
    state.finish(Trial(n=64, fits=True, status="ok", peak_gib=0.1))
    state.start(128)
    ProbeState(folder).interrupt()  # as a SLURM requeue does, without knowing the config
    again = ProbeState(folder, "abc")
    assert again.interrupted and [t.n for t in again.trials] == [64]
    assert again.resume_in_flight(max_restarts=0) == 128  # tried again, not counted as a crash
    assert ProbeState(folder, "other").trials == []  # another configuration starts afresh


def test_one_record_over_the_point_and_the_probe_n_in_flight(tmp_path):
    folder = RunFolder(tmp_path)
    work = InFlight(folder)
    assert work.where() is None and work.interrupt() is None
    probe = ProbeState(folder, "abc")
    probe.start(256)
    folder.point_in_flight.start(ROW)
    assert work.interrupt() == "N=16"  # the point is named first; both are marked at once
    assert folder.point_in_flight.resume(max_restarts=0) == ROW  # a signal is no crash: measured again
    assert ProbeState(folder, "abc").resume_in_flight(max_restarts=0) == 256
    # Crashes count by one rule for both: a run that dies at the item without a signal is one.
    with pytest.raises(RepeatedCrash, match="crashed 1 time"):
        folder.point_in_flight.resume(max_restarts=0)
    assert list(folder.read_results()["status"]) == ["crashed"]  # the point, recorded as crashed
    with pytest.raises(RepeatedCrash, match="probe: N=256 crashed 1 time"):
        ProbeState(folder, "abc").resume_in_flight(max_restarts=0)
    # Out of memory on one rank alone closes both: the point as oom, the N as not fitting.
    folder.point_in_flight.start({**ROW, "N_tokens": 32})
    assert work.where() == "N=32"
    work.close_oom("rank 1: out of memory")
    assert list(folder.read_results()["status"]) == ["crashed", "oom"] and work.where() is None
    assert [(t.n, t.fits, t.status) for t in ProbeState(folder, "abc").trials] == [(256, False, "oom")]


def test_close_failed_records_the_point_the_report_and_the_failure(tmp_path):
    folder = RunFolder(tmp_path)
    folder.point_in_flight.start(ROW)
    close_failed(folder, 2, "error", "rank 1 failed: RuntimeError: boom", 1, "Traceback ...")
    assert list(folder.read_results()["status"]) == ["error"]
    failure = folder.read_failure()
    assert failure["exit_code"] == 1 and failure["cp"] == 2 and failure["error"].startswith("rank 1 failed")
    assert folder.report.exists() and folder.point_in_flight.row() is None
    close_failed(folder, 2, "error", "a later consequence", first=True)
    assert folder.read_failure()["error"].startswith("rank 1 failed")  # the first cause is kept
    folder.clear_failure()
    assert folder.read_failure() is None
