"""Real inputs: a user's feature file (.npz, or a torch file holding a dict of tensors) or complex
(AlphaFold3 JSON, Boltz YAML: `cpbench.inputs.structure`), checked against the contract with errors
that name the feature and what was expected, then sharded with the same layout as synthesized inputs."""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cpbench.core import Shape, Topology
from cpbench.inputs.contract import FEATURES, NUM_RES_TYPES, FeatureError, FeatureSpec, group
from cpbench.inputs.shard import FoldShard, build_shard

TORCH_SUFFIXES = (".pt", ".pth", ".torch")
COMPLEX_SUFFIXES = (".json", ".yaml", ".yml")  # cpbench.inputs.structure reads them
NAME_MEMBER = "input_name"  # an .npz may name its input (cpbench.inputs.convert writes it)


@dataclass
class FoldFeatures:
    """Validated whole-input features in contract form, padding stripped: tokens [N], atoms [M],
    MSA [S, N], token_bonds [N, N], with N, M the real token and atom counts."""

    arrays: dict[str, np.ndarray]
    path: str | None = None
    name: str | None = None  # the input's name: a JSON's `name`, else the file's stem
    n_tokens: int = field(init=False)
    n_atoms: int = field(init=False)
    msa_depth: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_tokens = len(self.arrays["res_type"])
        self.n_atoms = len(self.arrays["atom_to_token"])
        self.msa_depth = len(self.arrays["msa"])

    @property
    def shape(self) -> Shape:
        """The file's N_tokens, N_atoms and S, as results record them."""
        return Shape(n_tokens=self.n_tokens, n_atoms=self.n_atoms, msa_depth=self.msa_depth)

    @property
    def n_chains(self) -> int:
        return len(np.unique(self.arrays["asym_id"]))


def _expected(spec: FeatureSpec) -> str:
    kind = {"index": "integer", "float": "float", "mask": "0/1 (bool, integer or float)"}[spec.kind]
    one_hot = f" (or one-hot {spec.dims_label()[:-1]}, {spec.one_hot}])" if spec.one_hot else ""
    return f"{kind} array {spec.dims_label()}{one_hot}: {spec.meaning}"


def _as_numpy(name: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype in (torch.bfloat16, torch.float16):
            value = value.float()
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    raise FeatureError(f"feature '{name}': expected an array, got {type(value).__name__}")


def _from_one_hot(spec: FeatureSpec, values: np.ndarray) -> np.ndarray:
    """Class indices of a one-hot feature; an all-zero row is class 0 (padding)."""
    if values.dtype.kind not in "biuf" or not np.isin(values, (0, 1)).all():
        raise FeatureError(f"feature '{spec.name}': a one-hot form must hold only 0 and 1")
    if (values.sum(axis=-1) > 1).any():
        raise FeatureError(f"feature '{spec.name}': a one-hot row holds more than one 1")
    return values.argmax(axis=-1).astype(np.int64)


def _canonical(spec: FeatureSpec, values: np.ndarray, sizes: dict[str, tuple[int, str]]) -> np.ndarray:
    """Check the shape against `sizes` (binding unbound symbols), the dtype kind and the values."""
    name = spec.name
    if spec.one_hot and values.ndim == len(spec.dims) + 1 and values.shape[-1] == spec.one_hot:
        values = _from_one_hot(spec, values)
    if values.ndim != len(spec.dims):
        raise FeatureError(f"feature '{name}': expected {_expected(spec)}, got shape {values.shape}")
    for axis, (dim, size) in enumerate(zip(spec.dims, values.shape, strict=True)):
        if isinstance(dim, str) and dim not in sizes:
            sizes[dim] = (size, name)
        want, source = (dim, "fixed") if isinstance(dim, int) else sizes[dim]
        if size != want:
            where = "" if source == "fixed" else f" (set by '{source}')"
            raise FeatureError(
                f"feature '{name}': axis {axis} is {dim} = {want}{where}, got shape {values.shape}; "
                f"expected {_expected(spec)}"
            )
    kind = values.dtype.kind
    ok = {"index": kind in "iu", "float": kind in "iuf", "mask": kind in "biuf"}[spec.kind]
    if not ok:
        raise FeatureError(
            f"feature '{name}': dtype {values.dtype} is not allowed; expected {_expected(spec)}"
        )
    if kind == "f" and not np.isfinite(values).all():
        raise FeatureError(f"feature '{name}': holds NaN or infinite values")
    if spec.kind == "mask":
        if not np.isin(values, (0, 1)).all():
            bad = values[~np.isin(values, (0, 1))].flat[0]
            raise FeatureError(f"feature '{name}': a mask must hold only 0 and 1, found {bad}")
        return values.astype(np.bool_)
    if values.size and spec.low is not None and values.min() < spec.low:
        raise FeatureError(f"feature '{name}': values must be in {spec.range_label()}, found {values.min()}")
    if values.size and spec.high is not None:
        top = values.max()
        if top > spec.high or (top == spec.high and not spec.high_inclusive):
            raise FeatureError(f"feature '{name}': values must be in {spec.range_label()}, found {top}")
    return values.astype(spec.dtype)


def _real_prefix(mask: np.ndarray, name: str) -> int:
    """How many entries are real; padding must follow all of them."""
    count = int(mask.sum())
    if not mask[:count].all():
        raise FeatureError(f"feature '{name}': padding (0) must follow every real entry (1)")
    return count


def _derive(arrays: dict[str, np.ndarray], n: int, m: int) -> None:
    """Fill the optional features a file left out (SPECS[...].derived says how)."""
    s = len(arrays["msa"])
    arrays.setdefault("token_index", np.arange(n, dtype=np.int64))
    arrays.setdefault("token_pad_mask", np.ones(n, dtype=np.bool_))
    arrays.setdefault("atom_pad_mask", np.ones(m, dtype=np.bool_))
    arrays.setdefault("msa_mask", np.ones((s, n), dtype=np.bool_))
    arrays.setdefault("has_deletion", arrays["deletion_value"] > 0)
    arrays.setdefault("token_bonds", np.zeros((n, n), dtype=np.bool_))
    rows = np.maximum(arrays["msa_mask"].sum(axis=0), 1)
    if "profile" not in arrays:
        profile = np.zeros((n, NUM_RES_TYPES), dtype=np.float64)
        for row, mask in zip(arrays["msa"], arrays["msa_mask"], strict=True):
            profile[np.flatnonzero(mask), row[mask]] += 1
        arrays["profile"] = (profile / rows[:, None]).astype(np.float32)
    if "deletion_mean" not in arrays:
        total = np.where(arrays["msa_mask"], arrays["deletion_value"], 0).sum(axis=0, dtype=np.float64)
        arrays["deletion_mean"] = (total / rows).astype(np.float32)


def validate_features(
    raw: Mapping[str, Any], path: str | None = None, name: str | None = None
) -> FoldFeatures:
    """Whole-input features from a mapping of arrays or tensors, checked against the contract.
    Names outside the contract are ignored; padded tokens and atoms are stripped."""
    missing = [spec for spec in FEATURES if spec.required and spec.name not in raw]
    if missing:
        lines = "; ".join(f"'{spec.name}' ({_expected(spec)})" for spec in missing)
        raise FeatureError(f"missing feature{'s' if len(missing) > 1 else ''}: {lines}")
    sizes: dict[str, tuple[int, str]] = {}
    arrays = {
        spec.name: _canonical(spec, _as_numpy(spec.name, raw[spec.name]), sizes)
        for spec in FEATURES
        if spec.name in raw
    }
    n_file, m_file = sizes["N"][0], sizes["M"][0]
    n = _real_prefix(arrays.get("token_pad_mask", np.ones(n_file, np.bool_)), "token_pad_mask")
    m = _real_prefix(arrays.get("atom_pad_mask", np.ones(m_file, np.bool_)), "atom_pad_mask")
    if n == 0:
        raise FeatureError("feature 'token_pad_mask': the file holds no real token")
    if "pair_mask" in arrays:
        mask = arrays.pop("pair_mask")
        token_mask = np.arange(n_file) < n
        if not np.array_equal(mask, token_mask[:, None] & token_mask[None, :]):
            raise FeatureError("feature 'pair_mask': expected token_pad_mask[i] and token_pad_mask[j]")

    # Strip padding: tokens to N real, atoms to M real.
    for spec in FEATURES:
        if spec.name in arrays:
            index = tuple({"N": slice(0, n), "M": slice(0, m)}.get(d, slice(None)) for d in spec.dims)
            arrays[spec.name] = np.ascontiguousarray(arrays[spec.name][index])

    atom_to_token = arrays["atom_to_token"]
    if m and atom_to_token.max() >= n:
        raise FeatureError(
            f"feature 'atom_to_token': real atoms must point at real tokens [0, {n}), "
            f"found {atom_to_token.max()}"
        )
    if (np.diff(atom_to_token) < 0).any():
        at = int(np.flatnonzero(np.diff(atom_to_token) < 0)[0])
        raise FeatureError(
            f"feature 'atom_to_token': must be non-decreasing over real atoms, but atom {at + 1} "
            f"(token {atom_to_token[at + 1]}) follows atom {at} (token {atom_to_token[at]})"
        )
    counts = np.bincount(atom_to_token, minlength=n)
    if (counts == 0).any():
        raise FeatureError(
            f"feature 'atom_to_token': every real token needs at least one atom; token "
            f"{int(np.flatnonzero(counts == 0)[0])} has none"
        )
    msa = arrays["msa"]
    if len(msa) and not np.array_equal(msa[0], arrays["res_type"]):
        at = int(np.flatnonzero(msa[0] != arrays["res_type"])[0])
        raise FeatureError(
            f"feature 'msa': row 0 must be the query sequence (res_type); token {at} has {msa[0, at]}, "
            f"res_type {arrays['res_type'][at]}"
        )
    bonds = arrays.get("token_bonds")
    if bonds is not None and not np.array_equal(bonds, bonds.T):
        raise FeatureError("feature 'token_bonds': must be symmetric")
    _derive(arrays, n, m)
    kept = {spec.name: arrays[spec.name] for spec in FEATURES if spec.name != "pair_mask"}
    return FoldFeatures(arrays=kept, path=path, name=name)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _read_npz(file: Path) -> dict[str, np.ndarray]:
    """Every member of an .npz; a file that is no zip, a truncated one or a corrupt member is named
    (and the member) rather than surfacing as numpy's or zipfile's traceback."""
    if not zipfile.is_zipfile(file):
        raise FeatureError(f"{file}: not an .npz archive (not a zip file, or a truncated one)")
    npz = np.load(file, allow_pickle=False)
    arrays = {}
    with npz:
        for name in npz.files:
            try:
                arrays[name] = npz[name]
            except Exception as err:
                raise FeatureError(f"{file}: member '{name}' cannot be read ({_first_line(err)})") from None
    return arrays


def load_features(path: str, seed: int = 0) -> FoldFeatures:
    """A feature file (.npz, or a torch file of a dict of tensors) or a complex (.json, .yaml), checked
    against the contract. `seed` draws a complex's ligand conformers (the run's seed)."""
    file = Path(path)
    if not file.is_file():
        raise FeatureError(f"data.path={path}: no such file")
    name = file.stem
    if file.suffix in COMPLEX_SUFFIXES:
        from cpbench.inputs.structure import structure_features  # it imports this module

        try:
            name, raw = structure_features(file, seed)
        except FeatureError as err:
            raise FeatureError(f"{path}: {err}") from None
    elif file.suffix == ".npz":
        raw: Mapping[str, Any] = _read_npz(file)
        if NAME_MEMBER in raw and raw[NAME_MEMBER].dtype.kind == "U" and raw[NAME_MEMBER].ndim == 0:
            name = str(raw[NAME_MEMBER])
    elif file.suffix in TORCH_SUFFIXES:
        try:
            raw = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises many kinds (IndexError, RuntimeError, UnpicklingError...)
            raise FeatureError(f"{path}: not a readable torch file ({_first_line(err)})") from None
        if not isinstance(raw, Mapping):
            raise FeatureError(
                f"{path}: a torch feature file must hold a dict of tensors, got {type(raw).__name__}"
            )
    else:
        raise FeatureError(
            f"{path}: expected a .npz file or a torch file ({', '.join(TORCH_SUFFIXES)}), "
            "or a complex: AlphaFold3 .json, Boltz .yaml"
        )
    try:
        return validate_features(raw, path=str(file), name=name)
    except FeatureError as err:
        raise FeatureError(f"{path}: {err}") from None


def save_features(arrays: Mapping[str, np.ndarray], path: str, name: str | None = None) -> None:
    """Write contract features as a compressed .npz (pair_mask is derived, so left out), with the
    input's name when given."""
    kept = {key: np.asarray(v) for key, v in arrays.items() if key != "pair_mask"}
    if name is not None:
        kept[NAME_MEMBER] = np.asarray(name)
    np.savez_compressed(path, **kept)


class FileSource:
    """FeatureSource over whole validated features: shards are slices of them (copies)."""

    def __init__(self, features: FoldFeatures, msa_depth: int | None):
        self.arrays = features.arrays
        self.n_tokens, self.n_atoms = features.n_tokens, features.n_atoms
        self.msa_depth = features.msa_depth if msa_depth is None else msa_depth
        if self.msa_depth < 0:
            raise ValueError(f"msa_depth must be >= 0, got {self.msa_depth}")
        counts = np.bincount(self.arrays["atom_to_token"], minlength=self.n_tokens)
        self._prefix = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def atom_prefix(self, tokens: np.ndarray) -> np.ndarray:
        return self._prefix[np.clip(tokens, 0, self.n_tokens)]

    def token_features(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {spec.name: self.arrays[spec.name][start:stop].copy() for spec in group("token")}

    def atom_features(self, start: int, stop: int) -> dict[str, np.ndarray]:
        lo, hi = self._prefix[start], self._prefix[stop]
        return {spec.name: self.arrays[spec.name][lo:hi].copy() for spec in group("atom")}

    def msa_features(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows beyond the file's are padding (masked out); fewer rows keep the first ones."""
        out = {}
        for spec in group("msa"):
            values = self.arrays[spec.name][: self.msa_depth, start:stop]
            out[spec.name] = np.zeros((self.msa_depth, stop - start), dtype=spec.dtype)
            out[spec.name][: len(values)] = values
        return out

    def fill_token_bonds(self, rows: range, cols: range, out: np.ndarray) -> None:
        out[: len(rows), : len(cols)] = self.arrays["token_bonds"][
            rows.start : rows.stop, cols.start : cols.stop
        ]


def shard_features(
    features: FoldFeatures, topology: Topology, coords: tuple[int, int], msa_depth: int | None = None
) -> FoldShard:
    """This rank's shard of file features, laid out as `synthesize` lays out its own.
    `msa_depth` pads (masked-out rows) or crops the MSA to what the workload needs."""
    return build_shard(FileSource(features, msa_depth), topology, coords)
