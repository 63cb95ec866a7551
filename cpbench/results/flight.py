"""The one rule for what a run folder holds in flight (a walltime point, a probe's N): the item, how
many runs died at it with no out-of-memory cause, and whether a signal stopped the last run (a kill,
a preemption or Ctrl-C says nothing about whether it fits: it is measured again, not counted)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Flight:
    item: Any = None  # None: nothing in flight
    crashes: int = 0
    interrupted: bool = False

    @classmethod
    def read(cls, saved: Mapping[str, Any]) -> Flight:
        """From the fields a state file keeps it in (beside others of its own)."""
        return cls(saved.get("in_flight"), saved.get("crashes", 0), saved.get("interrupted", False))

    def as_json(self) -> dict[str, Any]:
        return {"in_flight": self.item, "crashes": self.crashes, "interrupted": self.interrupted}

    def start(self, item: Any, same: bool) -> Flight:
        """`item` in flight; starting the same item again keeps its count of crashes."""
        return Flight(item, self.crashes if same else 0, False)

    def interrupt(self) -> Flight:
        """Stopped by a signal: measured again, not counted as a crash."""
        return self if self.item is None else replace(self, interrupted=True)

    def resume(self) -> Flight:
        """A new run takes the item up again: the last run crashed at it unless a signal stopped it."""
        return Flight(self.item, self.crashes + (0 if self.interrupted else 1), False)

    def crashed_too_often(self, max_restarts: int) -> bool:
        return self.crashes > max_restarts
