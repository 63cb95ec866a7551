"""What a run was measuring when it stopped, over both of its in-flight marks: the walltime point
(state.json, `RunFolder.point_in_flight`) and the probe's N (probe_state.json, `ProbeState`). A signal, a
requeue, an out-of-memory alone or a kernel fault ends whichever was in flight; callers say so here once."""

from __future__ import annotations

from cpbench.probe.state import ProbeState
from cpbench.results.folder import RunFolder
from cpbench.results.row import KERNEL, OOM


class InFlight:
    """Whichever of the run's two marks is in flight."""

    def __init__(self, folder: RunFolder):
        self.folder = folder

    def where(self) -> str | None:
        """The point or probe N being measured, as a person reads it."""
        if row := self.folder.point_in_flight.row():
            return f"N={row['N_tokens']}"
        if (n := ProbeState(self.folder).in_flight) is not None:
            return f"probe N={n}"
        return None

    def interrupt(self) -> str | None:
        """Stopped by a signal (Ctrl-C, SIGTERM, a requeue): whatever was in flight is measured again
        and not counted as a crash. Returns where it stopped."""
        where = self.where()
        self.folder.point_in_flight.interrupt()
        ProbeState(self.folder).interrupt()
        return where

    def close_oom(self, error: str) -> None:
        """One rank ran out of memory alone and the run ends for it: the point in flight is recorded
        as oom, the probe's N as not fitting."""
        self.folder.point_in_flight.close("oom", error, OOM)
        ProbeState(self.folder).close_oom()

    def close_kernel(self, n_tokens: int, error: str) -> bool:
        """A kernel faulted on this rank at N=`n_tokens` and the run ends for it: the point in flight is
        recorded as `error` of class `kernel`, the probe's N as a kernel fault. Whether N stands
        recorded so, by this rank or by a peer that faulted first; False (nothing was in flight at N)
        means a restart would meet the same fault again."""
        point = self.folder.point_in_flight
        if (row := point.row()) is not None and int(row["N_tokens"]) == n_tokens:
            point.close("error", error, KERNEL)
        state = ProbeState(self.folder)
        state.close_kernel(n_tokens)
        if state.kernel_fault(n_tokens):
            return True
        rows = self.folder.read_results()
        if rows.empty or "failure" not in rows.columns:
            return False
        return bool(((rows["N_tokens"] == n_tokens) & (rows["failure"] == KERNEL)).any())
