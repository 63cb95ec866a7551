"""The probe's persisted state: every N tried, and the N in flight. Written atomically after every
N, so that a rerun, a torchrun restart or a SLURM requeue continues where the probe stopped."""

from __future__ import annotations

import dataclasses

import pandas as pd

from cpbench.probe.search import Trial
from cpbench.results.folder import RunFolder


class ProbeState:
    """`config_hash` None takes whatever configuration the folder holds (to abandon its N in flight)."""

    def __init__(self, folder: RunFolder, config_hash: str | None = None):
        self.folder = folder
        saved = folder.read_json(folder.probe_state) or {}
        self.config_hash = saved.get("config_hash") if config_hash is None else config_hash
        self.trials: list[Trial] = []
        self.in_flight: int | None = None
        if saved and saved["config_hash"] == self.config_hash:  # another configuration starts afresh
            self.trials = [Trial(**t) for t in saved["trials"]]
            self.in_flight = saved["in_flight"]

    def close_in_flight(self) -> int | None:
        """An N in flight when the job died does not fit: record it as crashed, never retry it."""
        n = self.in_flight
        if n is not None:
            self.finish(Trial(n=n, fits=False, status="crashed"))
        return n

    def abandon(self) -> None:
        """Forget the N in flight: it was interrupted, not refused, and is tried again."""
        if self.in_flight is not None:
            self.in_flight = None
            self._save()

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
        self.folder.write_json(self.folder.probe_state, payload)
        columns = ["n", "fits", "status", "peak_gib", "seconds", "guided"]
        frame = pd.DataFrame(trials, columns=columns).rename(
            columns={"n": "N_tokens", "peak_gib": "max_peak_gib"}
        )
        self.folder.write_text(self.folder.probe_csv, frame.to_csv(index=False))
