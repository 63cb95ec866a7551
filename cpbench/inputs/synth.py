"""Synthesized fold inputs, generated shard by shard.

Every value is a pure function of (seed, feature, global index): a counter-based generator
(splitmix64 of the index, integer arithmetic only) rather than a stateful one, so a rank draws
exactly its own entries, in any order and any block size, and the shards of any CP layout equal,
bit for bit, the tensors generated in one piece. Floats come from integers through exact
operations and table lookups (no transcendental functions on drawn values), so vectorised and
scalar code paths cannot round differently.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from cpbench.core import Shape, Topology
from cpbench.inputs.chains import ChainTable, chains_from_seed
from cpbench.inputs.contract import (
    ALPHABETS,
    DNA,
    GAP,
    LIGAND,
    MAX_DELETIONS,
    NUM_RES_TYPES,
    PROTEIN,
    RNA,
    deletion_value_of,
)
from cpbench.inputs.shard import FoldShard, build_shard

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_WEIGHT = 256  # profile weights are integers out of this, so profile rows sum to exactly 1


def stream_key(seed: int, name: str) -> np.uint64:
    """An independent 64-bit stream per (seed, feature)."""
    digest = hashlib.blake2b(f"cpbench.inputs/{seed}/{name}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def counter_hash(key: np.uint64, counter: np.ndarray) -> np.ndarray:
    """64 random bits per counter (splitmix64 of key + (counter + 1) * golden ratio)."""
    x = counter.astype(np.uint64)
    x += np.uint64(1)
    x *= _GOLDEN
    x += key
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def _below(bits: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """Integers in [0, n) from random bits (n may vary per entry)."""
    return (bits % np.asarray(n).astype(np.uint64)).astype(np.int64)


def _unit(bits: np.ndarray) -> np.ndarray:
    """Floats in [0, 1) with 53 random bits, exactly."""
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _pair_counter(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """One counter from two non-negative indices below 2**32."""
    return (high.astype(np.uint64) << np.uint64(32)) | low.astype(np.uint64)


# Atom chemistry by mol_type: backbone elements for the first atoms of a token, then a palette.
_BACKBONE = np.array([[7, 6, 6, 8], [15, 8, 8, -1], [15, 8, 8, -1], [-1, -1, -1, -1]], dtype=np.int64)
_PALETTES = [[6, 6, 6, 6, 7, 8, 16], [6, 6, 6, 7, 8], [6, 6, 6, 7, 8], [6, 6, 6, 7, 8, 9, 15, 16, 17]]
_PALETTE = np.array([p + [0] * (9 - len(p)) for p in _PALETTES], dtype=np.int64)
_PALETTE_SIZE = np.array([len(p) for p in _PALETTES], dtype=np.int64)
_SYMBOLS = {1: "H", 6: "C", 7: "N", 8: "O", 9: "F", 15: "P", 16: "S", 17: "CL"}
_SYMBOL_CHARS = np.zeros((128, 2), dtype=np.int64)
for _z, _symbol in _SYMBOLS.items():
    _SYMBOL_CHARS[_z, : len(_symbol)] = [ord(ch) - 32 for ch in _symbol]
_DIGIT0 = ord("0") - 32
_ALPHABET_START = np.array([ALPHABETS[m][0] for m in (PROTEIN, DNA, RNA, LIGAND)], dtype=np.int64)
_ALPHABET_SIZE = np.array([ALPHABETS[m][1] for m in (PROTEIN, DNA, RNA, LIGAND)], dtype=np.int64)
_DELETION_TABLE = deletion_value_of(np.arange(MAX_DELETIONS + 1))
_MEAN_DELETION = float(_DELETION_TABLE[1:].astype(np.float64).mean())


class SynthSource:
    """The synthesized complex for (seed, chains, atom total, MSA depth); answers any token range.

    Atoms per token: the real atoms are spread evenly (token i holds floor((i+1)T/N) -
    floor(iT/N)), then each token pair (2k, 2k+1) trades a random d in [-spread, spread]; the
    atoms before token i are therefore floor(iT/N) (+ d_k for odd i), a closed form per token.
    """

    def __init__(self, chains: ChainTable, n_atoms: int, msa_depth: int, seed: int, atom_spread: int | None):
        self.chains = chains
        self.n_tokens = chains.n_tokens
        self.n_atoms = n_atoms
        self.msa_depth = msa_depth
        if n_atoms < self.n_tokens:
            raise ValueError(
                f"n_atoms={n_atoms} is below n_tokens={self.n_tokens}: every token needs an atom"
            )
        if msa_depth < 0:
            raise ValueError(f"msa_depth must be >= 0, got {msa_depth}")
        mean = n_atoms / self.n_tokens
        spread = max(1, round(mean / 3)) if atom_spread is None else atom_spread
        if spread < 0:
            raise ValueError(f"atom_spread must be >= 0, got {spread}")
        self.spread = min(spread, math.floor(mean) - 1)  # keeps every token at >= 1 atom
        self.keys = {
            name: stream_key(seed, name)
            for name in ("res_type", "alt1", "alt2", "query_weight", "cut1", "cut2", "deletion_rate", "msa",
                         "deletion", "atom_spread", "element", "ref_pos", "charge")
        }  # fmt: skip

    def atom_counts_range(self) -> tuple[int, int]:
        """The fewest and most atoms a real token can hold."""
        mean = self.n_atoms / self.n_tokens
        return math.floor(mean) - self.spread, math.ceil(mean) + self.spread

    def atom_prefix(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.clip(np.asarray(tokens, dtype=np.int64), 0, self.n_tokens)
        prefix = tokens * self.n_atoms // self.n_tokens
        if self.spread:
            traded = (tokens % 2 == 1) & (tokens < self.n_tokens)
            pair = (tokens - 1) // 2
            d = _below(counter_hash(self.keys["atom_spread"], np.maximum(pair, 0)), 2 * self.spread + 1)
            prefix += np.where(traded, d - self.spread, 0)
        return prefix

    def _tokens(self, start: int, stop: int) -> dict[str, np.ndarray]:
        t = np.arange(start, stop, dtype=np.int64)
        chain = self.chains.locate(t)
        mol_type = self.chains.mol_type[chain]
        entity = self.chains.entity_id[chain]
        chain_start = self.chains.starts[chain]
        position = t - chain_start
        # Homomer copies share a sequence, a profile and deletion rates: keyed by (entity, position).
        residue = _pair_counter(entity, position)
        first, size = _ALPHABET_START[mol_type], _ALPHABET_SIZE[mol_type]
        return {
            "t": t,
            "chain": chain,
            "chain_start": chain_start,
            "mol_type": mol_type,
            "entity": entity,
            "position": position,
            "residue": residue,
            "res_type": first + _below(counter_hash(self.keys["res_type"], residue), size),
            "alt1": first + _below(counter_hash(self.keys["alt1"], residue), size),
            "alt2": first + _below(counter_hash(self.keys["alt2"], residue), size),
        }

    def _components(self, info: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """MSA rows 1.. draw each column from 4 classes (query, two alternatives of the chain's
        alphabet, gap) with integer weights out of _WEIGHT; ligand columns are all gap."""
        residue, ligand = info["residue"], info["mol_type"] == LIGAND
        query = 96 + _below(counter_hash(self.keys["query_weight"], residue), 129)
        rest = _WEIGHT - query
        cut1 = _below(counter_hash(self.keys["cut1"], residue), rest + 1)
        cut2 = _below(counter_hash(self.keys["cut2"], residue), rest + 1)
        low, high = np.minimum(cut1, cut2), np.maximum(cut1, cut2)
        weights = np.stack([query, low, high - low, rest - high], axis=1)
        weights[ligand] = [0, 0, 0, _WEIGHT]
        classes = np.stack(
            [info["res_type"], info["alt1"], info["alt2"], np.full_like(residue, GAP, np.int64)], 1
        )
        rate = np.where(ligand, 0, _below(counter_hash(self.keys["deletion_rate"], residue), 65))
        return classes, weights, rate

    def token_features(self, start: int, stop: int) -> dict[str, np.ndarray]:
        info = self._tokens(start, stop)
        n = stop - start
        classes, weights, rate = self._components(info)
        profile = np.zeros((n, NUM_RES_TYPES), dtype=np.float32)
        rows = np.arange(n)
        for component in range(4):  # classes may repeat within a row: add, do not assign
            profile[rows, classes[:, component]] += weights[:, component] / _WEIGHT
        ligand = info["mol_type"] == LIGAND
        return {
            "res_type": info["res_type"],
            "residue_index": np.where(ligand, 0, info["position"]),
            "token_index": info["t"],
            "asym_id": info["chain"],
            "entity_id": info["entity"],
            "sym_id": self.chains.sym_id[info["chain"]],
            "mol_type": info["mol_type"],
            "token_pad_mask": np.ones(n, dtype=np.bool_),
            "profile": profile,
            "deletion_mean": (rate / _WEIGHT * _MEAN_DELETION).astype(np.float32),
        }

    def msa_features(self, start: int, stop: int) -> dict[str, np.ndarray]:
        depth, n = self.msa_depth, stop - start
        msa = np.zeros((depth, n), dtype=np.int64)
        value = np.zeros((depth, n), dtype=np.float32)
        if depth and n:
            info = self._tokens(start, stop)
            msa[0] = info["res_type"]
        if depth > 1 and n:
            classes, weights, rate = self._components(info)
            bounds = np.cumsum(weights[:, :3], axis=1)
            counter = _pair_counter(np.arange(1, depth)[:, None], info["t"][None, :])
            draw = _below(counter_hash(self.keys["msa"], counter), _WEIGHT)
            pick = (draw >= bounds[:, 0]).astype(np.int64)
            pick += draw >= bounds[:, 1]
            pick += draw >= bounds[:, 2]
            msa[1:] = classes[np.arange(n)[None, :], pick]
            bits = counter_hash(self.keys["deletion"], counter)
            deleted = _below(bits, _WEIGHT) < rate
            count = 1 + _below(bits >> np.uint64(8), MAX_DELETIONS)
            value[1:] = np.where(deleted, _DELETION_TABLE[count], np.float32(0))
        return {
            "msa": msa,
            "has_deletion": value > 0,
            "deletion_value": value,
            "msa_mask": np.ones((depth, n), dtype=np.bool_),
        }

    def atom_features(self, start: int, stop: int) -> dict[str, np.ndarray]:
        info = self._tokens(start, stop)
        prefix = self.atom_prefix(np.arange(start, stop + 1))
        counts = np.diff(prefix)
        token = np.repeat(info["t"], counts)
        atom = np.arange(prefix[0], prefix[-1], dtype=np.int64)  # global index among real atoms
        k = atom - np.repeat(prefix[:-1], counts)  # position within the token
        mol_type = np.repeat(info["mol_type"], counts)

        side = _PALETTE[mol_type, _below(counter_hash(self.keys["element"], atom), _PALETTE_SIZE[mol_type])]
        backbone = np.where(k < 4, _BACKBONE[mol_type, np.minimum(k, 3)], -1)
        element = np.where(backbone >= 0, backbone, side)

        # Name: element symbol then k (e.g. "C12", "CL3"), space padded to 4 characters.
        names = np.zeros((len(atom), 4), dtype=np.int64)
        rows = np.arange(len(atom))
        names[:, :2] = _SYMBOL_CHARS[element]
        digit = 1 + (names[:, 1] > 0)
        k2 = k % 100
        tens = k2 >= 10
        names[rows[tens], digit[tens]] = _DIGIT0 + k2[tens] // 10
        names[rows, digit + tens] = _DIGIT0 + k2 % 10

        noise = _unit(counter_hash(self.keys["ref_pos"], atom[:, None] * 3 + np.arange(3)[None, :]))
        ref_pos = noise * 2.0 - 1.0
        ref_pos[:, 0] += 1.2 * k
        charge_draw = _below(counter_hash(self.keys["charge"], atom), 64)
        uid = np.where(info["mol_type"] == LIGAND, info["chain_start"], info["t"])
        return {
            "ref_pos": ref_pos.astype(np.float32),
            "ref_charge": np.select([charge_draw == 0, charge_draw == 1], [1.0, -1.0], 0.0).astype(
                np.float32
            ),
            "ref_element": element,
            "ref_atom_name_chars": names,
            "ref_space_uid": np.repeat(uid, counts),
            "atom_pad_mask": np.ones(len(atom), dtype=np.bool_),
            "atom_to_token": token,
        }

    def fill_token_bonds(self, rows: range, cols: range, out: np.ndarray) -> None:
        """Ligand tokens bond to their chain neighbours (each ligand token is one atom)."""
        t = np.arange(rows.start, rows.stop, dtype=np.int64)
        chain = self.chains.locate(t)
        ligand = self.chains.mol_type[chain] == LIGAND
        first, end = self.chains.starts[chain], self.chains.starts[chain] + self.chains.lengths[chain]
        for step in (-1, 1):
            j = t + step
            bonded = ligand & (j >= first) & (j < end) & (j >= cols.start) & (j < cols.stop)
            out[t[bonded] - rows.start, j[bonded] - cols.start] = True


def synthesize(
    shape: Shape,
    topology: Topology,
    coords: tuple[int, int],
    seed: int,
    atoms_per_token: int = 9,
    *,
    atom_spread: int | None = None,
    chains: ChainTable | None = None,
) -> FoldShard:
    """This rank's shard of the synthesized inputs for `shape`.

    Real atoms: exactly `shape.n_atoms`, or `atoms_per_token * n_tokens` when `shape.n_atoms` is
    0; a token holds mean +- `atom_spread` of them (default about a third of the mean). `chains`
    fixes the complex (default: chains drawn from the seed). MSA depth is `shape.msa_depth`.
    """
    if shape.n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {shape.n_tokens}")
    if chains is None:
        chains = chains_from_seed(seed, shape.n_tokens)
    elif chains.n_tokens != shape.n_tokens:
        raise ValueError(f"the chains hold {chains.n_tokens} tokens, the shape asks for {shape.n_tokens}")
    n_atoms = shape.n_atoms if shape.n_atoms > 0 else atoms_per_token * shape.n_tokens
    source = SynthSource(chains, n_atoms, shape.msa_depth, seed, atom_spread)
    return build_shard(source, topology, coords)
