"""Real inputs from feature files: checked against the contract, sharded like synthesized ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cpbench.core import Shape, Topology
from cpbench.inputs import FEATURES, FeatureError, load_features, shard_features, synthesize
from cpbench.inputs.make_example import ONE_RANK, whole_features

SHAPE = Shape(120, 0, 6)
SEED = 3


@pytest.fixture
def arrays() -> dict[str, np.ndarray]:
    shard = synthesize(SHAPE, ONE_RANK, (0, 0), SEED)
    return {name: values.copy() for name, values in whole_features(shard).items()}


def write(tmp_path: Path, arrays: dict[str, np.ndarray], name: str = "features.npz") -> str:
    path = tmp_path / name
    if name.endswith(".npz"):
        np.savez(path, **arrays)
    else:
        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}, path)
    return str(path)


def test_file_shards_equal_synthesized_shards(tmp_path, arrays):
    features = load_features(write(tmp_path, arrays))
    assert features.shape == Shape(120, 9 * 120, 6)
    for topology in (Topology("1d", 3, (3, 1)), Topology("2d", 4, (2, 2)), Topology("1d", 4, (4, 1))):
        rows, cols = topology.grid
        for coords in [(r, c) for r in range(rows) for c in range(cols)]:
            from_file = shard_features(features, topology, coords)
            made = synthesize(SHAPE, topology, coords, SEED)
            named = dict(made.tensors())
            assert dict(from_file.tensors()).keys() == named.keys()
            for name, tensor in from_file.tensors():
                assert tensor.dtype == named[name].dtype and torch.equal(tensor, named[name]), (coords, name)
            assert (from_file.n_atoms_padded, from_file.atom_start) == (made.n_atoms_padded, made.atom_start)


def test_torch_file_with_one_hot_and_float_masks(tmp_path, arrays):
    reference = load_features(write(tmp_path, arrays))
    arrays["res_type"] = np.eye(33, dtype=np.float32)[arrays["res_type"]]
    arrays["ref_element"] = np.eye(128, dtype=np.int64)[arrays["ref_element"]]
    arrays["ref_atom_name_chars"] = np.eye(64, dtype=np.bool_)[arrays["ref_atom_name_chars"]]
    arrays["msa"] = np.eye(33, dtype=np.uint8)[arrays["msa"]]
    for name in ("token_pad_mask", "atom_pad_mask", "msa_mask", "has_deletion", "token_bonds"):
        arrays[name] = arrays[name].astype(np.float32)
    arrays["residue_index"] = arrays["residue_index"].astype(np.int32)
    features = load_features(write(tmp_path, arrays, "features.pt"))
    for name, values in reference.arrays.items():
        got = features.arrays[name]
        assert values.dtype == got.dtype and np.array_equal(values, got), name


def test_padded_file_and_optional_features(tmp_path, arrays):
    """Padding in the file is stripped; optional features are derived."""
    n, m, s = 120, len(arrays["atom_to_token"]), 6
    padded = dict(arrays)
    for spec in FEATURES:
        if spec.name not in arrays:
            continue
        widths = [(0, {"N": 8, "M": 5}.get(dim, 0)) for dim in spec.dims]
        padded[spec.name] = np.pad(arrays[spec.name], widths)
    padded["token_pad_mask"] = np.arange(n + 8) < n
    padded["atom_pad_mask"] = np.arange(m + 5) < m
    features = load_features(write(tmp_path, padded))
    assert features.shape == Shape(n, m, s)
    for name in ("token_index", "token_pad_mask", "atom_pad_mask", "msa_mask", "has_deletion", "token_bonds"):
        del arrays[name]
    del arrays["profile"], arrays["deletion_mean"]
    derived = load_features(write(tmp_path, arrays))
    for name in ("token_index", "token_pad_mask", "atom_pad_mask", "msa_mask", "has_deletion", "token_bonds"):
        assert np.array_equal(derived.arrays[name], features.arrays[name]), name
    assert np.allclose(derived.arrays["profile"].sum(1), 1.0)
    assert np.array_equal(derived.arrays["profile"].argmax(1) >= 0, np.ones(n, bool))
    counts = np.stack([(arrays["msa"] == k).sum(0) for k in range(33)], 1) / s
    assert np.allclose(derived.arrays["profile"], counts)
    assert np.allclose(derived.arrays["deletion_mean"], arrays["deletion_value"].mean(0))


def test_msa_depth_pads_or_crops(tmp_path, arrays):
    features = load_features(write(tmp_path, arrays))
    topology = Topology("1d", 2, (2, 1))
    deep = shard_features(features, topology, (1, 0), msa_depth=9)
    assert deep.msa["msa"].shape == (9, 60) and deep.msa_depth == 9
    assert deep.msa["msa_mask"][:6].all() and not deep.msa["msa_mask"][6:].any()
    assert not deep.msa["msa"][6:].any() and not deep.msa["deletion_value"][6:].any()
    shallow = shard_features(features, topology, (1, 0), msa_depth=2)
    assert torch.equal(shallow.msa["msa"], deep.msa["msa"][:2])


def corrupt(arrays, name, value):
    arrays[name] = value
    return arrays


def drop(arrays, *names):
    for name in names:
        del arrays[name]
    return arrays


A2T = "atom_to_token"
BAD = {
    "missing": (lambda a: drop(a, "ref_pos"), r"missing feature: 'ref_pos' \(float array \[M, 3\]"),
    "missing_two": (lambda a: drop(a, "msa", "asym_id"), r"missing features: 'asym_id' .*'msa'"),
    "shape": (lambda a: corrupt(a, "asym_id", a["asym_id"][:-1]),
              r"feature 'asym_id': axis 0 is N = 120 \(set by 'res_type'\), got shape \(119,\)"),
    "fixed_axis": (lambda a: corrupt(a, "ref_pos", a["ref_pos"][:, :2]),
                   r"feature 'ref_pos': axis 1 is 3 = 3"),
    "rank": (lambda a: corrupt(a, "deletion_value", a["deletion_value"][0]),
             r"'deletion_value': expected float"),
    "dtype_index": (lambda a: corrupt(a, "res_type", a["res_type"].astype(np.float32)),
                    r"feature 'res_type': dtype float32 is not allowed; expected integer array \[N\]"),
    "dtype_float": (lambda a: corrupt(a, "ref_pos", a["ref_pos"] > 0), r"feature 'ref_pos': dtype bool"),
    "res_type_range": (lambda a: corrupt(a, "res_type", a["res_type"] + 20),
                       r"feature 'res_type': values must be in \[0, 33\)"),
    "negative_id": (lambda a: corrupt(a, "asym_id", a["asym_id"] - 1),
                    r"feature 'asym_id': values must be in >= 0"),
    "mask_range": (lambda a: corrupt(a, "token_pad_mask", np.full(120, 2)),
                   r"feature 'token_pad_mask': a mask must hold only 0 and 1, found 2"),
    "msa_mask_range": (lambda a: corrupt(a, "msa_mask", np.full((6, 120), 0.5)),
                       r"feature 'msa_mask': a mask must hold only 0 and 1, found 0.5"),
    "mask_order": (lambda a: corrupt(a, "token_pad_mask", np.arange(120) % 2 == 0),
                   r"feature 'token_pad_mask': padding \(0\) must follow every real entry"),
    "atom_order": (lambda a: corrupt(a, A2T, a[A2T][::-1].copy()),
                   r"feature 'atom_to_token': must be non-decreasing over real atoms"),
    "atom_range": (lambda a: corrupt(a, A2T, a[A2T] + 1),
                   r"feature 'atom_to_token': real atoms must point at real tokens \[0, 120\), found 120"),
    "atomless_token": (lambda a: corrupt(a, A2T, np.where(a[A2T] == 5, 4, a[A2T])),
                       r"'atom_to_token': every real token needs at least one atom; token 5 has none"),
    "query_row": (lambda a: corrupt(a, "msa", np.roll(a["msa"], 1, axis=0)),
                  r"feature 'msa': row 0 must be the query sequence"),
    "deletion_range": (lambda a: corrupt(a, "deletion_value", a["deletion_value"] + 1.5),
                       r"feature 'deletion_value': values must be in \[0, 1\]"),
    "nan": (lambda a: corrupt(a, "ref_charge", np.full_like(a["ref_charge"], np.nan)),
            r"'ref_charge': holds NaN"),
    "one_hot": (lambda a: corrupt(a, "res_type", np.ones((120, 33), np.int64)),
                r"feature 'res_type': a one-hot row holds more than one 1"),
    "bonds": (lambda a: corrupt(a, "token_bonds", np.triu(np.ones((120, 120), bool), 1)),
              r"feature 'token_bonds': must be symmetric"),
    "pair_mask": (lambda a: corrupt(a, "pair_mask", np.zeros((120, 120), bool)),
                  r"feature 'pair_mask': expected"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD.keys())
def test_bad_files_are_rejected_by_name(tmp_path, arrays, case):
    change, message = BAD[case]
    path = write(tmp_path, change(arrays))
    with pytest.raises(FeatureError, match=message) as err:
        load_features(path)
    assert str(err.value).startswith(path)


def test_bad_file_kinds(tmp_path, arrays):
    with pytest.raises(FeatureError, match="no such file"):
        load_features(str(tmp_path / "absent.npz"))
    other = tmp_path / "features.txt"  # .json and .yaml are complexes (tests/unit/test_inputs_complex.py)
    other.write_text("{}")
    with pytest.raises(FeatureError, match=r"expected a \.npz file or a torch file"):
        load_features(str(other))
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(3)], listed)
    with pytest.raises(FeatureError, match="must hold a dict of tensors, got list"):
        load_features(str(listed))
    arrays["res_type"] = [1, 2, 3]
    with pytest.raises(FeatureError, match="feature 'res_type': expected an array, got list"):
        load_features(_torch_with_list(tmp_path, arrays))


def _torch_with_list(tmp_path: Path, arrays: dict) -> str:
    path = tmp_path / "lists.pt"
    tensors = {
        k: v if isinstance(v, list) else torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()
    }
    torch.save(tensors, path)
    return str(path)
