"""The bundled chemical components: each standard residue's and a few common modified residues' and
ligands' heavy atoms with reference coordinates, from the wwPDB Chemical Component Dictionary.

`ccd_components.json` holds, per CCD code, the heavy atoms in CCD order without the leaving atoms
(OXT of amino acids, OP3 of nucleotides, O1 of NAG...), their atomic numbers and formal charges,
the CCD's ideal coordinates and the bonds among them; its "source" entry says where it came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cpbench.inputs.contract import AMINO_ACIDS, DNA, PROTEIN, RNA

TABLE = Path(__file__).with_name("ccd_components.json")

# One-letter codes of each polymer type and the CCD code of the residue each stands for.
RESIDUE_CODES: dict[int, dict[str, str]] = {
    PROTEIN: dict(zip("ARNDCQEGHILKMFPSTWYV", AMINO_ACIDS, strict=True)),
    RNA: {"A": "A", "G": "G", "C": "C", "U": "U"},
    DNA: {"A": "DA", "G": "DG", "C": "DC", "T": "DT"},
}


@dataclass(frozen=True)
class Component:
    """One chemical component's heavy atoms: names, atomic numbers, formal charges, reference
    coordinates (Angstrom) and bonds (pairs of atom indices)."""

    code: str
    atoms: tuple[str, ...]
    elements: tuple[int, ...]
    charges: tuple[int, ...]
    coords: tuple[tuple[float, float, float], ...]
    bonds: tuple[tuple[int, int], ...]


@cache
def _components() -> dict[str, Component]:
    raw = json.loads(TABLE.read_text())["components"]
    return {
        code: Component(
            code=code,
            atoms=tuple(c["atoms"]),
            elements=tuple(c["elements"]),
            charges=tuple(c["charges"]),
            coords=tuple(tuple(xyz) for xyz in c["coords"]),
            bonds=tuple(tuple(b) for b in c["bonds"]),
        )
        for code, c in raw.items()
    }


def bundled_codes() -> tuple[str, ...]:
    return tuple(_components())


def component(code: str) -> Component | None:
    """The bundled component of a CCD code, or None when the table does not hold it."""
    return _components().get(code.upper())
