"""cp_benchmark.md: the table a person reads, with the run's metadata and a readout computed from the
rows. One run's report (written by the driver) and a sweep's merged report share the analysis here;
rows that measure different things (workload, workflow, dtype) are never put side by side."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from cpbench.results.folder import RunFolder
from cpbench.results.row import BASELINE

# Rows differing in any of these are different experiments: each gets its own tables, plots, readout.
LIKE_FOR_LIKE = ["workload", "workflow", "dtype"]
# Above this share of walltime in collectives, a run is communication-bound.
BOUND_SHARE = 0.5

_TABLE = {
    "kind": "kind", "workload": "workload", "workflow": "workflow", "topology": "topology", "cp": "cp",
    "input": "input", "chains": "chains", "N_tokens": "N_tokens", "N_atoms": "N_atoms", "MSA_depth": "MSA",
    "dtype": "dtype", "status": "status",
    "walltime_ms": "walltime ms (median)", "walltime_iqr_ms": "IQR ms", "tokens_per_s": "tokens/s",
    "comm_ms": "comm ms", "peak_mem_gib": "peak GiB (max rank)", "predicted_peak_gib": "predicted peak GiB",
    "checksum": "checksum", "seed": "seed",
    "config_hash": "config",
}  # fmt: skip

_META = [
    ("date", "date"), ("host", "host"), ("device", "device"), ("device_count", "device count"),
    ("cpu_cores", "CPU cores"), ("smt", "SMT (hyper-threads)"), ("backend", "backend"), ("torch", "torch"),
    ("cuda", "CUDA"),
    ("topology", "topology"), ("cp", "cp"), ("grid", "grid"), ("world_size", "ranks"),
    ("gpu_driver", "GPU driver"), ("sm_clocks_mhz", "SM clocks MHz"), ("clocks_locked", "clocks locked"),
    ("power_limit_w", "power limit W"), ("gpu_processes", "processes on the GPU"),
    ("devices_shared", "devices shared"),
    ("oversubscribed", "oversubscribed"), ("ranks_per_device", "ranks per GPU, or per CPU core"),
    ("seed", "seed"),
    ("comm_timing", "comm ms measured by"), ("config_hash", "config hash"),
    ("budget_gib", "memory budget GiB (per rank)"),
    ("baseline_gib", "start-up baseline GiB (rank 0)"), ("commit", "project commit"),
]  # fmt: skip
# A point whose IQR over repeats exceeds this share of its median walltime is noisy.
NOISY_IQR = 0.10


def _fmt(value: Any, digits: int = 6) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float) and digits > 6:
        return f"{value:.{digits}g}"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.6e}"
    return str(value)


def _cell(value: Any) -> str:
    """A table cell: no pipes or line breaks from error messages."""
    return _fmt(value).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]


def like_for_like(frame: pd.DataFrame) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """The groups of rows that may be compared, each keyed by (workload, workflow, dtype), and by the
    input file where rows have one (two complexes of one size are different experiments)."""
    if frame.empty:
        return []
    keys = [c for c in LIKE_FOR_LIKE if c in frame.columns]
    if "input" in frame.columns and frame["input"].replace("", None).notna().any():
        keys.append("input")
    return [(key, group) for key, group in frame.groupby(keys, sort=False, dropna=False)]


def group_label(key: tuple[Any, ...]) -> str:
    return ", ".join(str(k) for k in key)


def ok_points(frame: pd.DataFrame) -> pd.DataFrame:
    """Walltime points that finished: the only rows whose times may be compared."""
    points = frame[(frame["kind"] == "point") & (frame["status"] == "ok")]
    return points[points["walltime_ms"].notna() & (points["walltime_ms"] > 0)]


def max_fit(frame: pd.DataFrame) -> pd.DataFrame:
    """Largest N_tokens that fits per (topology, cp), against cp=1 and against the ideal for memory
    growing as N^2 (N growing as sqrt(cp)). The cp=1 baseline is the same whatever the topology."""
    columns = ["topology", "cp", "grid", "max_n", "vs_cp1", "ideal", "note"]
    fits = frame[(frame["kind"] == "max-fit") & (frame["status"] == "ok")]
    if fits.empty:
        return pd.DataFrame(columns=columns)
    best = fits.loc[fits.groupby(["topology", "cp"], sort=True)["N_tokens"].idxmax()]
    base = best.loc[best["cp"] == 1, "N_tokens"].max()
    return pd.DataFrame(
        {
            "topology": best["topology"].to_numpy(),
            "cp": best["cp"].astype(int).to_numpy(),
            "grid": best["grid"].to_numpy() if "grid" in best else None,
            "max_n": best["N_tokens"].astype(int).to_numpy(),
            "vs_cp1": (best["N_tokens"] / base).to_numpy() if pd.notna(base) else math.nan,
            "ideal": [math.sqrt(cp) for cp in best["cp"]],
            "note": [_fit_note(r) for r in best.itertuples()],
        }
    ).sort_values(["cp", "topology"], ignore_index=True)


def _fit_note(row: Any) -> str:
    """Where the probe stopped: the first N that did not fit (`oom_at`), else any note it left."""
    oom_at = getattr(row, "oom_at", None)
    if oom_at is not None and pd.notna(oom_at):
        return f"N={int(oom_at)} does not fit"
    error = getattr(row, "error", None)
    return "" if error is None or pd.isna(error) else str(error)


def comm_share(frame: pd.DataFrame) -> pd.DataFrame:
    """Median share of walltime spent in collectives per (topology, cp), over the measured points. One
    rank has no collectives (a blank is 0); above it a blank is not known, and left out."""
    ok = ok_points(frame)
    comm = ok["comm_ms"].astype(float)
    comm = comm.where(ok["cp"] > 1, comm.fillna(0))
    ok = ok.assign(share=comm / ok["walltime_ms"].astype(float)).dropna(subset=["share"])
    if ok.empty:
        return pd.DataFrame(columns=["topology", "cp", "share", "points"])
    grouped = ok.groupby(["topology", "cp"], sort=True)["share"]
    return pd.DataFrame({"share": grouped.median(), "points": grouped.size()}).reset_index()


def walltime_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Walltime (ms, median over repeats of the slowest rank) of each input size, one column per
    (topology, cp, grid); several rows of one cell (reruns) give their median."""
    ok = ok_points(frame)
    if ok.empty:
        return pd.DataFrame()
    table = ok.pivot_table(
        index=["N_tokens", "N_atoms", "MSA_depth"],
        columns=["topology", "cp", "grid"],
        values="walltime_ms",
        aggfunc="median",
    )
    return table.sort_index(axis=1, level=[1, 0])


def _series_label(topology: str, cp: int, grid: str, grids: bool) -> str:
    return f"{topology} cp={cp}" + (f" ({grid})" if grids else "")


def _max_n_sentences(frame: pd.DataFrame) -> list[str]:
    fits = max_fit(frame)
    if fits.empty:
        return ["Max N_tokens was not probed here (no max-fit rows; probe.enabled=true measures it)."]
    several = fits["topology"].nunique() > 1
    parts = []
    for r in fits.itertuples():
        where = f"cp={r.cp}" + (f" {r.topology}" if several and r.cp > 1 else "")
        if r.cp == 1 or pd.isna(r.vs_cp1):
            parts.append(f"{r.max_n} at {where}")
        else:
            parts.append(f"{r.max_n} at {where} ({r.vs_cp1:.2f}x cp=1; ideal sqrt(cp) = {r.ideal:.2f}x)")
    sentences = ["Largest N_tokens that fits: " + "; ".join(parts) + "."]
    if fits["vs_cp1"].isna().all():
        sentences.append(
            "No cp=1 baseline was run, so the gain from CP is not known (baseline=true measures one)."
        )
    else:
        top = fits[fits["cp"] == fits["cp"].max()].sort_values("vs_cp1").iloc[-1]
        if top.cp > 1:
            sentences.append(
                f"At cp={top.cp} that is {top.vs_cp1 / top.ideal:.0%} of the ideal growth for memory "
                "growing as N^2."
            )
    return sentences


def _comm_sentences(frame: pd.DataFrame) -> list[str]:
    ok = ok_points(frame)
    unseen = sorted(ok.loc[(ok["cp"] > 1) & ok["comm_ms"].isna(), "cp"].unique())
    note = (
        [
            "Time in collectives is not known at "
            + ", ".join(f"cp={cp}" for cp in unseen)
            + ": the model's collectives bypass cpbench's ledger (`measure.profile_comm=true` measures "
            "them with the torch profiler)."
        ]
        if unseen
        else []
    )
    shares = comm_share(frame)
    if shares.empty:
        return note
    largest = ok["cp"].max()
    at_largest = shares[shares["cp"] == largest]["share"]
    bound = None
    if not at_largest.empty:
        bound = "communication" if at_largest.max() > BOUND_SHARE else "compute"
    if len(shares) == 1:
        r = shares.iloc[0]
        verdict = f": the run is {bound}-bound." if bound else "."
        line = f"Time in collectives is {r.share:.0%} of walltime (median over {r.points} point(s))"
        return [line + verdict, *note]
    several = shares["topology"].nunique() > 1
    parts = [
        f"{r.share:.0%} at cp={r.cp}" + (f" {r.topology}" if several else "") for r in shares.itertuples()
    ]
    verdict = f"; at cp={largest} the run is {bound}-bound." if bound else "."
    line = "Time in collectives as a share of walltime (median over points): " + ", ".join(parts)
    return [line + verdict, *note]


def _speed_sentences(frame: pd.DataFrame) -> list[str]:
    """Walltime at the largest input measured at both the smallest and the largest CP size, then at
    every size they share."""
    ok = ok_points(frame)
    if ok["cp"].nunique() < 2:
        return []
    lo, hi = ok["cp"].min(), ok["cp"].max()
    size = ["N_tokens", "N_atoms", "MSA_depth"]
    common = ok[ok["cp"] == lo][size].merge(ok[ok["cp"] == hi][size]).drop_duplicates().sort_values(size)
    if common.empty:
        return []

    def times(n: int, atoms: int, msa: int) -> tuple[float, float, str]:
        at = ok[(ok["N_tokens"] == n) & (ok["N_atoms"] == atoms) & (ok["MSA_depth"] == msa)]
        t_lo, t_hi = at[at["cp"] == lo]["walltime_ms"].median(), at[at["cp"] == hi]["walltime_ms"].median()
        ratio = t_lo / t_hi
        return t_lo, t_hi, f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"

    n, atoms, msa = common.iloc[-1]
    t_lo, t_hi, how = times(n, atoms, msa)
    sentences = [
        f"At N_tokens={n}, walltime is {t_lo:.3g} ms at cp={lo} and {t_hi:.3g} ms at cp={hi} ({how})."
    ]
    if len(common) > 1:
        parts = [f"N={r[0]} {times(*r)[2]}" for r in common.itertuples(index=False)]
        sentences.append(
            f"At every N_tokens measured at both, cp={hi} against cp={lo}: " + ", ".join(parts) + "."
        )
    return sentences


def _baseline_sentences(frame: pd.DataFrame) -> list[str]:
    if "source" not in frame.columns or not (frame["source"] == BASELINE).any():
        return []
    return [
        "The cp=1 rows are this run's baseline (source=baseline): the same workload on one rank under "
        "the same per-rank memory budget."
    ]


def noisy(frame: pd.DataFrame) -> pd.Series:
    """Measured points whose IQR exceeds NOISY_IQR of their median walltime."""
    if "walltime_iqr_ms" not in frame.columns:
        return pd.Series(False, index=frame.index)
    iqr, median = frame["walltime_iqr_ms"].astype(float), frame["walltime_ms"].astype(float)
    return (frame["status"] == "ok") & (iqr > NOISY_IQR * median)


def _noise_sentences(frame: pd.DataFrame) -> list[str]:
    count = int(noisy(frame).sum())
    if not count:
        return []
    return [
        f"{count} point(s) are noisy (IQR over {NOISY_IQR:.0%} of the median walltime): more repeats "
        "(timing.repeats) or a quieter machine would tighten them."
    ]


def _failure_sentences(frame: pd.DataFrame) -> list[str]:
    several = frame["cp"].nunique() > 1

    def points(rows: pd.DataFrame) -> str:
        return "; ".join(
            f"N={r.N_tokens}" + (f" cp={r.cp}" if several else "") + f" {r.status}" for r in rows.itertuples()
        )

    wrong = frame[frame["status"] == "mismatch"]
    failed = frame[~frame["status"].isin(["ok", "mismatch"])]
    sentences = [f"{len(failed)} point(s) did not finish: {points(failed)}."] if not failed.empty else []
    if not wrong.empty:
        sentences.append(
            f"{len(wrong)} point(s) disagree with the cp=1 run (mode=accuracy): {points(wrong)}."
        )
    return sentences


def prediction_errors(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with both a measured and a predicted peak, and the prediction's error relative to the
    measured peak over the start-up baseline (what the budget caps; the baseline itself is not predicted)."""
    needed = ["predicted_peak_gib", "peak_mem_gib"]
    if not set(needed) <= set(frame.columns):
        return frame.iloc[0:0]
    rows = frame[frame["predicted_peak_gib"].notna() & frame["peak_mem_gib"].notna()].copy()
    base = rows["baseline_gib"].fillna(0.0) if "baseline_gib" in rows.columns else 0.0
    measured = (rows["peak_mem_gib"] - base).where(lambda over: over > 0)
    rows["prediction_error"] = (rows["predicted_peak_gib"] - rows["peak_mem_gib"]) / measured
    return rows[rows["prediction_error"].notna()]


def prediction_sentences(frame: pd.DataFrame) -> list[str]:
    rows = prediction_errors(frame)
    if rows.empty:
        return []
    parts = "; ".join(f"N={r.N_tokens} {r.prediction_error:+.1%}" for r in rows.itertuples())
    worst = rows["prediction_error"].abs().max()
    return [
        f"The fake-tensor estimate (probe.predict) was within {worst:.1%} of the measured peak over the "
        f"baseline ({parts})."
    ]


def readout(frame: pd.DataFrame) -> str:
    """Max N at each CP size against cp=1, the walltime gained, and whether compute or communication
    dominates; one paragraph per like-for-like group."""
    if frame.empty:
        return "No point was measured."
    groups = like_for_like(frame)
    paragraphs = []
    for key, group in groups:
        sentences = (
            _baseline_sentences(group)
            + _max_n_sentences(group)
            + _comm_sentences(group)
            + _speed_sentences(group)
            + _noise_sentences(group)
            + _failure_sentences(group)
            + prediction_sentences(group)
        )
        text = " ".join(sentences)
        paragraphs.append(f"**{group_label(key)}**: {text}" if len(groups) > 1 else text)
    return "\n\n".join(paragraphs)


def _rows_table(frame: pd.DataFrame, extra: Sequence[str] = ()) -> list[str]:
    cols = [c for c in extra if c in frame.columns] + [c for c in _TABLE if c in frame.columns]
    for optional in ("predicted_peak_gib", "input", "chains"):  # a run without probe.predict, data.path
        if optional in cols and frame[optional].replace("", None).isna().all():
            cols.remove(optional)
    lines = ["| " + " | ".join(_TABLE.get(c, c) for c in cols) + " |", "|" + "---|" * len(cols)]
    shown = frame.copy()
    if "oom_at" in shown.columns:  # a max-fit row names the first N that did not fit
        at = (shown["kind"] == "max-fit") & shown["oom_at"].notna()
        shown.loc[at, "status"] = (
            shown.loc[at, "status"].astype(str) + ", OOM@" + shown.loc[at, "oom_at"].astype(int).astype(str)
        )
    shown.loc[noisy(shown), "status"] = "ok, noisy"
    for row in shown[cols].itertuples(index=False):
        # Checksums keep enough digits to tell two runs apart.
        cells = (_fmt(v, 12 if c == "checksum" else 6) for c, v in zip(cols, row, strict=True))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _errors(frame: pd.DataFrame, with_run: bool = False) -> list[str]:
    if "error" not in frame.columns:
        return []
    errors = frame[frame["error"].notna() & (frame["error"].astype(str) != "")]
    if errors.empty:
        return []
    where = (lambda r: f"{r.run} cp={r.cp} ") if with_run and "run" in frame.columns else (lambda r: "")
    return ["", "Errors:", ""] + [
        f"- {where(r)}N={r.N_tokens} ({r.status}): {r.error}" for r in errors.itertuples()
    ]


def _budget_sentence(meta: dict[str, Any]) -> list[str]:
    budget, baseline = meta.get("budget_gib"), meta.get("baseline_gib")
    if budget is None:
        return []
    return [
        "",
        f"Memory cap: {budget:g} GiB per rank on top of the {baseline or 0:.3f} GiB a rank holds after "
        f"start-up; peaks are the whole process (baseline included), so a point fits while its peak "
        f"stays under {budget + (baseline or 0):.3f} GiB.",
    ]


def what_changed_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The what-changed table (`cpbench.plan.changes`): limitations name no setting."""
    return _table(
        ["what", "benchmark", "real job", "setting", "why"],
        [(r["what"], r["benchmark"], r["real"], r["setting"] or "limitation: needs an edit to the code",
          r["why"]) for r in rows],
    )  # fmt: skip


def _real_job_sentences(frame: pd.DataFrame, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The real job's step time from the measured one, bounded: each loop count that differs scales
    its part of the step in proportion, so the whole grows at most by the largest ratio. cpbench times
    a step whole, not its parts (the trunk apart from the sampler), and says so."""
    scaled = [r for r in rows if r.get("scale")]
    ok = ok_points(frame) if not frame.empty else frame
    if not scaled or ok.empty:
        return []
    top = max(1.0, *(r["scale"] for r in scaled))
    at = ok.sort_values("N_tokens").iloc[-1]
    ratios = ", ".join(f"{r['what']} {r['scale']:.3g}x" for r in scaled)
    return [
        "",
        f"Real job's step, estimated: at N_tokens={at['N_tokens']} at most {top:.3g}x the measured "
        f"{at['walltime_ms']:.4g} ms, i.e. up to {top * at['walltime_ms'] / 1e3:.4g} s ({ratios}; each "
        "loop scales its part of the step in proportion). cpbench times the step whole, not the sampler "
        "apart from the trunk, so the real job's sampling time alone is not measured.",
    ]


def _plan_sections(frame: pd.DataFrame, meta: dict[str, Any]) -> list[str]:
    """What differs from the real job, the time budget's plan and cuts, and what the run left behind."""
    lines = []
    rows = meta.get("what_changed")
    if rows:
        lines += ["", "## What differs from the real job", "", *what_changed_lines(rows)]
        lines += _real_job_sentences(frame, rows)
    budget = meta.get("time_budget")
    if budget:
        took = budget.get("took_s")
        took = f"; it took {took / 60:.2g} min (its timed step included)" if took is not None else ""
        lines += ["", "## Time budget", "", budget["line"] + took + "."]
        lines += [f"- {budget['probe_line']}"] if budget.get("probe_line") else []
        lines += [f"- cut: {cut}" for cut in budget["cuts"]]
        lines += [f"- refused: {budget['refusal']}"] if budget.get("refusal") else []
    footprint = meta.get("footprint")
    if footprint:
        lines += ["", "## Left behind", "", footprint["line"][:1].upper() + footprint["line"][1:] + "."]
    return lines


def _oversubscribed(meta: dict[str, Any]) -> str:
    if str(meta.get("oversubscribed", "no")).startswith("yes"):
        return (
            f" Oversubscribed {meta['oversubscribed'].removeprefix('yes ')}: walltimes and the share of "
            "time in collectives are not meaningful."
        )
    return ""


def _repeat_check_lines(meta: dict[str, Any]) -> list[str]:
    """repeat_check's spreads (run.json): per point and figure the range over the runs, and the
    largest relative spread of each figure, the run's own tolerance."""
    check = meta.get("repeat_check")
    if not check:
        return []
    figures = list(check["tolerance"])
    tolerance = ", ".join(f"{name} {value:.3g}" for name, value in check["tolerance"].items())
    tolerance = tolerance or "none (no point finished in every run)"
    lines = [
        "",
        f"## Same answer twice (repeat_check={check['runs']})",
        "",
        f"The configuration's points, run {check['runs']} times with the same seed (the runs after the "
        "first in repeat_check/): per figure min to max, and (max - min) / abs(median). The largest "
        f"relative spread of each figure is this run's tolerance: {tolerance}.",
        "",
    ]

    def cell(point: dict[str, Any], name: str) -> str:
        if name not in point:
            return ""
        v = point[name]
        return f"{_fmt(v['min'], 10)} to {_fmt(v['max'], 10)} ({v['relative']:.3g})"

    rows = [
        (p["N_tokens"], p["N_atoms"], p["MSA_depth"], *(cell(p, f) for f in figures)) for p in check["points"]
    ]
    return lines + _table(["N_tokens", "N_atoms", "MSA", *figures], rows)


def _plot_lines(plots: dict[str, str]) -> list[str]:
    return ["", "## Plots", "", *(f"![{alt}]({path})" for alt, path in plots.items())] if plots else []


def render(
    frame: pd.DataFrame,
    meta: dict[str, Any],
    title: str = "cpbench results",
    plots: dict[str, str] | None = None,
) -> str:
    """One run's report, with the plots of its current configuration ({alt text: file}). Rows of
    several configurations (a rerun into the same folder with other settings) each get their own table
    and readout: they are never compared or mixed."""
    plots = plots or {}
    lines = [f"# {title}", "", "## Run", "", "| | |", "|---|---|"]
    lines += [f"| {label} | {_fmt(meta.get(key, ''))} |" for key, label in _META if key in meta]
    lines += _budget_sentence(meta)
    lines += _plan_sections(frame, meta)
    lines += ["", "## Results", ""]
    if frame.empty:
        return "\n".join([*lines, "No rows.", "", "## Readout", "", readout(frame), ""])
    configs = list(frame.groupby("config_hash", sort=False)) if "config_hash" in frame.columns else []
    if len(configs) <= 1:
        lines += _rows_table(frame) + _errors(frame)
        lines += ["", "## Readout", "", readout(frame) + _oversubscribed(meta)]
        lines += _efficiency(frame, {"": meta})
        return "\n".join([*lines, *_repeat_check_lines(meta), *_plot_lines(plots), ""])
    for config, rows in configs:
        seeds = ", ".join(str(s) for s in rows["seed"].unique()) if "seed" in rows else "?"
        current = " (this run's)" if config == meta.get("config_hash") else ""
        lines += [f"### config `{config}`{current}, seed {seeds}", ""]
        lines += _rows_table(rows) + _errors(rows)
        lines += ["", "Readout: " + readout(rows) + (_oversubscribed(meta) if current else ""), ""]
    return "\n".join([*lines, *_repeat_check_lines(meta), *_plot_lines(plots)[1:], ""])


def _efficiency(frame: pd.DataFrame, metas: dict[str, dict[str, Any]]) -> list[str]:
    from cpbench.report.efficiency import efficiency_lines  # it reads this module's analysis

    return efficiency_lines(frame, metas)


def hardware(metas: Sequence[dict[str, Any]]) -> str:
    """What the numbers were measured on, e.g. `CPU (Intel(R) Xeon(R) Processor, 2 cores, SMT off), gloo`."""
    seen = []
    for m in metas:
        if not m:
            continue
        if m.get("backend") == "gloo" and m.get("cuda", "none") == "none":
            threads = f", SMT {m['smt']}" if m.get("smt") else ""
            label = f"CPU ({m.get('device', '?')}, {m.get('cpu_cores', '?')} cores{threads}), gloo"
        else:
            label = f"{m.get('device_count', '?')}x {m.get('device', '?')} per node, {m.get('backend', '?')}"
            label += f", CUDA {m['cuda']}" if m.get("cuda") not in (None, "none") else ""
        if label not in seen:
            seen.append(label)
    return "; ".join(seen) or "unknown (no run.json)"


def render_sweep(
    frame: pd.DataFrame,
    jobs: Sequence[dict[str, Any]],
    plots: dict[str, str],
    csv_name: str = RunFolder.RESULTS,
    title: str = "cpbench: CP sweep",
    note: str = "",
) -> str:
    """The merged report of several runs (a sweep's jobs): per like-for-like group the CP curve (max N
    vs cp, walltime vs N per cp), its readout, the plots, the failed jobs, every run's metadata."""
    metas = [j["meta"] for j in jobs]
    ok_jobs = sum(not j["error"] for j in jobs)
    lines = [f"# {title}", "", f"Hardware: {hardware(metas)}.", ""]
    if note:
        lines += [note, ""]
    lines += [
        f"{len(frame)} row(s) from {len(jobs)} run(s), {ok_jobs} finished; "
        f"every row is in [{csv_name}]({csv_name}).",
        "",
        "## Runs",
        "",
    ]
    lines += _table(
        ["run", "topology", "cp", "rows", "ok rows", "outcome"],
        [(j["name"], j["topology"], j["cp"], j["rows"], j["ok_rows"], j["error"] or "ok") for j in jobs],
    )
    stale = [j for j in jobs if j.get("stale")]
    if stale:
        lines += [
            "",
            "Left out, as measured under other settings in the same folder (another config hash): "
            + ", ".join(f"{j['stale']} row(s) of `{j['name']}`" for j in stale)
            + ".",
        ]
    failed = [j for j in jobs if j["error"]]
    if failed:
        lines += ["", "### Failed runs", ""]
        lines += [f"- `{j['name']}` (cp={j['cp']}): {j['error']}" for j in failed]
    lines += _plot_lines(plots)
    for key, group in like_for_like(frame):
        lines += ["", f"## {group_label(key)}", "", "### Readout", "", readout(group)]
        lines += _efficiency(group, {j["name"]: j["meta"] for j in jobs})
        fits = max_fit(group)
        lines += ["", "### Max N_tokens that fits vs cp", ""]
        if fits.empty:
            lines.append("No max-fit rows: the max-token probe did not run (probe.enabled=true runs it).")
        else:
            lines += _table(
                ["topology", "cp", "grid", "max N_tokens", "vs cp=1", "ideal sqrt(cp)", "probe stopped at"],
                [
                    (r.topology, r.cp, r.grid, r.max_n, "" if pd.isna(r.vs_cp1) else f"{r.vs_cp1:.2f}x",
                     f"{r.ideal:.2f}x", r.note)
                    for r in fits.itertuples()
                ],
            )  # fmt: skip
        lines += _walltime_lines(group)
    lines += ["", "## Run metadata", ""]
    keys = [(k, label) for k, label in _META if any(k in m for m in metas)]
    lines += _table(
        ["", *(j["name"] for j in jobs)], [(label, *(m.get(k, "") for m in metas)) for k, label in keys]
    )
    lines += ["", "## All rows", ""]
    lines += _rows_table(frame, extra=["run"]) if not frame.empty else ["No rows."]
    lines += _errors(frame, with_run=True)
    return "\n".join(lines) + "\n"


def _walltime_lines(group: pd.DataFrame) -> list[str]:
    table = walltime_table(group)
    lines = ["", "### Walltime (ms, median over repeats of the slowest rank) vs N per cp", ""]
    if table.empty:
        return [*lines, "No point finished."]
    grids = table.columns.get_level_values(2).nunique() > table.columns.droplevel(2).nunique()
    header = ["N_tokens", "N_atoms", "MSA"] + [_series_label(t, c, g, grids) for t, c, g in table.columns]
    rows = [
        (*index, *(f"{v:.4g}" if pd.notna(v) else "" for v in values)) for index, values in table.iterrows()
    ]
    lines += _table(header, rows)
    shares = comm_share(group)
    if not shares.empty:
        lines += ["", "Share of walltime in collectives (median over points): "]
        lines[-1] += ", ".join(f"{r.topology} cp={r.cp}: {r.share:.0%}" for r in shares.itertuples()) + "."
    return lines
