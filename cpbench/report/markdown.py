"""cp_benchmark.md: the table a person reads, with the run's metadata and a readout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from cpbench.report import metadata
from cpbench.results.store import RESULTS_CSV, read_results, write_atomically

REPORT_MD = "cp_benchmark.md"

_TABLE = {
    "kind": "kind", "workload": "workload", "workflow": "workflow", "topology": "topology", "cp": "cp",
    "N_tokens": "N_tokens", "N_atoms": "N_atoms", "MSA_depth": "MSA", "dtype": "dtype", "status": "status",
    "walltime_ms": "walltime ms (median)", "walltime_iqr_ms": "IQR ms", "tokens_per_s": "tokens/s",
    "comm_ms": "comm ms", "peak_mem_gib": "peak GiB (max rank)", "checksum": "checksum",
}  # fmt: skip

_META = [
    ("date", "date"), ("host", "host"), ("device", "device"), ("device_count", "device count"),
    ("cpu_cores", "CPU cores"), ("backend", "backend"), ("torch", "torch"), ("cuda", "CUDA"),
    ("topology", "topology"), ("cp", "cp"), ("grid", "grid"), ("world_size", "ranks"),
    ("clocks_locked", "clocks locked"), ("devices_shared", "devices shared"),
    ("config_hash", "config hash"), ("commit", "project commit"),
]  # fmt: skip


def _fmt(value: Any, digits: int = 6) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float) and digits > 6:
        return f"{value:.{digits}g}"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.6e}"
    return str(value)


def readout(frame: pd.DataFrame) -> str:
    """Max N at each CP size against cp=1, and whether compute or communication dominates."""
    if frame.empty:
        return "No point was measured."
    sentences = []
    fits = frame[(frame["kind"] == "max-fit") & (frame["status"] == "ok")]
    if not fits.empty:
        best = fits.groupby("cp")["N_tokens"].max()
        base = best.get(1)
        for cp, n in best.items():
            if cp == 1:
                sentences.append(f"At cp=1 the largest N_tokens that fits is {n}.")
            elif base:
                sentences.append(
                    f"At cp={cp} the largest N_tokens that fits is {n}, {n / base:.2f}x the cp=1 "
                    f"baseline of {base} (ideal for N^2 memory: {cp**0.5:.2f}x)."
                )
            else:
                sentences.append(
                    f"At cp={cp} the largest N_tokens that fits is {n}; no cp=1 baseline was run."
                )
    ok = frame[(frame["status"] == "ok") & frame["walltime_ms"].notna() & (frame["walltime_ms"] > 0)]
    if not ok.empty:
        share = float((ok["comm_ms"].fillna(0) / ok["walltime_ms"]).median())
        bound = "communication" if share > 0.5 else "compute"
        sentences.append(
            f"Time in collectives is {share:.0%} of walltime (median over points): the run is {bound}-bound."
        )
    failed = frame[frame["status"] != "ok"]
    if not failed.empty:
        sentences.append(
            f"{len(failed)} point(s) did not finish: "
            + "; ".join(f"N={r.N_tokens} {r.status}" for r in failed.itertuples())
            + "."
        )
    return " ".join(sentences)


def render(frame: pd.DataFrame, meta: dict[str, Any], title: str = "cpbench results") -> str:
    lines = [f"# {title}", "", "## Run", "", "| | |", "|---|---|"]
    lines += [f"| {label} | {_fmt(meta.get(key, ''))} |" for key, label in _META if key in meta]
    lines += ["", "## Results", ""]
    if frame.empty:
        lines.append("No rows.")
    else:
        cols = [c for c in _TABLE if c in frame.columns]
        lines.append("| " + " | ".join(_TABLE[c] for c in cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for row in frame[cols].itertuples(index=False):
            # Checksums keep enough digits to tell two runs apart.
            cells = (_fmt(v, 12 if c == "checksum" else 6) for c, v in zip(cols, row, strict=True))
            lines.append("| " + " | ".join(cells) + " |")
        errors = frame[frame["error"].fillna("") != ""] if "error" in frame.columns else frame.iloc[0:0]
        if not errors.empty:
            lines += ["", "Errors:", ""]
            lines += [f"- N={r.N_tokens} ({r.status}): {r.error}" for r in errors.itertuples()]
    lines += ["", "## Readout", "", readout(frame), ""]
    return "\n".join(lines)


def write_report(output_dir: Path) -> Path:
    """Render `cp_benchmark.md` from results.csv and run.json in `output_dir`."""
    frame = read_results(output_dir / RESULTS_CSV)
    path = output_dir / REPORT_MD
    write_atomically(path, render(frame, metadata.read(output_dir)))
    return path
