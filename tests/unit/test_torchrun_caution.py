"""Under torchrun a rank out of memory alone spends one of --max-restarts (torch's agent counts every
failed worker group, cpbench/launch/torchrun.py): a probing run says so before its ranks start, with
the count torchrun gave its workers; nothing where no probe runs, no peer exists or no agent counts."""

from __future__ import annotations

import pytest

from cpbench.launch.torchrun import _restarts_left_to_findings


def test_a_probe_under_torchrun_is_told_its_restarts_count(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    line = _restarts_left_to_findings(probes=True, world_size=2)
    assert line and "--max-restarts (2 here)" in line and "out of memory alone" in line
    assert "run the same command again" in line and "docs/cluster.md" in line


@pytest.mark.parametrize(("probes", "world", "agent"), [(False, 2, True), (True, 1, True), (True, 2, False)])
def test_no_caution_where_no_lone_oom_restart_is_counted(monkeypatch, probes, world, agent):
    """No probe (points only: the caution is for the search past the edge), one rank (no peer waits),
    or no torch agent (a submitit job's tasks: TORCHELASTIC_MAX_RESTARTS unset)."""
    if agent:
        monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    else:
        monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    assert _restarts_left_to_findings(probes=probes, world_size=world) is None
