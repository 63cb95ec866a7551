"""What one rank's step does, counted on fake tensors alongside its FLOPs (measure/flops.py), in the
units the time model prices (cpbench/steptime/model.py): per aten op, the times it runs and its
work (FLOPs for an op with a FLOP formula, else the bytes it reads and writes); and the collectives,
by the ranks they span. Filed by the step's phase (core/phases.py) and the CP op label running
(distributed/comm.py), so that a phase the real job runs more often scales alone and a predicted
time says which op it goes to.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

REST = "rest"  # the phase of work outside every named phase: it runs once a step whatever the loops

Span = tuple[int, ...]  # the global ranks a collective joins, sorted


@dataclass
class Tally:
    """One rank's counted work in one phase under one op label."""

    runs: Counter[str] = field(default_factory=Counter)  # by aten op: the times it ran
    flops: Counter[str] = field(default_factory=Counter)  # by aten op with a FLOP formula
    bytes: Counter[str] = field(default_factory=Counter)  # by any other aten op: bytes read and written
    calls: Counter[Span] = field(default_factory=Counter)  # collectives, by span
    sent: Counter[Span] = field(default_factory=Counter)  # bytes this rank sends in them, by span

    def add(self, other: Tally, weight: int = 1) -> None:
        for mine, theirs in ((self.runs, other.runs), (self.flops, other.flops), (self.bytes, other.bytes),
                             (self.calls, other.calls), (self.sent, other.sent)):  # fmt: skip
            for key, value in theirs.items():
                mine[key] += weight * value


# Filed by (phase, op label).
StepTally = dict[tuple[str, str], Tally]


def add_into(total: StepTally, part: StepTally, weight: int = 1) -> None:
    """`total` += `weight` x `part`, key by key."""
    for key, tally in part.items():
        total.setdefault(key, Tally()).add(tally, weight)


def merged(tally: StepTally) -> Tally:
    """Every phase and op label of a step in one tally."""
    total = Tally()
    for part in tally.values():
        total.add(part)
    return total


MATMUL, ATTENTION, CONVOLUTION, MEMORY = "matmul", "attention", "convolution", "memory"


def op_class(op: str) -> str:
    """The class of an aten op with a FLOP formula, for a rate where the machine's figures give none
    for the op itself (a datasheet's, or an op no calibration step ran): fused attention kernels and
    convolutions run at other rates than a plain matrix product. Any other op is of class MEMORY."""
    name = op.lower()
    if "attention" in name:
        return ATTENTION
    if "conv" in name:
        return CONVOLUTION
    return MATMUL
