"""The plots beside the report, linked ({alt text: file})."""

from __future__ import annotations


def lines(plots: dict[str, str]) -> list[str]:
    return ["", "## Plots", "", *(f"![{alt}]({path})" for alt, path in plots.items())] if plots else []
