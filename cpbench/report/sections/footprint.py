"""What the run left behind outside its folder (`cpbench.checks.footprint`)."""

from __future__ import annotations

from cpbench.record.run_record import Footprint


def lines(footprint: Footprint | None) -> list[str]:
    if footprint is None:
        return []
    return ["", "## Left behind", "", footprint.line[:1].upper() + footprint.line[1:] + "."]
