"""AlphaFold3's input JSON (`dialect: alphafold3`), read into a `Complex`. Field names and meanings
follow AlphaFold3's docs/input.md: `sequences` of protein, rna, dna and ligand entries, MSAs inline or
by path, `modifications`, `bondedAtomPairs`. Templates, seeds and descriptions do not change the
features' shapes and are not read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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

# The keys of a modification entry, (CCD code, 1-based position), and the MSAs, per polymer type.
_MODIFICATION_KEYS = {
    "protein": ("ptmType", "ptmPosition"),
    "rna": ("modificationType", "basePosition"),
    "dna": ("modificationType", "basePosition"),
}
_MSA_FIELDS = {"protein": ("unpaired", "paired"), "rna": ("unpaired",), "dna": ()}


def _msa(entry: dict[str, Any], field: str, folder: Path, where: str) -> Msa | None:
    """`<field>Msa` (inline) or `<field>MsaPath`; unset, null or "" mean none."""
    inline, path = entry.get(f"{field}Msa"), entry.get(f"{field}MsaPath")
    if inline and path:
        raise InputError(f"{where}: {field}Msa and {field}MsaPath exclude each other; give one")
    if path:
        return Msa(path=folder / path)
    return Msa(text=inline) if inline else None


def _entity(item: Any, k: int, folder: Path) -> Entity:
    kind, entry, ids, where = sequence_entry(item, k, ("protein", "rna", "dna", "ligand"))
    if kind == "ligand":
        smiles, codes = ligand_fields(entry, where, "ccdCodes")
        return Entity(kind=kind, ids=ids, where=where, smiles=smiles, ccd_codes=codes)
    msas = {field: _msa(entry, field, folder, where) for field in _MSA_FIELDS[kind]}
    mods = modifications(entry, where, *_MODIFICATION_KEYS[kind])
    return Entity(
        kind=kind, ids=ids, where=where, sequence=polymer_sequence(entry, where), modifications=mods, **msas
    )


def read_alphafold3(path: Path) -> Complex:
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"not valid JSON ({err})") from None
    sequences = sequences_of(doc, "AlphaFold3's input format")
    if doc.get("dialect") != "alphafold3":
        raise InputError(
            f"'dialect' must be 'alphafold3' (AlphaFold3's input format), got {doc.get('dialect')!r}"
        )
    entities = [_entity(item, k, path.parent) for k, item in enumerate(sequences)]
    bonds = []
    for k, pair in enumerate(doc.get("bondedAtomPairs") or []):
        where = f"bondedAtomPairs[{k}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise InputError(f"{where}: a bond is a pair of atoms, each [chain, residue, atom]")
        bonds.append((atom_ref(pair[0], where), atom_ref(pair[1], where), where))
    name = doc.get("name")
    return Complex(name=name if isinstance(name, str) and name else path.stem, entities=entities, bonds=bonds)
