"""The time model: one rank's step time from its counted work (measure/tally.py) and a machine's
figures (`Hardware`: calibrated from cpbench's own points, or a datasheet's).

For each aten op a of a rank's step, and each phase p and CP op label o, with the work counted on
fake tensors:

    compute(a)    = n_a k_a + F_a / R_a      (an op with a FLOP formula)
                 or n_a k_a + M_a / W_a      (any other op: memory-bound)
                 or n_a t_a(F_a / n_a)       (a calibrated op's measured runs; M_a for bytes)
    compute(p, o) = sum over ops a of  compute(a) x (a's work in p, o) / (a's work in the step)
    comm(p, o)    = sum over collectives of  a_l + (P - 1) h_l + S / B_l

n_a is the times op a runs, k_a its fixed cost (dispatch, launch); F_a its FLOPs at a rate R_a; M_a
the bytes it reads and writes at a bandwidth W_a. t_a(w) is a calibrated op's run of work w (FLOPs
or bytes): interpolated between its measured runs, at R_a (W_a) beyond the largest (`OpCost`). An
op the figures do not name takes its class's
rate (matmul, attention, convolution: FLOPs; memory: bytes) and the machine's kernel cost. For a
collective, P is the ranks it joins (a point-to-point send: 2), whose ring takes P - 1 steps of
latency h_l each after a start-up latency a_l; S is the bytes the rank sends (distributed/comm.py:
ring volumes) at the link's bandwidth B_l; l is `intra` when every rank it joins is on one node,
else `inter`.

The step is the slowest rank's sum over its phases and ops: compute and communication add, nothing
overlaps. Ranks sharing a device (more ranks on a node than it has devices) each get their share of
it, so their compute and their collectives alike take ranks / devices times as long (a CPU rank's
collectives are copies its cores make). The real job runs each phase p `scale_p` times as often as
the benchmark (docs/budget.md's what-changed table):

    job = sum over p of  scale_p * (compute(p) + comm(p))

Left out: compute overlapping communication, congestion between collectives, an op's rate varying
with its size beyond the sizes calibrated, and kernels outside aten (they count no work).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from cpbench.measure.tally import MEMORY, Span, StepTally, Tally, merged, op_class

INTRA, INTER = "intra", "inter"


@dataclass(frozen=True)
class Link:
    """A link class's alpha-beta: a collective's start-up seconds, the seconds of each ring step,
    and bytes per second."""

    alpha_s: float
    bytes_per_s: float
    hop_s: float = 0.0


@dataclass(frozen=True)
class OpCost:
    """One aten op's cost: seconds per run, and FLOPs (or bytes) per second. A calibrated op also
    holds its measured runs, (work, seconds) of a run at each N calibrated, by work: a run's time is
    interpolated between them (held at the smallest's below it), and beyond the largest grows at
    `per_s`, the marginal rate there. On a CPU an op's rate still grows with its size over the N
    calibrated (a matmul's from 22 to 25 GFLOP/s over N=64-128): one rate over them all puts larger
    N over, the marginal rate at the largest puts smaller ones over (N=32 by 100 %)."""

    kernel_s: float
    per_s: float
    measured: tuple[tuple[float, float], ...] = ()

    def seconds(self, runs: float, work: float) -> float:
        """Seconds of `runs` runs doing `work` in all."""
        if not self.measured or runs == 0:
            return runs * self.kernel_s + work / self.per_s
        per_run = work / runs
        largest, largest_s = self.measured[-1]
        if per_run > largest:
            return runs * (largest_s + (per_run - largest) / self.per_s)
        work_at, seconds_at = zip(*self.measured, strict=True)
        return runs * float(np.interp(per_run, work_at, seconds_at))


@dataclass(frozen=True)
class Hardware:
    """A machine's figures, per rank (one device: a GPU, or a CPU rank's threads)."""

    name: str
    rates: dict[str, float]  # by class (measure/tally.py): FLOPs a second, MEMORY's bytes a second
    kernel_s: float  # an op's fixed cost, where `ops` does not give its own
    links: dict[str, Link]  # INTRA, INTER
    devices_per_node: int
    dtype: str  # the dtype the rates are for (a run in another computes at other rates)
    memory_gib: float | None = None  # a device's memory, for the planning table's fit
    ops: dict[str, OpCost] = field(default_factory=dict)  # by aten op, where calibrated
    sources: dict[str, str] = field(default_factory=dict)  # each figure's source, by its key

    def cost(self, op: str, counts_flops: bool) -> OpCost:
        if op in self.ops:
            return self.ops[op]
        kind = op_class(op) if counts_flops else MEMORY
        return OpCost(self.kernel_s, self.rates.get(kind, self.rates.get("matmul", float("inf"))))

    def link(self, span: Span, ranks_per_node: int) -> Link:
        """The link class a collective over `span` crosses: within one node, or between nodes."""
        nodes = {rank // ranks_per_node for rank in span}
        kind = INTRA if len(nodes) == 1 else INTER
        if kind not in self.links:
            raise ValueError(f"{self.name}: no {kind}-node link figures (a calibration on one node has none)")
        return self.links[kind]


@dataclass
class Seconds:
    """Predicted seconds of one rank's step, split into compute and communication, by phase and op label."""

    compute: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    comm: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))

    @property
    def total(self) -> float:
        return sum(self.compute.values()) + sum(self.comm.values())

    @property
    def comm_total(self) -> float:
        return sum(self.comm.values())

    def job(self, scale: dict[str, float]) -> float:
        """The real job's step: each phase's seconds times how much more often the job runs it."""
        return sum(
            scale.get(phase, 1.0) * s for part in (self.compute, self.comm) for (phase, _), s in part.items()
        )

    def dominant(self, part: str) -> tuple[str, float]:
        """The op label with the most seconds of `part` ("compute" or "comm"), over phases."""
        by_op: dict[str, float] = defaultdict(float)
        for (_, op), s in getattr(self, part).items():
            by_op[op] += s
        return max(by_op.items(), key=lambda item: item[1], default=("", 0.0))


def _work(tally: Tally, op: str) -> float:
    return tally.flops[op] if op in tally.flops else tally.bytes[op]


def compute_seconds(tally: StepTally, hw: Hardware) -> dict[tuple[str, str], float]:
    """Compute seconds of each phase and op label of a step. Each op is priced over the whole step,
    as the calibration timed it (its runs of every size averaged), and its seconds are shared out by
    work (by runs where it does none): priced label by label, a label's few small runs of an op fell
    below the smallest run calibrated and took its time, and fold_small's step at N=32 came out
    46 % over."""
    whole = merged(tally)
    priced = {
        op: hw.cost(op, op in whole.flops).seconds(runs, _work(whole, op)) for op, runs in whole.runs.items()
    }
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for key, part in tally.items():
        for op, runs in part.runs.items():
            share = _work(part, op) / _work(whole, op) if _work(whole, op) else runs / whole.runs[op]
            seconds[key] += share * priced[op]
    return seconds


def comm_seconds(tally: Tally, hw: Hardware, ranks_per_node: int) -> float:
    """Alpha-beta seconds of one tally's collectives, each on the link class its span crosses."""
    total = 0.0
    for span, calls in tally.calls.items():
        link = hw.link(span, ranks_per_node)
        total += calls * (link.alpha_s + (len(span) - 1) * link.hop_s) + tally.sent[span] / link.bytes_per_s
    return total


def rank_seconds(tally: StepTally, hw: Hardware, ranks_per_node: int, shared: float = 1.0) -> Seconds:
    """One rank's predicted step, by phase and op label; `shared`: ranks per device on its node (>= 1),
    which stretches all of it."""
    seconds = Seconds()
    for key, compute in compute_seconds(tally, hw).items():
        seconds.compute[key] += shared * compute
    for key, part in tally.items():
        seconds.comm[key] += shared * comm_seconds(part, hw, ranks_per_node)
    return seconds


def step_seconds(per_rank: dict[int, StepTally], hw: Hardware, ranks_per_node: int,
                 shared: float = 1.0) -> Seconds:  # fmt: skip
    """The step: its slowest rank's predicted seconds."""
    return max(
        (rank_seconds(t, hw, ranks_per_node, shared) for t in per_rank.values()), key=lambda s: s.total
    )
