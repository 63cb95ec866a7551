"""The Pairformer in 1d and 2d context parallelism equals its one-rank self.

Each case spawns real CPU/gloo ranks on the project's mesh; every rank builds the modules with the
same seed, runs the same module on its shard, and compares its shard of outputs and input gradients,
and the summed parameter gradients, with torch.testing.assert_close defaults against the one-rank
module on the whole input (its results the same for every rank and case: computed once, in this
process, on one thread as on the ranks, and read by the ranks). The byte ledger is checked against
the formulas of docs/pairformer.md. Ranks report failures as strings (never raising between
collectives, so one failed comparison cannot hang its peers); the whole spawn is bounded by a timeout.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from support.cp_ranks import rank_context, report, spawn
from support.pairformer_checks import Checks, one_rank_references


def _rank_main(rank: int, world: int, tmp: str, kind: str, grid: tuple[int, int], extras: list[str],
               references: str) -> None:  # fmt: skip
    failures: list[str] = []
    try:
        ctx = rank_context(rank, world, tmp, kind, grid)
        failures = Checks(ctx, references=torch.load(references)).run(extras)
    except Exception:
        failures.append(f"rank {rank}: {traceback.format_exc()}")
    finally:
        report(tmp, rank, failures)


# --- the cases ------------------------------------------------------------------------------------------

CASES = [
    ("1d", 2, (2, 1), ["compile", "bf16"]),
    ("1d", 4, (4, 1), ["chunk", "checkpoint"]),
    ("2d", 4, (2, 2), ["chunk", "checkpoint", "bf16"]),
    ("2d", 2, (1, 2), ["compile", "checkpoint"]),
    ("2d", 2, (2, 1), ["chunk"]),
]


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Path:
    """The one-rank results of every case's comparisons, computed once, in a file the ranks read."""
    path = tmp_path_factory.mktemp("one_rank") / "references.pt"
    torch.save(one_rank_references(sorted({extra for *_, extras in CASES for extra in extras})), path)
    return path


@pytest.mark.parametrize(
    ("kind", "cp", "grid", "extras"), CASES, ids=[f"{k}-{g[0]}x{g[1]}" for k, _, g, _ in CASES]
)
def test_cp_equals_one_rank(
    kind: str, cp: int, grid: tuple[int, int], extras: list[str], references: Path
) -> None:
    reports = spawn(_rank_main, cp, kind, grid, extras, str(references))
    failures = [line for report in reports for line in report]
    assert not failures, "\n".join(failures)
