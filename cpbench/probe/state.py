"""The probe's persisted state: every N tried, and the N in flight. Written atomically after every
N, so that a rerun, a torchrun restart or a SLURM requeue continues where the probe stopped."""

from __future__ import annotations

import dataclasses

import pandas as pd

from cpbench.probe.search import Trial, answered
from cpbench.results.flight import Flight
from cpbench.results.folder import RepeatedCrash, RunFolder
from cpbench.results.row import KERNEL


class ProbeState:
    """`config_hash` None takes whatever configuration the folder holds (to abandon its N in flight)."""

    def __init__(self, folder: RunFolder, config_hash: str | None = None):
        self.folder = folder
        saved = folder.read_json(folder.probe_state) or {}
        self.config_hash = saved.get("config_hash") if config_hash is None else config_hash
        self.trials: list[Trial] = []
        self.flight = Flight()  # the N in flight, counted by the rule every in-flight mark follows
        if saved and saved["config_hash"] == self.config_hash:  # another configuration starts afresh
            self.trials = [Trial(**t) for t in saved["trials"]]
            self.flight = Flight.read(saved)

    @property
    def in_flight(self) -> int | None:
        return self.flight.item

    @property
    def interrupted(self) -> bool:
        """The N in flight was stopped by a signal, not by a crash."""
        return self.flight.interrupted

    def resume_in_flight(self, max_restarts: int) -> int | None:
        """The N in flight when the last run died, to be tried again: a kill, a preemption or an
        interrupt says nothing about whether it fits (only out of memory does). An N that has crashed
        more than `max_restarts` times raises RepeatedCrash: it is never a max-fit edge."""
        n = self.in_flight
        if n is None:
            return None
        self.flight = self.flight.resume()
        self._save()
        if self.flight.crashed_too_often(max_restarts):
            raise RepeatedCrash(
                f"probe: N={n} crashed {self.flight.crashes} time(s) with no out-of-memory cause "
                f"(the launcher restarts at most {max_restarts} time(s)); it is not a max-fit edge: "
                f"see {self.folder.logs}, or cap the probe below it with probe.max_tokens"
            )
        return n

    def close_oom(self) -> int | None:
        """The N in flight ran out of memory on one rank alone (the run ended for it): does not fit."""
        n = self.in_flight
        if n is not None:
            self.finish(Trial(n=n, fits=False, status="oom"))
        return n

    def close_kernel(self, n: int) -> None:
        """A kernel faulted at `n`, the N in flight (the rank's CUDA context is dead; the run ends for
        it): recorded as `kernel`, which bounds the search as a failure does, so that no N from it up is
        tried again. Nothing, when another N is in flight."""
        if self.in_flight == n:
            self.finish(Trial(n=n, fits=False, status="error", failure=KERNEL))

    def kernel_fault(self, n: int) -> bool:
        """Whether `n` is recorded as a kernel fault."""
        return any(t.n == n and t.failure == KERNEL for t in self.trials)

    def interrupt(self) -> int | None:
        """Mark the N in flight as interrupted (not counted as a crash); it is tried again."""
        if self.in_flight is not None:
            self.flight = self.flight.interrupt()
            self._save()
        return self.in_flight

    def start(self, n: int) -> None:
        self.flight = self.flight.start(n, n == self.in_flight)
        self._save()

    def clear_in_flight(self) -> None:
        """The N in flight ended with no answer to record (the time budget's step at the probe's start,
        which fit: the probe steps it under its own cap)."""
        self.flight = Flight()
        self._save()

    def add_points(self, trials: list[Trial]) -> None:
        """Walltime points the probe takes as trials (`point=True`), kept in probe.csv beside its own
        steps, each its N's answer in place of any before it; the N in flight stays in flight."""
        for trial in trials:
            self.trials = answered(self.trials, trial)
        self._save()

    def finish(self, trial: Trial) -> None:
        """`trial` is its N's answer, in place of any before it."""
        self.trials = answered(self.trials, trial)
        self.flight = Flight()
        self._save()

    def _save(self) -> None:
        trials = [dataclasses.asdict(t) for t in self.trials]
        payload = {"config_hash": self.config_hash, "trials": trials, **self.flight.as_json()}
        self.folder.write_json(self.folder.probe_state, payload)
        columns = [
            "n",
            "fits",
            "status",
            "peak_gib",
            "peak_min_gib",
            "predicted_gib",
            "seconds",
            "guided",
            "point",
            "failure",
        ]
        names = {"n": "N_tokens", "peak_gib": "max_peak_gib", "peak_min_gib": "min_peak_gib",
                 "predicted_gib": "predicted_peak_gib"}  # fmt: skip
        frame = pd.DataFrame(trials, columns=columns).rename(columns=names)
        self.folder.write_text(self.folder.probe_csv, frame.to_csv(index=False))
