"""The readout: one paragraph per like-for-like group, sentence by sentence (the baseline, max N at
each CP size against cp=1, a kernel fault that ended the probe, the dominant cost, the walltime gained,
noise, failures, the estimate)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from cpbench.record.run_record import RunMetadata
from cpbench.report.analysis import (
    BOUND_SHARE,
    NOISY_IQR,
    comm_share,
    like_for_like,
    max_fit,
    noisy,
    ok_points,
    oversubscribed_rows,
    prediction_errors,
)
from cpbench.report.peak_terms import edge_sentence
from cpbench.results.row import BASELINE, COMM, KERNEL, TIMEOUT, samples_of


def _max_n_sentences(frame: pd.DataFrame) -> list[str]:
    fits = max_fit(frame)
    if fits.empty and (frame["kind"] == "max-fit").any():  # nothing fit: the failure sentences say why
        return []
    if fits.empty:
        return ["Max N_tokens was not probed here (no max-fit rows; probe.enabled=true measures it)."]
    several = fits["topology"].nunique() > 1
    parts = []
    for r in fits.itertuples():
        where = f"cp={r.cp}" + (f" {r.topology}" if several and r.cp > 1 else "")
        at = f"{'>= ' if r.bound else ''}{r.max_n} at {where}"
        if r.cp == 1 or pd.isna(r.vs_cp1):
            parts.append(at)
        else:
            parts.append(f"{at} ({r.vs_cp1:.2f}x cp=1; ideal sqrt(cp) = {r.ideal:.2f}x)")
    sentences = ["Largest N_tokens that fits: " + "; ".join(parts) + "."]
    if fits["bound"].any():
        bounded = ", ".join(f"cp={r.cp}" for r in fits.itertuples() if r.bound)
        sentences.append(
            f"At {bounded} the probe stopped short of the edge within the time budget: those are lower "
            "bounds (each max-fit row's note says where it stopped), and a ratio with one in it is not the "
            "edges' ratio; raise budget.minutes for the edge."
        )
    if edge := edge_sentence(frame, fits):
        sentences.append(edge)
    if held := _holder_sentence(frame):
        sentences.append(held)
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


def _holder_sentence(frame: pd.DataFrame) -> str:
    """Who holds the peak at each edge, by the fake-tensor trace the run made there (`peak_holder`)."""
    if "peak_holder" not in frame.columns:
        return ""
    rows = frame[(frame["kind"] == "max-fit") & frame["peak_holder"].fillna("").astype(bool)]
    edges = rows.sort_values(["cp", "topology", "N_tokens"]).drop_duplicates(["cp", "topology"], keep="last")
    parts = [f"cp={r.cp} {r.topology} at N={r.N_tokens}: {r.peak_holder}" for r in edges.itertuples()]
    if not parts:
        return ""
    sentence = "The fake-tensor trace at each edge puts the peak in: " + "; ".join(parts) + "."
    batch = [r for r in edges.to_dict("records") if str(r["peak_holder"]).startswith("diffusion.")]
    if batch and (samples := samples_of(batch[0].get("diffusion_samples"))) is not None:
        where = ", ".join(
            f"cp={r['cp']} {r['topology']} ({_diffusion_share(r['peak_holder'])})" for r in batch
        )
        sentence += (
            f" At {where} that is the diffusion module, which runs its {samples} sample(s) per trunk pass "
            "as one batch: its activations grow with the samples and the trunk's do not, so fewer samples "
            "per pass (or passes of fewer) would fit a larger N."
        )
    return sentence


def _diffusion_share(holders: str) -> str:
    """The diffusion module's share of a traced peak, from the holders a row names ("name 58%, ...";
    the largest two: a lower bound)."""
    shares = [part.rsplit(" ", 1) for part in holders.split(", ")]
    share = sum(float(pct.rstrip("%")) for name, pct in shares if name.startswith("diffusion."))
    return f"diffusion.* holds {share:.0f}% of the peak or more"


def _comm_sentences(frame: pd.DataFrame) -> list[str]:
    ok = ok_points(frame)
    unseen = sorted(ok.loc[(ok["cp"] > 1) & ok["comm_ms"].isna(), "cp"].unique())
    note = (
        [
            "Time in collectives is not known at "
            + ", ".join(f"cp={cp}" for cp in unseen)
            + ": the model's collectives bypass cpbench's ledger (`measure.profile_comm=true` measures "
            "them with the torch profiler, at the overhead docs/measurement.md gives)."
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


def _noise_sentences(frame: pd.DataFrame) -> list[str]:
    count = int(noisy(frame).sum())
    if not count:
        return []
    return [
        f"{count} point(s) are noisy (IQR over {NOISY_IQR:.0%} of the median walltime): more repeats "
        "(timing.repeats) or a quieter machine would tighten them."
    ]


def _kernel_sentences(frame: pd.DataFrame) -> list[str]:
    """Where a kernel fault ended the probe (`kernel_fault_at`): that edge is the kernel's, and says
    nothing about memory."""
    if "kernel_fault_at" not in frame.columns:
        return []
    rows = frame[(frame["kind"] == "max-fit") & frame["kernel_fault_at"].notna()]
    if rows.empty:
        return []
    topologies = frame["topology"].nunique() > 1
    several = topologies or frame["cp"].nunique() > 1
    parts = []
    for r in rows.sort_values(["cp", "topology"]).itertuples():
        where = (f" at cp={r.cp}" if several else "") + (f" {r.topology}" if topologies else "")
        ran = f"the largest N that ran is {r.N_tokens}" if r.status == "ok" else "no N ran"
        parts.append(f"kernel fault at N={int(r.kernel_fault_at)}{where} ({ran})")
    return [
        "The probe stopped at a kernel fault, not at the memory's edge: " + "; ".join(parts) + ". A kernel "
        "fault is an illegal memory access or a device-side assertion in a kernel; no N from it up was tried "
        "again, so how far memory alone would go is not measured."
    ]


# A failed row's word in the readout: its failure class where that says more than its status.
_FAILURE_WORDS = {KERNEL: "kernel fault", COMM: "communication error", TIMEOUT: "timeout"}


def _failure_sentences(frame: pd.DataFrame) -> list[str]:
    several = frame["cp"].nunique() > 1

    def word(row: Any) -> str:
        failure = getattr(row, "failure", "")
        return _FAILURE_WORDS.get(failure, row.status) if isinstance(failure, str) else row.status

    def points(rows: pd.DataFrame) -> str:
        return "; ".join(
            f"N={r.N_tokens}" + (f" cp={r.cp}" if several else "") + f" {word(r)}" for r in rows.itertuples()
        )

    wrong = frame[frame["status"] == "mismatch"]
    failed = frame[~frame["status"].isin(["ok", "mismatch"])]
    sentences = [f"{len(failed)} point(s) did not finish: {points(failed)}."] if not failed.empty else []
    if not wrong.empty:
        sentences.append(
            f"{len(wrong)} point(s) disagree with the cp=1 run (mode=accuracy): {points(wrong)}."
        )
    return sentences


def _prediction_sentences(frame: pd.DataFrame) -> list[str]:
    rows = prediction_errors(frame)
    if rows.empty:
        return []
    parts = "; ".join(f"N={r.N_tokens} {r.prediction_error:+.1%}" for r in rows.itertuples())
    worst = rows["prediction_error"].abs().max()
    return [
        f"The fake-tensor estimate (probe.predict) was within {worst:.1%} of the measured peak over the "
        f"baseline ({parts})."
    ]


SENTENCES = (
    _baseline_sentences,
    _max_n_sentences,
    _kernel_sentences,
    _comm_sentences,
    _speed_sentences,
    _noise_sentences,
    _failure_sentences,
    _prediction_sentences,
)


def readout(frame: pd.DataFrame) -> str:
    """Max N at each CP size against cp=1, the walltime gained, and whether compute or communication
    dominates; one paragraph per like-for-like group."""
    if frame.empty:
        return "No point was measured."
    groups = like_for_like(frame)
    paragraphs = []
    for label, group in groups:
        text = " ".join(sentence for say in SENTENCES for sentence in say(group))
        paragraphs.append(f"**{label}**: {text}" if len(groups) > 1 else text)
    return "\n\n".join(paragraphs)


NOT_MEANINGFUL = "walltimes and the share of time in collectives are not meaningful."


def oversubscribed(meta: RunMetadata) -> str:
    """The sentence after the readout of a run whose ranks outnumbered its devices or cores."""
    if meta.is_oversubscribed:
        return f" Oversubscribed {meta.oversubscribed.removeprefix('yes ')}: {NOT_MEANINGFUL}"
    return ""


def oversubscribed_runs(frame: pd.DataFrame) -> str:
    """The sentence after a merged group's readout naming its oversubscribed runs (from the `run` and
    `oversubscribed` columns a merge adds from each run's run.json)."""
    rows = frame[oversubscribed_rows(frame)].drop_duplicates("run")
    if rows.empty:
        return ""
    named = ", ".join(f"`{r.run}` {str(r.oversubscribed).removeprefix('yes ')}" for r in rows.itertuples())
    return f" Oversubscribed: {named}: {NOT_MEANINGFUL}"
