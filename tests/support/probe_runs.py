"""The probe's settings in the tests (`PROBE`; `FAULT`: a rank out of memory at N=256) and the checks of
a probe's records: its trials (`probe_trials`), its max-fit row (`max_fit`), and that the two agree
(`check_consistent`)."""

from __future__ import annotations

import pandas as pd

from support.processes import TIMING, results

PROBE = ["sweep.n_tokens=[16]", "probe.enabled=true", "probe.start=64", "probe.granularity=64", *TIMING]


def probe_trials(out) -> pd.DataFrame:
    """probe.csv as read back: `failure` is text, blank on a fit (read alone it would be float)."""
    return pd.read_csv(out / "probe.csv", dtype={"failure": "string"})


def max_fit(out) -> pd.Series:
    frame = results(out)
    rows = frame[frame["kind"] == "max-fit"]
    assert len(rows) == 1
    return rows.iloc[0]


def check_consistent(out, granularity=64):
    trials = probe_trials(out)
    assert trials["N_tokens"].is_unique
    row = max_fit(out)
    fits, fails = trials[trials["fits"]], trials[~trials["fits"]]
    assert row["status"] == "ok" and row["N_tokens"] == fits["N_tokens"].max()
    assert row["oom_at"] == fails["N_tokens"].min() and row["oom_at"] - row["N_tokens"] <= granularity
    assert (fits["N_tokens"] < fails["N_tokens"].min()).all()
    return row, trials


# A rank runs out of memory at N=256 (where the fault strikes: the test adds fault.where).
FAULT = ["topology.cp=2", *PROBE, "memory.cpu_budget_gib=1", "probe.measure_at_max=false", "fault.rank=1",
         "fault.at_n=256"]  # fmt: skip
