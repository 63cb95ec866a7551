"""The published results (docs/cp_benchmark.md and .csv) are today's: they carry every column results.csv
has now, in its order, every plot a report draws, and the command that made them; the README links
to them rather than keeping figures of its own."""

from __future__ import annotations

import re
from pathlib import Path

from cpbench.results.row import COLUMNS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_published_table_has_todays_columns_in_their_order():
    header = (DOCS / "cp_benchmark.csv").read_text().splitlines()[0].split(",")
    assert [c for c in header if c in COLUMNS] == COLUMNS, sorted(set(COLUMNS) - set(header))


def test_the_published_report_has_every_plot_and_its_command():
    text = (DOCS / "cp_benchmark.md").read_text()
    for plot in ("cp_benchmark_max_n.png", "cp_benchmark_walltime.png", "cp_benchmark_mfu.png"):
        assert f"]({plot})" in text and (DOCS / plot).exists(), plot
    assert re.search(r"Measured with `python -m cpbench[^`]*` from a fresh clone at [0-9a-f]{7}", text)


def test_the_readme_links_the_published_results():
    assert "[docs/cp_benchmark.md](docs/cp_benchmark.md)" in (ROOT / "README.md").read_text()
