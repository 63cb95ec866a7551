"""The FLOP count of a workload that declares its identical-pass loops (`flop_loops`, `flop_form`):
counted at 1 and 2 passes of each loop, every chunk loop one chunk, and extrapolated
(cpbench/measure/flops.py `corners`), it is the count of the whole step to the FLOP."""

from __future__ import annotations

import pytest
import torch
from support.flops_expected import builtin

from cpbench.core import Shape, Topology
from cpbench.measure import flops
from cpbench.probe.trace import fake_rank

# Every loop above 2 passes, so that each is extrapolated; chunks of 8 rows, so that every chunk loop
# runs several chunks in the whole count (at this N, `auto` would make them one).
LOOPS = ["workload.n_blocks=3", "workload.chunk_size=8"]
FOLD_LOOPS = [*LOOPS, "workload.n_cycles=3", "workload.sampling.steps=3", "workload.token_blocks=3",
              "workload.msa_blocks=3", "workload.atom_blocks=3", "workload.input_atom_blocks=3"]  # fmt: skip


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize(
    ("name", "overrides", "ranks"), [("pairformer_small", LOOPS, (0, 1)), ("fold_small", FOLD_LOOPS, (1,))]
)
def test_the_extrapolated_count_is_the_whole_steps(
    name: str, overrides: list[str], ranks: tuple, train: bool
):
    """On ranks of a 1d cp=2, at N=16: the corners' count (`counted_forms`) against `_count` of the run's
    own model (every pass and chunk walked), total and per op. fold_small on rank 1 alone, the slab away
    from the origin: its 16 counts (one per corner) and the whole walk take about 30 s a rank here."""
    workload, _ = builtin(name, *overrides)
    loops = workload.flop_loops(train)
    assert min(n for group in loops for n in group.values()) > 2, loops  # every loop cut, none whole
    shape = Shape(16, 16 * 4, 4)
    for rank in ranks:
        with fake_rank(Topology.from_config("1d", 2, None), rank, torch.float32, 0) as ctx:
            model = workload.build_model(ctx)
            whole = flops._count(workload, model, shape, ctx, train, seed=0)
            extrapolated = flops.counted_forms(workload, flops.corners(loops), shape, ctx, train, seed=0)
        assert whole.flops > 0
        assert (extrapolated.flops, extrapolated.by_op) == (whole.flops, whole.by_op)


def test_corners_weigh_a_count_affine_in_each_loop_exactly():
    """Loops of 1 or 2 passes stay as they are; each longer one is counted at 1 and 2 passes. Within
    a group loops may nest (blocks inside trunk passes); groups add (a trunk, then a sampler)."""

    def count(p: dict[str, int]) -> int:
        trunk = p["n_cycles"] * (11 + 13 * p["n_blocks"] + 5 * p["msa_blocks"])
        return 7 + trunk + p["sampling_steps"] * (17 + 19 * p["token_blocks"]) + 3 * p["input_atom_blocks"]

    groups = (
        {"input_atom_blocks": 2},
        {"n_cycles": 4, "n_blocks": 48, "msa_blocks": 4},
        {"sampling_steps": 200, "token_blocks": 24},
    )
    points = flops.corners(groups)
    assert len(points) == 1 + 7 + 3 and all(max(p.values()) <= 2 for p, _ in points)
    assert sum(w * count({"input_atom_blocks": 2, **p}) for p, w in points) == count(
        {k: v for group in groups for k, v in group.items()}
    )
    assert flops.corners(({"n_blocks": 2},)) == [({}, 1)]


def test_a_step_whose_corners_walk_longer_is_counted_once_in_its_own_form():
    """fold_small's loops (4 sampling steps, the rest at 1 or 2): its two corner forms walk 16 loop
    passes, the step itself 13, so it is counted once, in its own form (chunk loops one chunk), and
    the count is the same; AF3's fold counts stay extrapolated."""
    small, _ = builtin("fold_small")
    loops = small.flop_loops(False)
    assert flops._passes(loops, {}) == 1 + 2 * 2 + 2 * 1 * 4 and len(flops.corners(loops)) == 2
    assert flops.forms_to_count(loops) == [({}, 1)]
    fold, _ = builtin("fold")
    for train in (False, True):
        assert flops.forms_to_count(fold.flop_loops(train)) == flops.corners(fold.flop_loops(train))
    shape = Shape(32, 32 * 9, 4)
    with fake_rank(Topology.from_config("1d", 2, None), 1, torch.float32, 0) as ctx:
        once = flops.count_step(small, small.build_model(ctx), shape, ctx, False, seed=0)
        at_corners = flops.counted_forms(small, flops.corners(loops), shape, ctx, False, seed=0)
    assert once.flops > 0 and (once.flops, once.by_op) == (at_corners.flops, at_corners.by_op)
