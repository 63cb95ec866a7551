"""The probe's persisted state: every N tried, and the N in flight. Written atomically after every
N, so that a rerun, a torchrun restart or a SLURM requeue continues where the probe stopped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from cpbench.probe.search import Trial
from cpbench.results.store import write_atomically

PROBE_JSON = "probe_state.json"
PROBE_CSV = "probe.csv"


class ProbeState:
    def __init__(self, output_dir: Path, config_hash: str):
        self.path, self.csv = output_dir / PROBE_JSON, output_dir / PROBE_CSV
        self.config_hash = config_hash
        self.trials: list[Trial] = []
        self.in_flight: int | None = None
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            if saved["config_hash"] == config_hash:  # another configuration starts afresh
                self.trials = [Trial(**t) for t in saved["trials"]]
                self.in_flight = saved["in_flight"]

    def close_in_flight(self) -> int | None:
        """An N in flight when the job died does not fit: record it as crashed, never retry it."""
        n = self.in_flight
        if n is not None:
            self.finish(Trial(n=n, fits=False, status="crashed"))
        return n

    def start(self, n: int) -> None:
        self.in_flight = n
        self._save()

    def finish(self, trial: Trial) -> None:
        self.trials.append(trial)
        self.in_flight = None
        self._save()

    def _save(self) -> None:
        trials = [dataclasses.asdict(t) for t in self.trials]
        payload = {"config_hash": self.config_hash, "trials": trials, "in_flight": self.in_flight}
        write_atomically(self.path, json.dumps(payload, indent=1) + "\n")
        columns = ["n", "fits", "status", "peak_gib", "seconds", "guided"]
        frame = pd.DataFrame(trials, columns=columns).rename(
            columns={"n": "N_tokens", "peak_gib": "max_peak_gib"}
        )
        write_atomically(self.csv, frame.to_csv(index=False))
