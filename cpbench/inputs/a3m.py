"""MSAs in the A3M format (FASTA whose upper-case letters and `-` are aligned columns and whose
lower-case letters are insertions): each row's aligned residues and the deletions before each."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class MsaError(ValueError):
    """An MSA that cannot be read or does not fit its chain; the message says why."""


@dataclass(frozen=True)
class Alignment:
    """Rows of aligned letters (upper case or `-`), each of the query's length, the query first,
    and the count of inserted residues before each column."""

    rows: tuple[str, ...]
    deletions: np.ndarray  # [rows, columns] int64


def read_a3m_file(path: Path) -> str:
    """The text of an A3M file, plain or gzip-compressed."""
    if not path.is_file():
        raise MsaError(f"MSA file {path}: no such file")
    data = path.read_bytes()
    try:
        return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()
    except (OSError, UnicodeDecodeError) as err:
        raise MsaError(f"MSA file {path}: not a readable A3M file ({err})") from None


def _sequences(text: str) -> list[str]:
    sequences: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(">"):
            sequences.append([])
        elif line and not line.startswith("#"):
            if not sequences:
                raise MsaError("sequence data before the first '>' header")
            sequences[-1].append(line)
    return ["".join(parts) for parts in sequences]


def parse_a3m(text: str, query: str) -> Alignment:
    """The alignment of an A3M text whose first sequence must be `query` exactly."""
    sequences = _sequences(text)
    if not sequences:
        raise MsaError("holds no sequence")
    if sequences[0] != query:
        raise MsaError(
            f"its first sequence (the query) '{_short(sequences[0])}' is not the chain's '{_short(query)}'"
        )
    rows, deletions = [], np.zeros((len(sequences), len(query)), dtype=np.int64)
    for r, sequence in enumerate(sequences):
        aligned, inserted = [], 0
        for char in sequence:
            if char.islower():
                inserted += 1
            elif char != ".":
                if len(aligned) < len(query):
                    deletions[r, len(aligned)] = inserted
                aligned.append(char)
                inserted = 0
        if len(aligned) != len(query):
            raise MsaError(f"row {r + 1} has {len(aligned)} aligned columns, the query {len(query)}")
        rows.append("".join(aligned))
    return Alignment(rows=tuple(rows), deletions=deletions)


def _short(sequence: str, keep: int = 20) -> str:
    return sequence if len(sequence) <= keep else f"{sequence[:keep]}..."
