"""A `Complex` as contract features, tokenized as AlphaFold3 does: one token per standard residue or
nucleotide, one per heavy atom of a ligand and of a modified residue (AlphaFold3 supplement, 2.6).

- Atoms: a standard residue's heavy atoms from the bundled CCD table (`cpbench.inputs.ccd`), a
  modified residue's or CCD ligand's likewise, a SMILES ligand's from RDKit with an ETKDG conformer
  seeded from the run's seed. `ref_space_uid` numbers residues (a ligand component is one).
- Chains: `asym_id` numbers chains, `entity_id` entries of identical content (first appearance),
  `sym_id` the copies of an entity. `residue_index` counts residues from 0 per chain (a ligand's
  components: 0, 1, ...; all atom tokens of one residue share its number).
- MSA: row 0 is the query; then each chain's paired rows (row k of every chain side by side), then
  its unpaired rows likewise, a chain with fewer rows (or none: DNA, ligands, no MSA) filled with
  gaps, so S = 1 + the most paired rows + the most unpaired rows of any chain (each MSA's own query
  row dropped). The atom tokens of a modified residue repeat its column. Lower-case letters count as
  deletions before the next column.
- `token_bonds`: the bonds inside each atom-tokenized component, and the input's explicit bonds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cpbench.inputs.a3m import Alignment, MsaError, parse_a3m, read_a3m_file
from cpbench.inputs.ccd import RESIDUE_CODES, Component, bundled_codes, component
from cpbench.inputs.complex import AtomRef, Complex, Entity, InputError, Msa
from cpbench.inputs.contract import (
    ATOM_NAME_LEN,
    DNA,
    GAP,
    LIGAND,
    NUM_NAME_CHARS,
    PROTEIN,
    RES_TYPES,
    RNA,
    UNK,
    deletion_value_of,
)
from cpbench.inputs.ligand import LigandError, ligand_from_smiles

MOL_TYPE_OF = {"protein": PROTEIN, "dna": DNA, "rna": RNA, "ligand": LIGAND}
# The class of a letter outside a polymer type's alphabet, in an MSA row.
UNKNOWN_CLASS = {PROTEIN: UNK, RNA: RES_TYPES.index("N"), DNA: RES_TYPES.index("DN")}


def residue_class(mol_type: int, letter: str) -> int:
    """The res_type class of a one-letter code of a polymer type."""
    code = RESIDUE_CODES[mol_type][letter]
    return RES_TYPES.index(code)


def _msa_class(mol_type: int, letter: str) -> int:
    if letter == "-":
        return GAP
    return residue_class(mol_type, letter) if letter in RESIDUE_CODES[mol_type] else UNKNOWN_CLASS[mol_type]


TOKEN_KEYS = ("res_type", "residue_index", "asym_id", "entity_id", "sym_id", "mol_type")
ATOM_KEYS = ("ref_pos", "ref_charge", "ref_element", "ref_atom_name_chars", "ref_space_uid", "atom_to_token")


@dataclass
class _Residue:
    """A residue as placed: its component, its first token, and whether each atom is a token."""

    component: Component
    first_token: int
    atomized: bool

    def token_of(self, atom: int) -> int:
        return self.first_token + atom if self.atomized else self.first_token


@dataclass
class _Builder:
    seed: int
    tokens: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in TOKEN_KEYS})
    atoms: dict[str, list] = field(default_factory=lambda: {k: [] for k in ATOM_KEYS})
    msa_column: list[tuple[int, int] | None] = field(default_factory=list)  # (entity, residue) per token
    bonds: list[tuple[int, int]] = field(default_factory=list)
    chains: dict[str, list[_Residue]] = field(default_factory=dict)
    n_residues: int = 0

    def add_residue(self, comp: Component, atomized: bool, res_type: int, chain: tuple[int, ...],
                    residue_index: int, column: tuple[int, int] | None) -> _Residue:  # fmt: skip
        """Tokens and atoms of one residue; `chain` is (asym_id, entity_id, sym_id, mol_type)."""
        first = len(self.tokens["res_type"])
        asym, entity, sym, mol_type = chain
        for _ in range(len(comp.atoms) if atomized else 1):
            for key, value in zip(
                self.tokens, (res_type, residue_index, asym, entity, sym, mol_type), strict=True
            ):
                self.tokens[key].append(value)
            self.msa_column.append(column)
        residue = _Residue(comp, first, atomized)
        for a, name in enumerate(comp.atoms):
            self.atoms["ref_pos"].append(comp.coords[a])
            self.atoms["ref_charge"].append(comp.charges[a])
            self.atoms["ref_element"].append(comp.elements[a])
            self.atoms["ref_atom_name_chars"].append(_name_chars(name, comp.code))
            self.atoms["ref_space_uid"].append(self.n_residues)
            self.atoms["atom_to_token"].append(residue.token_of(a))
        if atomized:
            self.bonds += [(first + i, first + j) for i, j in comp.bonds]
        self.n_residues += 1
        return residue


def _name_chars(name: str, code: str) -> list[int]:
    chars = [ord(c) - 32 for c in name.upper().ljust(ATOM_NAME_LEN)]
    if len(name) > ATOM_NAME_LEN or not all(0 <= c < NUM_NAME_CHARS for c in chars):
        raise InputError(f"{code}: atom name '{name}' does not fit {ATOM_NAME_LEN} characters of ' ' to '_'")
    return chars


def _bundled(code: str, where: str, what: str) -> Component:
    comp = component(code)
    if comp is None:
        bundled = f"bundled: {', '.join(bundled_codes())}"
        hint = "give the ligand as a SMILES instead" if what == "ligand" else bundled
        raise InputError(f"{where}: CCD code '{code}' is not in cpbench's bundled table ({hint})")
    return comp


def _alignment(msa: Msa | None, entity: Entity, field_name: str) -> Alignment | None:
    if msa is None:
        return None
    try:
        text = read_a3m_file(msa.path) if msa.path is not None else msa.text
        return parse_a3m(text or "", entity.sequence)
    except MsaError as err:
        source = f"MSA file {msa.path}" if msa.path is not None else f"{field_name}Msa"
        message = str(err).removeprefix(f"MSA file {msa.path}: ")
        raise InputError(f"{entity.where}: {source}: {message}") from None


@dataclass
class _EntityMsa:
    """An entity's MSA rows after the query: classes and deletion counts, [rows, residues]."""

    paired: tuple[np.ndarray, np.ndarray]
    unpaired: tuple[np.ndarray, np.ndarray]


def _entity_msa(entity: Entity) -> _EntityMsa:
    mol_type, empty = MOL_TYPE_OF[entity.kind], np.zeros((0, len(entity.sequence)), dtype=np.int64)
    blocks = []
    for msa, name in ((entity.paired, "paired"), (entity.unpaired, "unpaired")):
        alignment = _alignment(msa, entity, name)
        if alignment is None:
            blocks.append((empty, empty))
            continue
        classes = np.array(
            [[_msa_class(mol_type, c) for c in row] for row in alignment.rows[1:]], dtype=np.int64
        )
        blocks.append((classes.reshape(-1, len(entity.sequence)), alignment.deletions[1:]))
    return _EntityMsa(paired=blocks[0], unpaired=blocks[1])


def _polymer(builder: _Builder, entity: Entity, chain: tuple[int, ...], e: int) -> list[_Residue]:
    mol_type = MOL_TYPE_OF[entity.kind]
    alphabet = RESIDUE_CODES[mol_type]
    modified = dict(entity.modifications)
    for position in modified:
        if not 1 <= position <= len(entity.sequence):
            length = len(entity.sequence)
            raise InputError(f"{entity.where}: a modification at position {position}, outside 1..{length}")
    residues = []
    for i, letter in enumerate(entity.sequence):
        if letter not in alphabet:
            raise InputError(
                f"{entity.where}: residue {i + 1} '{letter}' is not a {entity.kind} letter "
                f"(allowed: {''.join(sorted(alphabet))})"
            )
        code = modified.get(i + 1)
        comp = _bundled(code or alphabet[letter], f"{entity.where} residue {i + 1}", "modification")
        res_type = residue_class(mol_type, letter)  # a modified residue keeps its parent's class
        residues.append(builder.add_residue(comp, code is not None, res_type, chain, i, (e, i)))
    return residues


def _ligand(builder: _Builder, entity: Entity, chain: tuple[int, ...]) -> list[_Residue]:
    if entity.smiles is not None:
        try:
            comps = [ligand_from_smiles(entity.smiles, builder.seed)]
        except LigandError as err:
            raise InputError(f"{entity.where}: {err}") from None
    else:
        comps = [_bundled(code, entity.where, "ligand") for code in entity.ccd_codes]
    return [builder.add_residue(comp, True, UNK, chain, r, None) for r, comp in enumerate(comps)]


def _resolve(builder: _Builder, ref: AtomRef, where: str) -> int:
    residues = builder.chains.get(ref.chain)
    if residues is None:
        raise InputError(f"{where}: no chain '{ref.chain}' (chains: {', '.join(builder.chains)})")
    if not 1 <= ref.residue <= len(residues):
        raise InputError(f"{where}: chain {ref.chain} has residues 1..{len(residues)}, not {ref.residue}")
    residue = residues[ref.residue - 1]
    atoms = residue.component.atoms
    if ref.atom not in atoms:
        raise InputError(
            f"{where}: chain {ref.chain} residue {ref.residue} ({residue.component.code}) has no atom "
            f"'{ref.atom}' (atoms: {' '.join(atoms)})"
        )
    return residue.token_of(atoms.index(ref.atom))


def _msa_features(builder: _Builder, msas: list[_EntityMsa], res_type: np.ndarray) -> dict[str, np.ndarray]:
    n, blocks = len(res_type), ("paired", "unpaired")
    depth = {name: max((len(getattr(m, name)[0]) for m in msas), default=0) for name in blocks}
    s = 1 + depth["paired"] + depth["unpaired"]
    msa = np.full((s, n), GAP, dtype=np.int64)
    deletions = np.zeros((s, n), dtype=np.int64)
    msa[0] = res_type
    for t, column in enumerate(builder.msa_column):
        if column is None:
            continue
        e, r = column
        start = 1
        for name in blocks:
            classes, counts = getattr(msas[e], name)
            msa[start : start + len(classes), t] = classes[:, r]
            deletions[start : start + len(classes), t] = counts[:, r]
            start += depth[name]
    return {"msa": msa, "deletion_value": deletion_value_of(deletions)}


def complex_features(complex_: Complex, seed: int) -> dict[str, np.ndarray]:
    """The contract features of a complex (unpadded, index form), before validation."""
    builder = _Builder(seed=seed)
    entity_of: dict[tuple, int] = {}
    msas: list[_EntityMsa] = []
    copies: dict[int, int] = {}
    for entity in complex_.entities:
        if entity.key not in entity_of:
            entity_of[entity.key] = len(entity_of)
            msas.append(_entity_msa(entity) if entity.kind != "ligand" else None)
        e = entity_of[entity.key]
        for chain_id in entity.ids:
            if chain_id in builder.chains:
                raise InputError(f"{entity.where}: chain id '{chain_id}' is used twice")
            chain = (len(builder.chains), e, copies.get(e, 0), MOL_TYPE_OF[entity.kind])
            copies[e] = copies.get(e, 0) + 1
            if entity.kind == "ligand":
                builder.chains[chain_id] = _ligand(builder, entity, chain)
            else:
                builder.chains[chain_id] = _polymer(builder, entity, chain, e)
    for a, b, where in complex_.bonds:
        i, j = _resolve(builder, a, where), _resolve(builder, b, where)
        if i != j:
            builder.bonds.append((i, j))
    arrays = {key: np.asarray(values, dtype=np.int64) for key, values in builder.tokens.items()}
    n = len(arrays["res_type"])
    bonds = np.zeros((n, n), dtype=np.bool_)
    for i, j in builder.bonds:
        bonds[i, j] = bonds[j, i] = True
    arrays["token_bonds"] = bonds
    atoms = builder.atoms
    names = np.asarray(atoms["ref_atom_name_chars"], dtype=np.int64).reshape(-1, ATOM_NAME_LEN)
    arrays |= {
        "ref_pos": np.asarray(atoms["ref_pos"], dtype=np.float32).reshape(-1, 3),
        "ref_charge": np.asarray(atoms["ref_charge"], dtype=np.float32),
        "ref_element": np.asarray(atoms["ref_element"], dtype=np.int64),
        "ref_atom_name_chars": names,
        "ref_space_uid": np.asarray(atoms["ref_space_uid"], dtype=np.int64),
        "atom_to_token": np.asarray(atoms["atom_to_token"], dtype=np.int64),
    }
    empty = _EntityMsa(paired=(np.zeros((0, 0), np.int64),) * 2, unpaired=(np.zeros((0, 0), np.int64),) * 2)
    arrays |= _msa_features(builder, [m if m is not None else empty for m in msas], arrays["res_type"])
    return arrays
