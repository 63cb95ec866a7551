"""Boltz's input YAML, read into a `Complex`. Field names and meanings follow Boltz's
docs/prediction.md: `sequences` of protein, dna, rna and ligand entries (`id`, `sequence`, `msa`,
`modifications`, `smiles` or `ccd`) and `constraints` of kind `bond`. Pocket and contact
constraints, templates and properties do not change the features and are not read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cpbench.inputs.complex import (
    Complex,
    Entity,
    InputError,
    Msa,
    atom_ref,
    ligand_fields,
    modifications,
    polymer_sequence,
    sequence_entry,
    sequences_of,
)


def _msa(value: Any, folder: Path, where: str) -> Msa | None:
    """`msa: <file>.a3m`; `empty` or unset: the query alone."""
    if value is None or value == "empty":
        return None
    if not isinstance(value, str):
        raise InputError(f"{where}: 'msa' must be the path of an .a3m file or 'empty', got {value!r}")
    if value.endswith(".csv"):
        raise InputError(f"{where}: msa={value}: paired CSV MSAs are not read; give an .a3m file")
    return Msa(path=folder / value)


def _entity(item: Any, k: int, folder: Path) -> Entity:
    kind, entry, ids, where = sequence_entry(item, k, ("protein", "dna", "rna", "ligand"))
    if kind == "ligand":
        smiles, codes = ligand_fields(entry, where, "ccd")
        return Entity(kind=kind, ids=ids, where=where, smiles=smiles, ccd_codes=codes)
    unpaired = _msa(entry.get("msa"), folder, where) if kind == "protein" else None
    mods = modifications(entry, where, "ccd", "position")
    sequence = polymer_sequence(entry, where)
    return Entity(kind=kind, ids=ids, where=where, sequence=sequence, modifications=mods, unpaired=unpaired)


def read_boltz(path: Path) -> Complex:
    try:
        doc = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        lines = str(err).strip().splitlines()
        raise InputError(f"not valid YAML ({' '.join(line.strip() for line in lines[:3])})") from None
    entities = [
        _entity(item, k, path.parent) for k, item in enumerate(sequences_of(doc, "Boltz's input format"))
    ]
    bonds = []
    for k, constraint in enumerate(doc.get("constraints") or []):
        if isinstance(constraint, dict) and "bond" in constraint:
            where, bond = f"constraints[{k}] (bond)", constraint["bond"]
            if not isinstance(bond, dict):
                raise InputError(f"{where}: a bond has 'atom1' and 'atom2', each [chain, residue, atom]")
            bonds.append((atom_ref(bond.get("atom1"), where), atom_ref(bond.get("atom2"), where), where))
    return Complex(name=path.stem, entities=entities, bonds=bonds)
