"""The inventory contract of fold inputs: every feature's name, shape, dtype, value range and
placement, written once so that synthesis, file validation, sharding and the docs agree.

Features are held in index form (`res_type` [N] rather than its one-hot [N, 33]): it is what an
embedding consumes and it keeps a shard small. Files may carry the one-hot form instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cpbench.core import Tiling

# Residue vocabulary (33 classes): 0 pads, 1 is the MSA gap, then amino acids, RNA and DNA.
AMINO_ACIDS = (
    "ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE",
    "LEU", "LYS", "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL",
)  # fmt: skip
RES_TYPES: tuple[str, ...] = (
    ("<pad>", "-", *AMINO_ACIDS, "UNK") + ("A", "G", "C", "U", "N") + ("DA", "DG", "DC", "DT", "DN")
)
PAD, GAP, UNK = 0, 1, RES_TYPES.index("UNK")
NUM_RES_TYPES = len(RES_TYPES)  # 33

# mol_type values; a ligand token is one ligand atom's token and has res_type UNK.
MOL_TYPES: tuple[str, ...] = ("protein", "dna", "rna", "ligand")
PROTEIN, DNA, RNA, LIGAND = range(4)

# Each molecule type's residue alphabet as (first class, count) in RES_TYPES; the unknown class
# of the type follows its alphabet.
ALPHABETS: dict[int, tuple[int, int]] = {
    PROTEIN: (RES_TYPES.index("ALA"), 20),
    RNA: (RES_TYPES.index("A"), 4),
    DNA: (RES_TYPES.index("DA"), 4),
    LIGAND: (UNK, 1),
}

NUM_ELEMENTS = 128  # ref_element classes: the atomic number (0: none)
NUM_NAME_CHARS = 64  # ref_atom_name_chars classes: ord(char) - 32 (0: space)
ATOM_NAME_LEN = 4
ATOM_ALIGN = 32  # every rank's atom block is a multiple of this (atom attention windows)

# Deletion counts d are stored as deletion_value = 2/pi * arctan(d / 3), in [0, 1).
MAX_DELETIONS = 20


def deletion_value_of(count: np.ndarray | int) -> np.ndarray:
    """The AlphaFold transform of a deletion count, as float32."""
    return (2.0 / np.pi * np.arctan(np.asarray(count, dtype=np.float64) / 3.0)).astype(np.float32)


class FeatureError(ValueError):
    """A feature file (or a complex) that breaks the inventory contract."""


@dataclass(frozen=True)
class FeatureSpec:
    """One feature. `dims` are symbols (N tokens, M atoms, S MSA rows) or fixed sizes; `kind` is
    `index` (integer classes or ids), `float`, or `mask` (0/1, held as bool)."""

    name: str
    group: str  # "token" | "atom" | "msa" | "pair"
    dims: tuple[str | int, ...]
    kind: str
    meaning: str
    index: str  # what an index value refers to: "global", "per chain", "class", or "-"
    low: float | None = None  # inclusive lower bound of the values
    high: float | None = None  # exclusive upper bound (inclusive for floats marked high_inclusive)
    high_inclusive: bool = False
    one_hot: int | None = None  # files may carry this feature one-hot with this many classes
    required: bool = True  # absent from a file: derived as `derived` says
    derived: str = ""

    @property
    def dtype(self) -> np.dtype:
        return np.dtype({"index": np.int64, "float": np.float32, "mask": np.bool_}[self.kind])

    def shape(self, n_tokens: int, n_atoms: int, msa_depth: int) -> tuple[int, ...]:
        sizes = {"N": n_tokens, "M": n_atoms, "S": msa_depth}
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)

    def dims_label(self) -> str:
        return "[" + ", ".join(str(d) for d in self.dims) + "]"

    def range_label(self) -> str:
        if self.kind == "mask":
            return "{0, 1}"
        if self.low is None and self.high is None:
            return "any finite" if self.kind == "float" else "any"
        low = "-inf" if self.low is None else f"{self.low:g}"
        if self.high is None:
            return f">= {low}"
        return f"[{low}, {self.high:g}" + ("]" if self.high_inclusive else ")")

    def placement(self, kind: str) -> str:
        """Where this feature lives on a CP rank for topology kind `1d` or `2d`."""
        if kind == "1d":
            return {
                "token": "rows [N/cp] split over cp; cols: all N on every rank",
                "pair": "[N/cp, N]: rows split over cp",
                "atom": "atoms of the rank's row tokens, [M/cp] split over cp",
                "msa": "[S, N/cp]: columns of the row tokens, split over cp",
            }[self.group]
        return {
            "token": "rows [N/rows] split over mesh rows; cols [N/cols] split over mesh cols",
            "pair": "[N/rows, N/cols]: rows over mesh rows, cols over mesh cols",
            "atom": "atoms of the row tokens, [M/rows] split over mesh rows, replicated over mesh cols",
            "msa": "[S, N/rows]: row-token columns split over mesh rows, replicated over mesh cols",
        }[self.group]


FEATURES: tuple[FeatureSpec, ...] = (
    # Tokens
    FeatureSpec("res_type", "token", ("N",), "index", "residue class (RES_TYPES); ligand tokens are UNK",
                "class", 0, NUM_RES_TYPES, one_hot=NUM_RES_TYPES),
    FeatureSpec("residue_index", "token", ("N",), "index",
                "residue number in its chain, restarting per chain; a ligand's tokens share one",
                "per chain", 0),
    FeatureSpec("token_index", "token", ("N",), "index", "the token's own position", "global", 0,
                required=False, derived="0, 1, ..., N-1"),
    FeatureSpec("asym_id", "token", ("N",), "index", "chain number, unique per chain", "global", 0),
    FeatureSpec("entity_id", "token", ("N",), "index", "entity number, shared by chains of one sequence",
                "global", 0),
    FeatureSpec("sym_id", "token", ("N",), "index", "copy number among the chains of one entity",
                "per entity", 0),
    FeatureSpec("mol_type", "token", ("N",), "index", "0 protein, 1 DNA, 2 RNA, 3 ligand", "class", 0,
                len(MOL_TYPES)),
    FeatureSpec("token_pad_mask", "token", ("N",), "mask", "1 for a real token, 0 for padding", "-",
                required=False, derived="all ones"),
    FeatureSpec("profile", "token", ("N", NUM_RES_TYPES), "float",
                "residue-class distribution of the MSA column; rows of real tokens sum to 1", "-", 0, 1,
                high_inclusive=True, required=False, derived="class frequencies over masked-in MSA rows"),
    FeatureSpec("deletion_mean", "token", ("N",), "float", "mean deletion_value of the MSA column", "-", 0, 1,
                high_inclusive=True, required=False, derived="mean deletion_value over masked-in MSA rows"),
    # Atoms
    FeatureSpec("ref_pos", "atom", ("M", 3), "float", "reference-conformer position (Angstrom)", "-"),
    FeatureSpec("ref_charge", "atom", ("M",), "float", "formal charge", "-"),
    FeatureSpec("ref_element", "atom", ("M",), "index", "atomic number", "class", 0, NUM_ELEMENTS,
                one_hot=NUM_ELEMENTS),
    FeatureSpec("ref_atom_name_chars", "atom", ("M", ATOM_NAME_LEN), "index",
                "atom name, ord(char) - 32 per character, space padded", "class", 0, NUM_NAME_CHARS,
                one_hot=NUM_NAME_CHARS),
    FeatureSpec("ref_space_uid", "atom", ("M",), "index",
                "reference-space id: equal for the atoms of one residue (synthesized: its first token)",
                "global", 0),
    FeatureSpec("atom_pad_mask", "atom", ("M",), "mask", "1 for a real atom, 0 for padding", "-",
                required=False, derived="all ones"),
    FeatureSpec("atom_to_token", "atom", ("M",), "index",
                "the atom's token; non-decreasing over real atoms, every real token has >= 1 atom", "global",
                0),
    # MSA
    FeatureSpec("msa", "msa", ("S", "N"), "index", "residue class per MSA row; row 0 is the query (res_type)",
                "class", 0, NUM_RES_TYPES, one_hot=NUM_RES_TYPES),
    FeatureSpec("has_deletion", "msa", ("S", "N"), "mask", "1 where deletions precede the residue", "-",
                required=False, derived="deletion_value > 0"),
    FeatureSpec("deletion_value", "msa", ("S", "N"), "float", "2/pi * arctan(deletions / 3)", "-", 0, 1,
                high_inclusive=True),
    FeatureSpec("msa_mask", "msa", ("S", "N"), "mask", "1 for a real MSA entry (real row and real token)",
                "-", required=False, derived="all ones"),
    # Pair
    FeatureSpec("token_bonds", "pair", ("N", "N"), "mask",
                "1 where a covalent bond joins tokens i and j (polymer-ligand, ligand-ligand); symmetric",
                "-", required=False, derived="no bonds"),
    FeatureSpec("pair_mask", "pair", ("N", "N"), "mask", "token_pad_mask[i] and token_pad_mask[j]", "-",
                required=False, derived="from token_pad_mask (a file's copy must match it)"),
)  # fmt: skip

SPECS: dict[str, FeatureSpec] = {spec.name: spec for spec in FEATURES}


def group(name: str) -> tuple[FeatureSpec, ...]:
    """The features of one group, in contract order."""
    return tuple(spec for spec in FEATURES if spec.group == name)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded_tokens(n_tokens: int, tiling: Tiling) -> int:
    """N padded so that both pair axes split evenly: the tiling's multiple."""
    return round_up(n_tokens, tiling.multiple)


def atom_block_size(atoms_per_row_block: np.ndarray, cols: int = 1) -> int:
    """Atoms every rank holds: the largest row block's real atoms rounded up to lcm(32, cols).
    One size for all blocks is what collectives need; lcm(32, cols) lets a 2d mesh row split its
    block evenly over its cols ranks, and makes the total, rows x block, a multiple of
    lcm(32, rows x cols)."""
    largest = int(np.max(atoms_per_row_block)) if len(atoms_per_row_block) else 0
    return round_up(largest, math.lcm(ATOM_ALIGN, cols))
