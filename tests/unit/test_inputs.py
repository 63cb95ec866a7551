"""Synthesized fold inputs: valid by construction, and shards that equal the whole bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cpbench.core import Shape, Topology
from cpbench.inputs import SPECS, FoldShard, chains_from_seed, parse_chains, synthesize, validate_features
from cpbench.inputs.contract import DNA, LIGAND, MAX_DELETIONS, PROTEIN, RNA, UNK, deletion_value_of
from cpbench.inputs.make_example import ONE_RANK, whole_features
from cpbench.inputs.synth import SynthSource

TOPOLOGIES = {
    "1d-cp1": Topology("1d", 1, (1, 1)),
    "1d-cp2": Topology("1d", 2, (2, 1)),
    "1d-cp3": Topology("1d", 3, (3, 1)),
    "1d-cp4": Topology("1d", 4, (4, 1)),
    "2d-2x2": Topology("2d", 4, (2, 2)),
    "2d-1x2": Topology("2d", 2, (1, 2)),
    "2d-2x1": Topology("2d", 2, (2, 1)),
}


def all_shards(shape: Shape, topology: Topology, seed: int, **kw) -> dict[tuple[int, int], FoldShard]:
    rows, cols = topology.grid
    return {(r, c): synthesize(shape, topology, (r, c), seed, **kw) for r in range(rows) for c in range(cols)}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()


def assert_zero(t: torch.Tensor, what: str) -> None:
    assert not t.any(), f"{what}: padding must be zero"


# --- valid by construction -------------------------------------------------------------------

CASES = [  # (n_tokens, n_atoms (0: atoms_per_token * N), msa_depth, seed, atoms_per_token)
    (1, 0, 1, 0, 9),
    (2, 3, 0, 1, 9),
    (7, 0, 2, 2, 21),
    (31, 31, 3, 3, 9),
    (64, 500, 4, 4, 9),
    (97, 0, 5, 5, 3),
    (150, 0, 6, 6, 9),
    (256, 0, 8, 7, 21),
    (333, 2000, 3, 8, 9),
    (700, 0, 4, 9, 9),
    (1200, 0, 2, 10, 12),
]


@pytest.mark.parametrize(("n", "n_atoms", "depth", "seed", "apt"), CASES)
def test_synthesized_whole_is_valid(n, n_atoms, depth, seed, apt):
    shard = synthesize(Shape(n, n_atoms, depth), ONE_RANK, (0, 0), seed, atoms_per_token=apt)
    t, a, m, p = shard.row_tokens, shard.atoms, shard.msa, shard.pair
    total = n_atoms or apt * n
    assert (shard.n_tokens, shard.n_tokens_padded, shard.n_atoms, shard.msa_depth) == (n, n, total, depth)
    assert shard.n_atoms_padded == shard.atom_block and shard.atom_block % 32 == 0
    assert total <= shard.n_atoms_padded < total + 32

    # Every feature has the contract's dtype, shape and value range.
    sizes = {"N": n, "M": shard.n_atoms_padded, "S": depth}
    for name, tensor in shard.tensors():
        spec = SPECS[name.split(".")[1]]
        assert tensor.dtype == getattr(torch, str(spec.dtype)), name
        assert tuple(tensor.shape) == spec.shape(sizes["N"], sizes["M"], sizes["S"]), name
        if tensor.numel() and spec.low is not None:
            assert tensor.min() >= spec.low, name
        if tensor.numel() and spec.high is not None:
            assert tensor.max() <= spec.high if spec.high_inclusive else tensor.max() < spec.high, name

    # Masks agree with the padding.
    assert t["token_pad_mask"].all() and torch.equal(p["pair_mask"], torch.ones(n, n, dtype=torch.bool))
    assert torch.equal(a["atom_pad_mask"], torch.arange(shard.n_atoms_padded) < total)
    assert m["msa_mask"].all()
    real = a["atom_pad_mask"]
    for name, values in a.items():
        if name not in ("atom_pad_mask", "atom_to_token"):
            assert_zero(values[~real], name)
    assert (a["atom_to_token"][~real] == n - 1).all()

    # Chains: ids constant per chain, residue_index restarting at 0 per chain.
    chains = chains_from_seed(seed, n)
    assert chains.n_tokens == n
    for c, (start, length) in enumerate(zip(chains.starts, chains.lengths, strict=True)):
        span = slice(int(start), int(start + length))
        assert (t["asym_id"][span] == c).all()
        assert (t["entity_id"][span] == int(chains.entity_id[c])).all()
        assert (t["sym_id"][span] == int(chains.sym_id[c])).all()
        mol = int(chains.mol_type[c])
        assert (t["mol_type"][span] == mol).all()
        expect = torch.zeros(int(length), dtype=torch.int64) if mol == LIGAND else torch.arange(int(length))
        assert torch.equal(t["residue_index"][span], expect)
        if mol == LIGAND:
            assert (t["res_type"][span] == UNK).all()
    assert torch.equal(t["token_index"], torch.arange(n))
    # Copies of an entity: same sequence, distinct sym_ids.
    for entity in np.unique(chains.entity_id):
        members = np.flatnonzero(chains.entity_id == entity)
        assert sorted(chains.sym_id[members]) == list(range(len(members)))
        seqs = {
            tuple(t["res_type"][chains.starts[c] : chains.starts[c] + chains.lengths[c]].tolist())
            for c in members
        }
        assert len(seqs) == 1

    # Atoms per token: within the configured range, summing to the total; atom_to_token monotone.
    counts = torch.bincount(a["atom_to_token"][real], minlength=n)
    low, high = SynthSource(chains, total, depth, seed, None).atom_counts_range()
    mean = total / n
    assert low >= 1 and low <= math.floor(mean) and high >= math.ceil(mean)
    assert counts.min() >= low and counts.max() <= high and counts.sum() == total
    assert (torch.diff(a["atom_to_token"]) >= 0).all()
    assert torch.equal(torch.repeat_interleave(torch.arange(n), counts), a["atom_to_token"][real])

    # MSA: row 0 is the query; deletions in range and consistent.
    if depth:
        assert torch.equal(m["msa"][0], t["res_type"])
        assert not m["has_deletion"][0].any()
    assert torch.equal(m["has_deletion"], m["deletion_value"] > 0)
    table = torch.from_numpy(deletion_value_of(np.arange(MAX_DELETIONS + 1)))
    assert torch.isin(m["deletion_value"], table).all()
    assert torch.equal(t["profile"].sum(1), torch.ones(n))
    ligand_columns = t["mol_type"] == LIGAND
    assert (m["msa"][1:, ligand_columns] == 1).all()

    # Token bonds: symmetric, between neighbouring tokens of one ligand chain only.
    bonds = p["token_bonds"]
    assert torch.equal(bonds, bonds.T)
    i, j = torch.nonzero(bonds, as_tuple=True)
    assert ((i - j).abs() == 1).all() and (t["mol_type"][i] == LIGAND).all()
    assert torch.equal(t["asym_id"][i], t["asym_id"][j])

    # The file validator accepts what synthesis makes.
    features = validate_features(whole_features(shard))
    assert features.shape == Shape(n, total, depth)


def test_atom_spread_is_the_configured_range():
    shape = Shape(400, 0, 1)
    tight = synthesize(shape, ONE_RANK, (0, 0), 3, atoms_per_token=9, atom_spread=0)
    wide = synthesize(shape, ONE_RANK, (0, 0), 3, atoms_per_token=9, atom_spread=5)
    count = [torch.bincount(s.atoms["atom_to_token"][s.atoms["atom_pad_mask"]]) for s in (tight, wide)]
    assert set(count[0].tolist()) == {9}
    assert count[1].min() >= 4 and count[1].max() <= 14 and len(set(count[1].tolist())) > 5
    assert count[1].sum() == 3600


def test_molecule_types_and_homomers_all_occur():
    """The drawn complexes exercise every molecule type and homomer copies."""
    chains = chains_from_seed(11, 20000)
    assert set(chains.mol_type.tolist()) == {PROTEIN, DNA, RNA, LIGAND}
    assert chains.sym_id.max() >= 1
    assert chains.n_tokens == 20000
    # The chains for N are the chains for N' > N, cut at N.
    smaller = chains_from_seed(11, 5000)
    c = len(smaller.lengths)
    assert np.array_equal(smaller.starts, chains.starts[:c]) and np.array_equal(
        smaller.mol_type, chains.mol_type[:c]
    )


def test_chains_from_a_description():
    chains = parse_chains("A:protein:50x2,R:rna:20,L:ligand:5")
    assert chains.names == ("A", "A2", "R", "L")
    assert chains.lengths.tolist() == [50, 50, 20, 5] and chains.starts.tolist() == [0, 50, 100, 120]
    assert chains.entity_id.tolist() == [0, 0, 1, 2] and chains.sym_id.tolist() == [0, 1, 0, 0]
    bad_descriptions = [
        ("A:protein", "NAME:TYPE"),
        ("A:peptide:5", "not one of"),
        ("A:rna:0", ">= 1"),
        ("A:rna:5,A:dna:4", "repeat"),
        ("A:rna:five", "integers"),
        ("", "no chains"),
    ]
    for bad, message in bad_descriptions:
        with pytest.raises(ValueError, match=message):
            parse_chains(bad)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="every token needs an atom"):
        synthesize(Shape(10, 5, 1), ONE_RANK, (0, 0), 0)
    with pytest.raises(ValueError, match="coords"):
        synthesize(Shape(10, 0, 1), TOPOLOGIES["1d-cp2"], (2, 0), 0)
    with pytest.raises(ValueError, match="chains hold"):
        synthesize(Shape(10, 0, 1), ONE_RANK, (0, 0), 0, chains=parse_chains("A:protein:9"))


# --- shards put together equal the whole ------------------------------------------------------


def assemble(shards: dict[tuple[int, int], FoldShard], whole: FoldShard) -> None:
    """Put the shards together and compare with the one-piece tensors, bit for bit."""
    any_shard = next(iter(shards.values()))
    rows, cols = any_shard.topology.grid
    n, n_pad = whole.n_tokens, any_shard.n_tokens_padded
    assert n_pad % math.lcm(rows, cols) == 0 and n_pad - n < math.lcm(rows, cols)
    block = any_shard.atom_block
    assert any_shard.n_atoms_padded == rows * block and block % math.lcm(32, cols) == 0
    assert any_shard.n_atoms_padded % math.lcm(32, rows * cols) == 0
    most = max(int(shard.atoms["atom_pad_mask"].sum()) for shard in shards.values())
    assert block - most < math.lcm(32, cols)  # no more padding than the alignment needs

    for name, ref in whole.row_tokens.items():
        row_parts = [shards[r, 0].row_tokens[name] for r in range(rows)]
        col_parts = [shards[0, c].col_tokens[name] for c in range(cols)]
        for joined in (torch.cat(row_parts), torch.cat(col_parts)):
            assert same_bits(joined[:n], ref), name
            assert_zero(joined[n:], name)
        for (r, c), shard in shards.items():  # replicated where the placement says so
            assert same_bits(shard.row_tokens[name], row_parts[r]) and same_bits(
                shard.col_tokens[name], col_parts[c]
            )

    for name, ref in whole.pair.items():
        joined = torch.cat(
            [torch.cat([shards[r, c].pair[name] for c in range(cols)], 1) for r in range(rows)]
        )
        assert same_bits(joined[:n, :n], ref), name
        assert_zero(joined[n:], name)
        assert_zero(joined[:, n:], name)

    for name, ref in whole.msa.items():
        joined = torch.cat([shards[r, 0].msa[name] for r in range(rows)], 1)
        assert same_bits(joined[:, :n], ref[:, :n]), name
        assert_zero(joined[:, n:], name)

    real_ref = whole.atoms["atom_pad_mask"]
    start = 0
    for r in range(rows):
        shard = shards[r, 0]
        real = shard.atoms["atom_pad_mask"]
        assert shard.atom_start == start and len(real) == block
        assert torch.equal(real, torch.arange(block) < int(real.sum()))  # padding at the block's end
        owner = shard.atoms["atom_to_token"]
        assert ((owner[real] >= shard.rows.start) & (owner[real] < shard.rows.stop)).all()  # co-located
        assert (owner[~real] == shard.rows.stop - 1).all()
        start += int(real.sum())
        for c in range(cols):
            for name in whole.atoms:
                assert same_bits(shards[r, c].atoms[name], shard.atoms[name])
    assert start == whole.n_atoms
    for name, ref in whole.atoms.items():
        joined = torch.cat(
            [shards[r, 0].atoms[name][shards[r, 0].atoms["atom_pad_mask"]] for r in range(rows)]
        )
        assert same_bits(joined, ref[real_ref]), name
        pad = torch.cat([shards[r, 0].atoms[name][~shards[r, 0].atoms["atom_pad_mask"]] for r in range(rows)])
        if name != "atom_to_token":
            assert_zero(pad, name)


@pytest.mark.parametrize("topology", TOPOLOGIES.values(), ids=TOPOLOGIES.keys())
@pytest.mark.parametrize(("n", "depth", "seed"), [(53, 5, 7), (5, 2, 1), (190, 3, 2)])
def test_shards_equal_the_whole(topology, n, depth, seed):
    shape = Shape(n, 0, depth)
    whole = synthesize(shape, ONE_RANK, (0, 0), seed)
    assemble(all_shards(shape, topology, seed), whole)


def test_grids_beyond_the_required_ones():
    shape = Shape(101, 700, 3)
    whole = synthesize(shape, ONE_RANK, (0, 0), 5)
    for grid in [(3, 2), (4, 4), (8, 1), (1, 3)]:
        assemble(all_shards(shape, Topology("2d", grid[0] * grid[1], grid), 5), whole)
