"""Which term of memory holds the peak at the edge: a topology's measured peaks (over the start-up
baseline) fitted to a + b N^2 + c N^3, each coefficient non-negative. A constant term (the process,
workspaces, weights) and an N^3 one (unchunked attention logits) both keep CP from growing N as
sqrt(cp), so the term that holds the peak at max N says why a ratio is what it is."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

TERMS = ("constant", "N^2", "N^3")
_POWERS = (0, 2, 3)


@dataclass(frozen=True)
class PeakTerms:
    coefficients: tuple[float, float, float]  # GiB, GiB per N^2, GiB per N^3
    points: int

    def shares(self, n: float) -> dict[str, float]:
        """Each term's share of the fitted peak at N."""
        parts = [c * n**p for c, p in zip(self.coefficients, _POWERS, strict=True)]
        total = sum(parts) or 1.0
        return {term: part / total for term, part in zip(TERMS, parts, strict=True)}

    def at(self, n: float) -> float:
        return sum(c * n**p for c, p in zip(self.coefficients, _POWERS, strict=True))


def fit(n_tokens: np.ndarray, peak_gib: np.ndarray) -> PeakTerms | None:
    """The least-squares fit with every coefficient >= 0 (the best over the subsets of terms whose
    plain fit is non-negative: three terms, no solver needed); None below three distinct N."""
    n, y = np.asarray(n_tokens, dtype=float), np.asarray(peak_gib, dtype=float)
    if len(np.unique(n)) < 3:
        return None
    best, best_error = None, np.inf
    for size in (1, 2, 3):
        for chosen in itertools.combinations(range(3), size):
            design = np.stack([n ** _POWERS[i] for i in chosen], axis=1)
            solved, *_ = np.linalg.lstsq(design, y, rcond=None)
            if (solved < 0).any():
                continue
            error = float(np.sum((design @ solved - y) ** 2))
            if error < best_error - 1e-15:
                coefficients = [0.0, 0.0, 0.0]
                for i, value in zip(chosen, solved, strict=True):
                    coefficients[i] = float(value)
                best, best_error = tuple(coefficients), error
    return None if best is None else PeakTerms(best, len(n))


def measured_peaks(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows that fit, with their peak over the start-up baseline: walltime points and max-fit rows."""
    rows = frame[(frame["status"] == "ok") & frame["peak_mem_gib"].notna()]
    base = rows["baseline_gib"].fillna(0.0) if "baseline_gib" in rows.columns else 0.0
    return rows.assign(over_gib=rows["peak_mem_gib"].astype(float) - base)


def edge_sentence(frame: pd.DataFrame, fits: pd.DataFrame) -> str:
    """Per topology at its max N, the term that holds the fitted peak, with every term's share."""
    peaks = measured_peaks(frame)
    parts, fitted = [], {}
    for r in fits.itertuples():
        own = peaks[(peaks["cp"] == r.cp) & (peaks["topology"] == r.topology)]
        terms = fit(own["N_tokens"].to_numpy(), own["over_gib"].to_numpy())
        if terms is None:
            continue
        fitted[(r.cp, r.topology)] = terms
        shares = terms.shares(r.max_n)
        top = max(shares, key=shares.get)
        split = ", ".join(f"{term} {share:.0%}" for term, share in shares.items())
        parts.append(f"cp={r.cp} {r.topology} at N={r.max_n}: {top} ({split}; {terms.points} peaks)")
    if not parts:
        return ""
    return (
        "Peak over the start-up baseline fitted to a + b N^2 + c N^3 (measured peaks), the term that "
        "holds it at the edge: " + "; ".join(parts) + "." + _split_sentence(fitted)
    )


def _split_sentence(fitted: dict[tuple[int, str], PeakTerms]) -> str:
    """How much of cp=1's N^2 memory a rank still holds at each cp: 1/cp were every N^2 tensor split
    across the ranks, more where a rank holds some whole (a gathered operand), and the growth in N
    that coefficient alone allows, sqrt(b_1 / b_cp)."""
    one = next((t for (cp, _), t in fitted.items() if cp == 1), None)
    if one is None or not one.coefficients[1]:
        return ""
    parts = []
    for (cp, topology), terms in sorted(fitted.items()):
        b = terms.coefficients[1]
        if cp == 1 or not b:
            continue
        ratio = b / one.coefficients[1]
        parts.append(
            f"{ratio:.2f}x at cp={cp} {topology} (1/cp = {1 / cp:.2f}; it allows {ratio**-0.5:.2f}x N)"
        )
    if not parts:
        return ""
    return (
        " A rank's N^2 coefficient against cp=1's: " + "; ".join(parts) + ". Above 1/cp, part of the "
        "N^2 memory is held whole on every rank."
    )
