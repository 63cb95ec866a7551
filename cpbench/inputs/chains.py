"""The chains of a synthesized complex: a small table (one row per chain, O(N / chain length)) that
every rank computes whole, so that any token's chain, residue number and entity are a lookup."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cpbench.inputs.contract import DNA, LIGAND, MOL_TYPES, PROTEIN, RNA

# Chain kinds drawn for a seed: (mol_type, probability, shortest, longest) in tokens.
_DRAWN_KINDS = ((PROTEIN, 0.6, 30, 400), (RNA, 0.12, 10, 120), (DNA, 0.08, 10, 60), (LIGAND, 0.2, 3, 30))
_COPY_PROBABILITY = 0.3  # a drawn polymer chain repeats an earlier entity (a homomer copy)
_BATCH = 64  # drawn in fixed batches: the chains for N are those for any N' > N, cut at N


@dataclass(frozen=True)
class ChainTable:
    """Chains in token order. `entity_id` is shared by chains of one sequence; `sym_id` counts
    the copies of an entity; every id is 0-based."""

    names: tuple[str, ...]
    starts: np.ndarray  # int64 [C]: first token of each chain
    lengths: np.ndarray  # int64 [C]
    mol_type: np.ndarray  # int64 [C]
    entity_id: np.ndarray  # int64 [C]
    sym_id: np.ndarray  # int64 [C]

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())

    def locate(self, tokens: np.ndarray) -> np.ndarray:
        """The chain number of each (real) token."""
        return np.searchsorted(self.starts, tokens, side="right") - 1

    @classmethod
    def build(
        cls, names: list[str], lengths: list[int], mol_types: list[int], entities: list[int]
    ) -> ChainTable:
        """Number entities by first appearance and count each entity's copies."""
        if not lengths or min(lengths) < 1:
            raise ValueError(f"chains need at least one token each, got lengths {lengths}")
        renumber: dict[int, int] = {}
        entity_id, sym_id = [], []
        copies: dict[int, int] = {}
        for entity in entities:
            renumber.setdefault(entity, len(renumber))
            entity_id.append(renumber[entity])
            sym_id.append(copies.get(entity, 0))
            copies[entity] = sym_id[-1] + 1
        lengths_arr = np.asarray(lengths, dtype=np.int64)
        return cls(
            names=tuple(names),
            starts=np.concatenate([[0], np.cumsum(lengths_arr)[:-1]]).astype(np.int64),
            lengths=lengths_arr,
            mol_type=np.asarray(mol_types, dtype=np.int64),
            entity_id=np.asarray(entity_id, dtype=np.int64),
            sym_id=np.asarray(sym_id, dtype=np.int64),
        )


def chain_name(index: int) -> str:
    """A, B, ..., Z, AA, AB, ... (mmCIF style)."""
    name = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        name = chr(ord("A") + rest) + name
    return name


def chains_from_seed(seed: int, n_tokens: int) -> ChainTable:
    """Chains drawn from the seed until they hold n_tokens; the last one is cut to fit (and, if
    it was a copy, becomes an entity of its own, since its sequence is no longer the same)."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    rng = np.random.default_rng([seed, 0xC4A1])
    kinds = np.array([k[0] for k in _DRAWN_KINDS])
    probabilities = np.array([k[1] for k in _DRAWN_KINDS])
    lengths: list[int] = []
    mol_types: list[int] = []
    entities: list[int] = []
    originals: list[int] = []  # polymer chains that started an entity: what a copy may repeat
    total = 0
    while total < n_tokens:
        kind_draw = rng.choice(len(kinds), size=_BATCH, p=probabilities)
        length_draw = rng.random(_BATCH)
        copy_draw = rng.random(_BATCH)
        pick_draw = rng.random(_BATCH)
        for i in range(_BATCH):
            if originals and copy_draw[i] < _COPY_PROBABILITY:
                source = originals[int(pick_draw[i] * len(originals))]
                mol_type, length, entity = mol_types[source], lengths[source], entities[source]
            else:
                mol_type, _, low, high = _DRAWN_KINDS[int(kind_draw[i])]
                length = low + int(length_draw[i] * (high - low + 1))
                entity = len(lengths)
            if total + length >= n_tokens:
                if total + length > n_tokens:
                    length, entity = n_tokens - total, len(lengths)
                lengths.append(length)
                mol_types.append(mol_type)
                entities.append(entity)
                total = n_tokens
                break
            if entity == len(lengths) and mol_type != LIGAND:
                originals.append(entity)
            lengths.append(length)
            mol_types.append(mol_type)
            entities.append(entity)
            total += length
    return ChainTable.build([chain_name(i) for i in range(len(lengths))], lengths, mol_types, entities)


def parse_chains(description: str) -> ChainTable:
    """Chains from `NAME:TYPE:LENGTH[xCOPIES],...`, e.g. `A:protein:180,B:rna:60,L:ligand:12x2`.
    Copies of one item share an entity and are named NAME, NAME2, NAME3, ..."""
    names: list[str] = []
    lengths: list[int] = []
    mol_types: list[int] = []
    entities: list[int] = []
    for item_index, item in enumerate(filter(None, (part.strip() for part in description.split(",")))):
        fields = item.split(":")
        if len(fields) != 3:
            raise ValueError(f"chain '{item}': expected NAME:TYPE:LENGTH[xCOPIES]")
        name, kind, size = fields
        if kind not in MOL_TYPES:
            raise ValueError(f"chain '{item}': type '{kind}' is not one of {', '.join(MOL_TYPES)}")
        length_text, _, copies_text = size.partition("x")
        try:
            length, copies = int(length_text), int(copies_text or 1)
        except ValueError:
            raise ValueError(f"chain '{item}': LENGTH and COPIES must be integers") from None
        if length < 1 or copies < 1:
            raise ValueError(f"chain '{item}': LENGTH and COPIES must be >= 1")
        for copy in range(copies):
            names.append(name if copy == 0 else f"{name}{copy + 1}")
            lengths.append(length)
            mol_types.append(MOL_TYPES.index(kind))
            entities.append(item_index)
    if not names:
        raise ValueError("no chains described")
    if len(set(names)) != len(names):
        raise ValueError(f"chain names repeat: {', '.join(names)}")
    return ChainTable.build(names, lengths, mol_types, entities)
