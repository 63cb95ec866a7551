"""Rank 0's records of what the ranks measure: the point in flight, its communication ops, its row
checked against the cp=1 run (mode=accuracy) and written, and its mllog event; the max-fit row. The
other ranks record nothing."""

from __future__ import annotations

from dataclasses import replace

from cpbench.checks import accuracy
from cpbench.core import Shape
from cpbench.measure.point import PointResult
from cpbench.rank.session import RankSession
from cpbench.record.mllog import MAX_FIT, POINT
from cpbench.results.folder import RunFolder
from cpbench.results.row import ResultRow
from cpbench.runtime.logs import LOG
from cpbench.settings.cp1 import cp1_settings
from cpbench.settings.identity import config_hash
from cpbench.settings.schema import Mode


class Recorder:
    def __init__(self, session: RankSession, baseline: RunFolder | None = None):
        self.session = session
        # rank 0, mode=accuracy: the cp=1 rows each point is checked against
        self.reference = None
        if session.lead and baseline is not None and session.settings.mode is Mode.accuracy:
            self.reference = accuracy.reference_rows(baseline, config_hash(cp1_settings(session.settings)))

    def start(self, row: ResultRow) -> None:
        """The point in flight: a crash while it runs is its answer."""
        if self.session.lead:
            self.session.folder.point_in_flight.start(row.as_dict())

    def point(self, shape: Shape, row: ResultRow, result: PointResult) -> None:
        """A walltime point measured: its row written, in place of its in-flight mark."""
        s = self.session
        if not s.lead:
            return
        if result.comm_ops:
            s.folder.append_comm_ops([{**row.as_dict(), **op} for op in result.comm_ops])
        measured = row.with_measured(result)
        if self.reference is not None and result.status == "ok":
            rtol = accuracy.tolerance(s.settings)
            status, error = accuracy.check_point(measured.as_dict(), self.reference.get(row.key), rtol)
            measured = row.with_measured(replace(result, status=status, error=error))
            if error:
                LOG.warning("N=%d: %s", shape.n_tokens, error)
        s.folder.point_in_flight.finish(measured.as_dict())
        s.mllog.event(POINT, result.walltime_ms, metadata=measured.as_dict())
        LOG.info("N=%d atoms=%d S=%d: %s", shape.n_tokens, shape.n_atoms, shape.msa_depth, _summary(result))

    def max_fit(self, row: ResultRow) -> None:
        """The probe's answer: the largest N that fits."""
        s = self.session
        if s.lead:
            answer = row.as_dict()
            s.folder.point_in_flight.finish(answer)
            s.mllog.event(MAX_FIT, answer["N_tokens"], metadata=answer)


def _summary(result: PointResult) -> str:
    if result.status != "ok":
        return f"{result.status} ({result.error}), peak {result.peak_mem_gib:.3f} GiB"
    comm = "not seen" if result.comm_ms is None else f"{result.comm_ms:.2f} ms"
    checksum = "none" if result.checksum is None else f"{result.checksum:.9e}"
    return (
        f"{result.walltime_ms:.2f} ms (IQR {result.walltime_iqr_ms:.2f}), comm {comm}, "
        f"peak {result.peak_mem_gib:.3f} GiB, checksum {checksum}"
    )
