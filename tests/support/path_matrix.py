"""The path matrix of the user-paths issue: runs through `python -m cpbench` (the cheapest workload)
crossing workflow x layout x baseline x mode x probe, each cell checked for its exit code, its report
and its checksums against its own cp=1 rows.

The whole cross is 3 x 3 x 2 x 2 x 2 cells; these nine cover every pair of two factors' values where
the pair applies (convergence has no probe and no accuracy mode; cp=1 has no baseline), so that a
crossing that breaks shows in at least one cell:

| cell | workflow | layout | baseline | mode | probe |
|---|---|---|---|---|---|
| inf_1d_base | inference | 1d cp=2 | on | speed (adaptive steps) | on |
| inf_2d_acc | inference | 2d 2x2 | off | accuracy | off |
| inf_cp1 | inference | cp=1 | - | speed | on |
| inf_1d_alone | inference | 1d cp=2 | off | speed | on |
| train_2d_base | training | 2d 2x2 | on | speed (adaptive steps) | on |
| train_1d_acc | training | 1d cp=2 | on | accuracy | off |
| train_cp1_acc | training | cp=1 | - | accuracy | off |
| conv_2d_base | convergence | 2d 2x2 | on | speed | - |
| conv_1d_alone | convergence | 1d cp=2 | off | speed | - |
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from support.processes import TIMING, cpbench, results

SWEEP = ["sweep.n_tokens=[16,32]", "log.progress=false"]
PROBE = ["probe.enabled=true", "probe.start=16", "probe.granularity=16", "probe.max_tokens=48",
         "probe.measure_at_max=false"]  # fmt: skip
NO_PROBE = ["probe.enabled=false"]
ADAPTIVE = ["timing.warmup=1", "timing.repeats=2"]  # speed mode's caps (10) left as they are
LAYOUTS = {"cp1": ["topology.cp=1"], "1d": ["topology.cp=2"], "2d": ["topology.kind=2d", "topology.cp=4"]}
CONVERGENCE = ["workflow=convergence", "convergence.steps=3", "log.progress=false"]

CELLS = {
    "inf_1d_base": [*LAYOUTS["1d"], "baseline=true", *ADAPTIVE, *SWEEP, *PROBE],
    "inf_2d_acc": [*LAYOUTS["2d"], "mode=accuracy", *TIMING, *SWEEP, *NO_PROBE],
    "inf_cp1": [*LAYOUTS["cp1"], *TIMING, *SWEEP, *PROBE],
    "inf_1d_alone": [*LAYOUTS["1d"], *TIMING, *SWEEP, *PROBE],
    "train_2d_base": ["workflow=training", *LAYOUTS["2d"], "baseline=true", *ADAPTIVE, *SWEEP, *PROBE],
    "train_1d_acc": [
        "workflow=training",
        *LAYOUTS["1d"],
        "baseline=true",
        "mode=accuracy",
        *TIMING,
        *SWEEP,
        *NO_PROBE,
    ],  # fmt: skip
    "train_cp1_acc": ["workflow=training", *LAYOUTS["cp1"], "mode=accuracy", *TIMING, *SWEEP, *NO_PROBE],
    # An N with no published curve: compared with its baseline's (whose curve writes no result rows; with
    # a checkpoint every 2 of its 4 steps); and one with (docs/reference/).
    "conv_2d_base": [
        *CONVERGENCE,
        *LAYOUTS["2d"],
        "baseline=true",
        "shape.n_tokens=24",
        "convergence.steps=4",
        "checkpoint.every=2",
    ],
    "conv_1d_alone": [*CONVERGENCE, *LAYOUTS["1d"], "shape.n_tokens=32"],
}


@dataclass
class Cell:
    name: str
    proc: subprocess.CompletedProcess
    out: Path

    def rows(self) -> pd.DataFrame:
        frame = results(self.out)
        return frame.assign(source=frame["source"].astype(object).fillna("")) if "source" in frame else frame

    def measured(self) -> pd.DataFrame:
        """This run's own rows (not its baseline's)."""
        frame = self.rows()
        return frame[frame["source"] != "baseline"] if "source" in frame else frame

    def reference(self) -> pd.DataFrame:
        """The cp=1 rows it is compared with: its baseline's rows in its folder, else (mode=accuracy)
        the cp=1 reference run's in baseline/."""
        frame = self.rows()
        if "source" in frame and (frame["source"] == "baseline").any():
            return frame[frame["source"] == "baseline"]
        [folder] = (self.out / "baseline").iterdir()
        return results(folder)


def run_cell(name: str, root: Path) -> Cell:
    out = root / name
    proc = cpbench(*CELLS[name], f"output_dir={out}", cwd=root, timeout=300)
    return Cell(name, proc, out)


def assert_ran(cell: Cell) -> None:
    """Exit 0, no traceback; a report a person reads (a convergence run: its curve and plot)."""
    assert cell.proc.returncode == 0, f"{cell.name}: exit {cell.proc.returncode}\n{cell.proc.stderr}"
    assert "Traceback" not in cell.proc.stderr, cell.proc.stderr
    if cell.name.startswith("conv"):
        assert (cell.out / "convergence.csv").exists() and (cell.out / "convergence.png").exists()
        return
    report = (cell.out / "cp_benchmark.md").read_text()
    for section in ("## Run", "## What differs from the real job", "## Results", "## Readout", "## Plots"):
        assert section in report, (cell.name, section)
    assert set(cell.measured()["status"]) == {"ok"}, cell.measured()[["N_tokens", "kind", "status", "error"]]


def assert_checksums_match(points: pd.DataFrame, reference: pd.DataFrame, exact: bool = False) -> None:
    """Every walltime point's checksum (and in training loss) against the cp=1 row of its N."""
    points = points[points["kind"] == "point"].set_index("N_tokens")
    reference = reference[reference["kind"] == "point"].set_index("N_tokens")
    assert sorted(points.index) == sorted(reference.index) == [16, 32]
    for n in points.index:
        for column in ("checksum", "loss"):
            value, expected = points.loc[n, column], reference.loc[n, column]
            if pd.isna(expected):
                assert pd.isna(value), (n, column)
                continue
            assert value == expected if exact else math.isclose(value, expected, rel_tol=1e-5), (n, column)


def assert_readout_against_cp1(cell: Cell) -> None:
    """A baseline-on run with the probe: its readout gives max N against cp=1 and the ideal."""
    report = (cell.out / "cp_benchmark.md").read_text()
    assert "x cp=1; ideal sqrt(cp)" in report, report
