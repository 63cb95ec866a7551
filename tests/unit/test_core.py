"""The core vocabulary: the topology checks and the one block arithmetic every layer uses."""

from __future__ import annotations

import pytest

from cpbench.core import ConfigError, Tiling, Topology, TopologyKind

# Every layout the CP tests run: one rank, 1d row slabs, square and oblong 2d grids.
LAYOUTS = [(1, 1), (2, 1), (3, 1), (4, 1), (1, 2), (2, 2), (2, 3), (3, 2), (2, 4)]


@pytest.mark.parametrize("grid", LAYOUTS)
@pytest.mark.parametrize("n", [12, 24, 48])
def test_blocks_partition_the_pair_tensor(grid, n):
    tiling = Tiling(*grid)
    if not tiling.accepts(n):
        return
    covered = [[0] * n for _ in range(n)]
    for r in range(tiling.rows):
        for c in range(tiling.cols):
            rows, cols = tiling.block((r, c), n)
            assert len(rows) == n // tiling.rows and len(cols) == n // tiling.cols
            for i in rows:
                for j in cols:
                    covered[i][j] += 1
    assert all(count == 1 for line in covered for count in line)  # every pair on exactly one rank


@pytest.mark.parametrize("grid", LAYOUTS)
def test_transposed_tiling_swaps_the_blocks(grid):
    tiling, n = Tiling(*grid), 24
    flipped = tiling.transposed()
    for r in range(tiling.rows):
        for c in range(tiling.cols):
            assert flipped.block((c, r), n) == tiling.block((r, c), n)[::-1]


def test_multiple_and_accepts():
    assert Tiling(2, 3).multiple == 6 and Tiling(4, 1).multiple == 4
    assert Tiling(2, 3).accepts(12) and not Tiling(2, 3).accepts(8)


def test_block_outside_the_grid_is_refused():
    with pytest.raises(ValueError, match="outside the 2x2 grid"):
        Tiling(2, 2).block((2, 0), 8)


def test_slices_match_ranges():
    assert Tiling(2, 2).block_slices((1, 0), 8) == (slice(4, 8), slice(0, 4))


@pytest.mark.parametrize(
    ("kind", "cp", "grid", "expected"),
    [("1d", 4, None, (4, 1)), ("2d", 4, None, (2, 2)), ("2d", 8, None, (2, 4)), ("2d", 6, [3, 2], (3, 2)),
     ("2d", 7, None, (1, 7))],
)  # fmt: skip
def test_from_config(kind, cp, grid, expected):
    topology = Topology.from_config(kind, cp, grid)
    assert topology.grid == expected and topology.kind is TopologyKind(kind)
    assert topology.tiling == Tiling(*expected)


@pytest.mark.parametrize(
    ("kind", "cp", "grid", "message"),
    [("3d", 2, None, "topology.kind=3d: allowed values are 1d, 2d"), ("1d", 0, None, "topology.cp=0"),
     ("1d", 2, [2, 1], "only for topology.kind=2d"), ("2d", 4, [3, 2], "whose product is topology.cp=4")],
)  # fmt: skip
def test_from_config_names_the_bad_setting(kind, cp, grid, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        Topology.from_config(kind, cp, grid)


def test_labels():
    assert Topology.from_config("1d", 2).label == "1d"
    assert Topology.from_config("2d", 6, [2, 3]).label == "2d 2x3"
    assert str(TopologyKind.two_d) == "2d"
