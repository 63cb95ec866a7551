"""The like-for-like readout in-process: the fit recovers known terms and keeps them non-negative, how
much of cp=1's N^2 memory a rank still holds, and the trace that names who holds the peak."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from cpbench.core import Shape, Topology
from cpbench.probe import trace
from cpbench.probe.trace import TraceSpec
from cpbench.report.peak_terms import edge_sentence, fit
from cpbench.workloads.pairformer import PairformerWorkload


def test_the_fit_recovers_known_terms_and_keeps_them_non_negative():
    n = np.array([64.0, 128.0, 192.0, 256.0, 320.0])
    peaks = 0.03 + 1e-6 * n**2 + 2e-9 * n**3
    terms = fit(n, peaks)
    assert terms.coefficients == pytest.approx((0.03, 1e-6, 2e-9), rel=1e-6)
    assert terms.shares(256.0)["N^2"] == pytest.approx(1e-6 * 256**2 / terms.at(256.0))
    # A curve whose plain least squares wants a negative cubic: the cubic is dropped, not negative.
    bent = 0.01 + 4e-6 * n**2 - 3e-9 * n**3
    assert min(fit(n, bent).coefficients) >= 0
    assert fit(n[:2], peaks[:2]) is None  # two N cannot separate three terms


def test_the_readout_says_how_much_of_cp1s_n2_memory_a_rank_still_holds():
    """Peaks built from known coefficients: cp=2 keeps 0.69 of cp=1's N^2 term (half split, a fifth
    of it held whole), which alone allows sqrt(1 / 0.69) = 1.20x N."""
    n = np.array([32.0, 64.0, 128.0, 300.0])
    rows = [
        {"cp": cp, "topology": "1d", "N_tokens": x, "status": "ok", "peak_mem_gib": 0.25 + 0.012 + b * x**2,
         "baseline_gib": 0.25}
        for cp, b in ((1, 7.5e-7), (2, 0.69 * 7.5e-7)) for x in n
    ]  # fmt: skip
    fits = pd.DataFrame({"cp": [1, 2], "topology": ["1d", "1d"], "max_n": [337, 402]})
    said = edge_sentence(pd.DataFrame(rows), fits)
    assert (
        "A rank's N^2 coefficient against cp=1's: 0.69x at cp=2 1d (1/cp = 0.50; it allows 1.20x N)" in said
    )


def test_the_trace_names_who_holds_the_peak_and_sums_to_it():
    workload = PairformerWorkload(c_z=16, n_blocks=1, tri_mul_hidden=16, chunk_size="auto")
    topology, shape = Topology("1d", 1, (1, 1)), Shape(48, 0, 1)
    spec = TraceSpec(False, torch.float32, chunk_cap_gib=0.01)
    held = trace.peak_owners(workload, topology, shape, spec, 0)
    peak = trace.trace_peak(workload, topology, shape, spec, 0)
    assert sum(held.values()) == peak
    assert any(name.startswith("pairformer.") or "tri" in name for name in held), held
