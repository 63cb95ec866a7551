"""A ligand given by SMILES, through RDKit: its heavy atoms, elements, formal charges, bonds, and a
reference conformer from ETKDG seeded from the run's seed (a pure function of the seed)."""

from __future__ import annotations

from collections import Counter

from cpbench.inputs.ccd import Component
from cpbench.inputs.contract import ATOM_NAME_LEN


class LigandError(ValueError):
    """A SMILES that RDKit cannot read or embed; the message says which."""


def ligand_from_smiles(smiles: str, seed: int) -> Component:
    """The SMILES's heavy atoms in RDKit's order, named by element and count (C1, C2, O1, ...)."""
    try:
        from rdkit import Chem, RDLogger
        from rdkit.Chem import AllChem
    except ImportError:
        raise LigandError(
            f"SMILES '{smiles}' needs RDKit, an optional extra: pip install 'cpbench[ligands]'"
        ) from None

    RDLogger.DisableLog("rdApp.*")  # RDKit's own messages would make the one-line error several
    mol = Chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() == 0:
        raise LigandError(f"unreadable SMILES '{smiles}'")
    with_h = Chem.AddHs(mol)
    params = AllChem.ETKDGv3()
    params.randomSeed = seed & 0x7FFFFFFF  # RDKit takes a non-negative 32-bit seed
    if AllChem.EmbedMolecule(with_h, params) != 0:
        params.useRandomCoords = True  # RDKit's fallback for molecules ETKDG's first start misses
        if AllChem.EmbedMolecule(with_h, params) != 0:
            raise LigandError(f"RDKit found no conformer for SMILES '{smiles}' (seed {seed})")
    heavy = Chem.RemoveHs(with_h)
    positions = heavy.GetConformer().GetPositions()
    counts: Counter[str] = Counter()
    names = []
    for atom in heavy.GetAtoms():
        symbol = atom.GetSymbol().upper()
        counts[symbol] += 1
        names.append(f"{symbol}{counts[symbol]}")
    if max(len(name) for name in names) > ATOM_NAME_LEN:
        raise LigandError(f"SMILES '{smiles}': too many atoms to name in {ATOM_NAME_LEN} characters")
    return Component(
        code="SMILES",
        atoms=tuple(names),
        elements=tuple(atom.GetAtomicNum() for atom in heavy.GetAtoms()),
        charges=tuple(atom.GetFormalCharge() for atom in heavy.GetAtoms()),
        coords=tuple(tuple(float(v) for v in xyz) for xyz in positions),
        bonds=tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in heavy.GetBonds())),
    )
