"""The byte formulas of docs/pairformer.md that tests/e2e/test_pairformer_cp.py checks every rank's
ledger against (support/pairformer_checks.py): one for every op, and nothing sent on one rank."""

from __future__ import annotations

from support.pairformer_checks import CFG, N, expected_bytes

from cpbench.models.pairformer import OP_LABELS, PairformerConfig


def test_formulas_cover_every_op() -> None:
    """Every op label of a block has a formula, and the one-rank layout sends nothing."""
    cfg = PairformerConfig(**CFG)
    for label in OP_LABELS:
        assert expected_bytes(label.split(".")[1], N, cfg, (1, 1), (0, 0)) == (0, 0)
    assert expected_bytes("tri_mul_out", 16, cfg, (2, 2), (0, 1)) == (2 * 8 * 8 * 6 * 4, 3 * 8 * 8 * 6 * 4)
