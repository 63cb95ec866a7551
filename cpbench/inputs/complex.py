"""A complex as both input formats describe it (AlphaFold3 JSON, Boltz YAML): entities with their
chain ids, sequences or ligand definitions, modifications, MSAs and covalent bonds. The format
readers fill it; `cpbench.inputs.tokenize` turns it into contract features."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpbench.inputs.contract import FeatureError


class InputError(FeatureError):
    """An input file (JSON or YAML complex, its MSA) that cannot be used; one line says why."""


@dataclass(frozen=True)
class Msa:
    """One A3M MSA of a chain: inline text, or a file (relative paths: to the input file)."""

    text: str | None = None
    path: Path | None = None


@dataclass(frozen=True)
class Entity:
    """One sequence entry: `kind` protein | rna | dna | ligand, its chain ids (copies), and either a
    polymer `sequence` with `modifications` (1-based position -> CCD code), or a ligand's `smiles`
    or `ccd_codes` (one residue each). `unpaired`/`paired`: the MSAs, None for none."""

    kind: str
    ids: tuple[str, ...]
    where: str  # how the input names this entry, for errors: "sequences[2] (protein A)"
    sequence: str = ""
    modifications: tuple[tuple[int, str], ...] = ()
    smiles: str | None = None
    ccd_codes: tuple[str, ...] = ()
    unpaired: Msa | None = None
    paired: Msa | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """Entries with equal keys are one entity (identical sequences share entity_id)."""
        return (self.kind, self.sequence, self.modifications, self.smiles, self.ccd_codes)


@dataclass(frozen=True)
class AtomRef:
    """An atom named as both formats name it: chain id, 1-based residue, atom name."""

    chain: str
    residue: int
    atom: str


@dataclass
class Complex:
    name: str
    entities: list[Entity]
    bonds: list[tuple[AtomRef, AtomRef, str]] = field(default_factory=list)  # (atom, atom, where)

    @property
    def n_chains(self) -> int:
        return sum(len(entity.ids) for entity in self.entities)


def chain_ids(value: Any, where: str) -> tuple[str, ...]:
    """`id: A` or `id: [A, B]`, as both formats allow."""
    ids = value if isinstance(value, list) else [value]
    if not ids or not all(isinstance(i, str) and i for i in ids):
        raise InputError(f"{where}: 'id' must be a chain id or a list of them, got {value!r}")
    return tuple(ids)


def atom_ref(value: Any, where: str) -> AtomRef:
    """`[CHAIN, RESIDUE, ATOM]`, the atom address of AlphaFold3's bondedAtomPairs and Boltz's bonds."""
    types = (str, int, str)
    if not isinstance(value, list) or len(value) != 3 or not all(map(isinstance, value, types)):
        raise InputError(f"{where}: an atom is [chain id, residue number (from 1), atom name], got {value!r}")
    return AtomRef(chain=value[0], residue=value[1], atom=value[2])


def sequences_of(doc: Any, what: str) -> list[Any]:
    """The `sequences` list of a parsed input document (`what`: its format, for the error)."""
    if not isinstance(doc, dict):
        raise InputError(f"expected a mapping with 'sequences' ({what})")
    sequences = doc.get("sequences")
    if not isinstance(sequences, list) or not sequences:
        raise InputError("'sequences' must be a non-empty list")
    return sequences


def sequence_entry(
    item: Any, k: int, kinds: tuple[str, ...]
) -> tuple[str, dict[str, Any], tuple[str, ...], str]:
    """One `sequences` item, `{kind: {id: ..., ...}}` in both formats: its kind, fields, chain ids
    and how errors name it."""
    if not isinstance(item, dict) or len(item) != 1 or next(iter(item)) not in kinds:
        raise InputError(f"sequences[{k}]: expected one of {', '.join(kinds)}, got {item!r:.60}")
    kind, entry = next(iter(item.items()))
    if not isinstance(entry, dict):
        raise InputError(f"sequences[{k}] ({kind}): expected a mapping of fields")
    ids = chain_ids(entry.get("id"), f"sequences[{k}] ({kind})")
    return kind, entry, ids, f"sequences[{k}] ({kind} {ids[0]})"


def polymer_sequence(entry: dict[str, Any], where: str) -> str:
    sequence = entry.get("sequence")
    if not isinstance(sequence, str) or not sequence:
        raise InputError(f"{where}: 'sequence' must be a non-empty string")
    return sequence


def ligand_fields(entry: dict[str, Any], where: str, ccd_key: str) -> tuple[str | None, tuple[str, ...]]:
    """A ligand's SMILES or CCD codes (`ccd_key`: a code or a list of them), exactly one of the two."""
    smiles, ccd = entry.get("smiles"), entry.get(ccd_key)
    if (smiles is None) == (ccd is None):
        raise InputError(f"{where}: give exactly one of 'smiles' and '{ccd_key}'")
    if smiles is not None and not isinstance(smiles, str):
        raise InputError(f"{where}: 'smiles' must be a string, got {smiles!r}")
    codes = () if ccd is None else tuple(ccd) if isinstance(ccd, list) else (ccd,)
    if ccd is not None and (not codes or not all(isinstance(code, str) for code in codes)):
        raise InputError(f"{where}: '{ccd_key}' must be a CCD code or a list of them, got {ccd!r}")
    return smiles, codes


def modifications(
    entry: dict[str, Any], where: str, code_key: str, position_key: str
) -> tuple[tuple[int, str], ...]:
    """A polymer's `modifications`, each a CCD code at a 1-based position, as (position, code)."""
    out = []
    for k, mod in enumerate(entry.get("modifications") or []):
        code, position = (mod.get(code_key), mod.get(position_key)) if isinstance(mod, dict) else (None, None)
        if not isinstance(code, str) or not isinstance(position, int):
            raise InputError(
                f"{where}: modifications[{k}] needs '{code_key}' (a CCD code) and '{position_key}' (from 1)"
            )
        out.append((position, code))
    return tuple(out)
