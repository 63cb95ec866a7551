"""The CP curve as PNGs beside the report: max N vs cp against the ideal for memory growing as N^2
(N growing as sqrt(cp)), walltime vs N per cp and MFU vs N per cp. One panel per like-for-like group,
titled with its hardware."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from cpbench.report.analysis import (
    experiment_label,
    hardware_label,
    like_for_like,
    max_fit,
    ok_points,
    oversubscribed_rows,
)
from cpbench.results.folder import RunFolder

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _panels(count: int) -> tuple[Figure, list[Axes]]:
    # Imported here: matplotlib costs about 0.3 s of the start-up of every rank, which never draws.
    # The object API: no pyplot state, no GUI backend.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0 * count, 4.2), layout="constrained")
    return fig, list(fig.subplots(1, count, squeeze=False)[0])


def _label(ax: Axes, xlabel: str, ylabel: str, group: pd.DataFrame) -> None:
    """Axes, legend and the title: what the group measured, then its hardware (device model, ranks),
    marked where a run of it was oversubscribed (its markers hollow)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    crowded = " (oversubscribed: hollow markers)" if oversubscribed_rows(group).any() else ""
    ax.set_title(f"{experiment_label(group)}\n{hardware_label(group)}{crowded}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def _hollow(ax: Axes, xs: pd.Series, ys: pd.Series, color: str) -> None:
    """Hollow markers over the points of an oversubscribed run: their walltimes are not meaningful."""
    if len(xs):
        ax.plot(xs, ys, "o", markerfacecolor="white", markeredgecolor=color, zorder=3)


def _log2_axis(ax: Axes, values: list[int], axis: str = "x") -> None:
    """Powers of two sit evenly; the ticks are the values measured."""
    getattr(ax, f"set_{axis}scale")("log", base=2)
    ticks = sorted(set(int(v) for v in values))
    getattr(ax, f"set_{axis}ticks")(ticks, [str(t) for t in ticks])
    getattr(ax, f"set_{axis}ticks")([], minor=True)


def plot_max_n(frame: pd.DataFrame, path: Path) -> Path | None:
    """Max N_tokens that fits vs cp per topology, with the ideal N(cp=1) * sqrt(cp) and a bar from each
    fits-at N up to the first N that did not fit (`oom_at`): the edge lies in between. None without
    max-fit rows."""
    groups = [(group, max_fit(group)) for _, group in like_for_like(frame)]
    groups = [(group, fits) for group, fits in groups if not fits.empty]
    if not groups:
        return None
    fig, axes = _panels(len(groups))
    for ax, (group, fits) in zip(axes, groups, strict=True):
        base = fits.loc[fits["cp"] == 1, "max_n"].max()
        for topology, series in fits.groupby("topology"):
            series = series.sort_values("cp")
            cps, max_n = list(series["cp"]), list(series["max_n"])
            if pd.notna(base) and cps[0] != 1:  # cp=1 is every topology's start (one rank shards nothing)
                cps, max_n = [1, *cps], [base, *max_n]
            (line,) = ax.plot(cps, max_n, marker="o", label=f"{topology}: fits")
            color = line.get_color()
            crowded = series[series["oversubscribed"]]
            _hollow(ax, crowded["cp"], crowded["max_n"], color)
            edge = series[series["oom_at"].notna()]
            if not edge.empty:
                above = edge["oom_at"] - edge["max_n"]
                ax.errorbar(
                    edge["cp"], edge["max_n"], yerr=[0 * above, above], fmt="none", ecolor=color, capsize=4,
                    alpha=0.6, label=f"{topology}: up to the first N that fails",
                )  # fmt: skip
        cps = sorted(set(fits["cp"]))
        if pd.notna(base):
            xs = [2 ** (i / 8) for i in range(int(8 * math.log2(max(cps))) + 1)]
            ax.plot(
                xs, [base * math.sqrt(x) for x in xs], "--", color="0.5", label="ideal: N(cp=1) x sqrt(cp)"
            )
        _log2_axis(ax, cps)
        _log2_axis(ax, list(fits["max_n"]), "y")
        _label(ax, "cp (ranks)", "max N_tokens that fits", group)
    fig.savefig(path, dpi=110)
    return path


def plot_walltime(frame: pd.DataFrame, path: Path) -> Path | None:
    """Walltime vs N_tokens, one line per (topology, cp) (and MSA depth where it varies), with the IQR
    as error bars; None when no point finished."""
    groups = [(group, ok_points(group)) for _, group in like_for_like(frame)]
    groups = [(group, ok) for group, ok in groups if not ok.empty]
    if not groups:
        return None
    fig, axes = _panels(len(groups))
    for ax, (group, ok) in zip(axes, groups, strict=True):
        series_keys = ["topology", "cp", "grid"] + (["MSA_depth"] if ok["MSA_depth"].nunique() > 1 else [])
        grids = ok.groupby(["topology", "cp"])["grid"].nunique().max() > 1
        for values, series in ok.groupby(series_keys, sort=True):
            topology, cp, grid, *msa = values
            by_n = series.groupby("N_tokens")[["walltime_ms", "walltime_iqr_ms"]].median().sort_index()
            label = f"{topology} cp={cp}" + (f" ({grid})" if grids else "") + (f" S={msa[0]}" if msa else "")
            ax.errorbar(
                by_n.index,
                by_n["walltime_ms"],
                yerr=by_n["walltime_iqr_ms"].fillna(0) / 2,
                marker="o",
                markerfacecolor="white" if oversubscribed_rows(series).any() else None,
                capsize=3,
                label=label,
            )
        _log2_axis(ax, list(ok["N_tokens"]))
        ax.set_yscale("log")
        _label(ax, "N_tokens", "walltime ms (median, slowest rank)", group)
    fig.savefig(path, dpi=110)
    return path


def plot_mfu(frame: pd.DataFrame, path: Path) -> Path | None:
    """MFU vs N_tokens, one line per (topology, cp); None when no point has an MFU (no count, or the
    device's peak unknown)."""
    groups = [(group, ok_points(group)) for _, group in like_for_like(frame)]
    groups = [(group, ok[ok["mfu"].notna()]) for group, ok in groups if "mfu" in ok.columns]
    groups = [(group, ok) for group, ok in groups if not ok.empty]
    if not groups:
        return None
    fig, axes = _panels(len(groups))
    for ax, (group, ok) in zip(axes, groups, strict=True):
        for (topology, cp), series in ok.groupby(["topology", "cp"], sort=True):
            by_n = series.groupby("N_tokens")["mfu"].median().sort_index()
            hollow = "white" if oversubscribed_rows(series).any() else None
            ax.plot(by_n.index, 100 * by_n, marker="o", markerfacecolor=hollow, label=f"{topology} cp={cp}")
        _log2_axis(ax, list(ok["N_tokens"]))
        _label(ax, "N_tokens", "MFU % (achieved / peak per rank)", group)
    fig.savefig(path, dpi=110)
    return path


Plotter = Callable[[pd.DataFrame, Path], Path | None]


def _run_plots(folder: RunFolder) -> tuple[tuple[str, Path, Plotter], ...]:
    return (
        ("max N_tokens vs cp against the sqrt(cp) ideal", folder.max_n_plot, plot_max_n),
        ("walltime vs N_tokens per cp", folder.walltime_plot, plot_walltime),
        ("MFU vs N_tokens per cp", folder.mfu_plot, plot_mfu),
    )


def drawn_plots(out_dir: Path) -> dict[str, str]:
    """The plots already beside a report, {alt text: file name}, as write_plots returned them."""
    return {alt: path.name for alt, path, _ in _run_plots(RunFolder(out_dir)) if path.exists()}


def write_plots(frame: pd.DataFrame, out_dir: Path) -> dict[str, str]:
    """Write the plots the rows allow, removing any the rows no longer allow (a stale plot beside a
    report would show other data); {alt text: file name} for the report to link."""
    written = {}
    for alt, path, plot in _run_plots(RunFolder(out_dir)):
        if plot(frame, path):
            written[alt] = path.name
        else:
            path.unlink(missing_ok=True)
    return written


def convergence_png(curves: dict[str, pd.DataFrame], path: Path) -> Path:
    """Loss and gradient norm per step, one line per curve (the run's, the one it is compared with)."""
    fig, axes = _panels(2)
    for (label, curve), style in zip(curves.items(), ("-", "--", ":", "-."), strict=False):
        for ax, column in zip(axes, ("loss", "grad_norm"), strict=True):
            ax.plot(curve["step"], curve[column], style, label=label)
    for ax, ylabel in zip(axes, ("loss", "gradient norm"), strict=True):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
