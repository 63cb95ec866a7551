"""A results row, declared once: the columns of results.csv (the contract's first, in its order: DESIGN.md,
docs/measurement.md), which of them are labels (read back as text, whatever they look like) and the
resume key of a point. A column is one field here: a measured one of `Measured`, which the measurement
fills (cpbench/measure/point.py), any other one of `ResultRow`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cpbench.core import Shape


@dataclass(kw_only=True)
class Measured:
    """What a point's steps measured: results.csv's measured columns (those the contract names among
    its first columns, in its order; the rest after the point's identity)."""

    status: str | None = None  # ok | oom | crashed | error | mismatch (mode=accuracy: differs from cp=1)
    peak_mem_gib: float | None = None  # max over ranks
    walltime_ms: float | None = None  # median over repeats of the slowest rank
    walltime_iqr_ms: float | None = None
    tokens_per_s: float | None = None
    comm_ms: float | None = None  # median over repeats of the largest per-rank time in collectives
    checksum: float | None = None  # float64 sum of the first step's output over all ranks
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    # One pass of a phase the model marks inside the step (core/phases.py), slowest rank, median:
    # one trunk pass and one sampling step (training: its denoising step); blank without phases.
    trunk_ms: float | None = None
    sampling_step_ms: float | None = None
    comm_mib_per_step: float | None = None  # max over ranks of MiB sent per step
    # Model FLOPs of the step over all ranks (counted, docs/measurement.md), the achieved TFLOP/s of one
    # rank and its MFU (blank where the device's peak is unknown); ops outside aten, not counted.
    model_tflop: float | None = None
    tflops_per_rank: float | None = None
    mfu: float | None = None
    # The same with a forward recomputed in the backward (activation checkpointing) counted again: what
    # the hardware ran (HFU). Equal to model_tflop and mfu without recomputation.
    hardware_tflop: float | None = None
    hfu: float | None = None
    flops_uncounted: str = ""  # ops outside aten the counter could not see into
    peak_mem_min_gib: float | None = None  # the least peak over ranks: beside the max, the grid's imbalance
    # GPU, beside peak_mem_gib (tensors): the caching allocator's peak of reserved segments, and NVML's
    # used memory of the device at the peak (every process on it: the CUDA context and NCCL's buffers
    # too); the largest over ranks, blank on CPU (measure/memory.py `read_peaks`).
    peak_reserved_gib: float | None = None
    device_used_gib: float | None = None
    # GPU, since the point's start (torch.cuda.memory_stats): device allocations the caching allocator
    # retried after freeing its cache ("num_alloc_retries": under a cap, it reached the cap holding cached
    # blocks) and out-of-memory errors it raised ("num_ooms"); the largest over ranks, blank on CPU.
    alloc_retries: int | None = None
    alloc_ooms: int | None = None
    # The quantities that must not change (mode=accuracy checks them against cp=1): native training's
    # loss (its output, so also the checksum) and, in accuracy mode, the summed gradients' L2 norm.
    loss: float | None = None
    grad_norm: float | None = None
    # One-off costs, apart from the steady median: the warm-up steps taken and the first step's time
    # (compilation, autotuning, the allocator's first requests), slowest rank.
    warmup_steps: int | None = None
    first_step_ms: float | None = None
    repeats_ms: str = ""  # every timed repeat's walltime (slowest rank), space-separated
    repeats: int | None = None  # the timed repeats taken (not measured: those the point was set to take)
    # What a row that did not fit or failed ran into, one of FAILURES (docs/failures.md); blank for a
    # point that finished (ok, or mismatch: it ran, and its answer differs from cp=1's).
    failure: str = ""
    error: str = ""

    def columns(self) -> dict[str, Any]:
        """The measured columns; a figure not measured (NaN: a phase of a whole step) is blank."""
        values = {name: getattr(self, name) for name in MEASURED}
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}


MEASURED: list[str] = [f.name for f in dataclasses.fields(Measured)]


@dataclass(kw_only=True)
class ResultRow:
    # What the point is (known before it runs; a point in flight is recorded with these alone).
    workload: str
    workflow: str
    topology: str
    cp: int
    grid: str
    N_tokens: int
    N_atoms: int
    MSA_depth: int
    dtype: str
    kind: str  # point | max-fit
    # The workload's preset (the config-group choice, `workload=fold_small`; the `workload_preset`
    # setting overrides it) and a hash of its resolved settings, first after the contract's columns:
    # rows of two presets, or of one preset with other sizes, are different experiments
    # (cpbench/record/metadata.py `workload_labels`).
    preset: str = ""
    sizes_hash: str = ""
    # data.path: the input's name, its chain count and its MSA's rows (MSA_depth: those run, data.msa_depth)
    input: str = ""
    chains: int | None = None
    input_msa_depth: int | None = None
    diffusion_samples: int | None = None  # per trunk pass, for a workload with a diffusion batch (fold)
    oom_at: int | None = None  # max-fit rows: the first N that did not fit, when it ran out of memory
    kernel_fault_at: int | None = None  # max-fit rows: the first N that did not run, when a kernel faulted
    measured: Measured = field(default_factory=Measured)  # its columns: the contract's first, the rest here
    # probe.predict: the fake-tensor estimate of peak_mem_gib (the baseline included, as the measure)
    predicted_peak_gib: float | None = None
    # max-fit rows of built-in workloads: who holds the peak at that N by the fake-tensor trace, the
    # two largest holders and their shares (app/peak_holders.py), e.g. "msa.tri_mul_out 61%, ..."
    peak_holder: str = ""
    # How it was measured.
    warmup: int  # the warm-up floor (timing.warmup); warmup_steps says how many were taken
    seed: int
    config_hash: str
    # The per-rank memory cap and what rank 0 held after start-up (CPU); a point fits when its peak
    # over that baseline stays within the cap.
    budget_gib: float | None = None
    # The cap as set, before the device had its say: `0.5 GiB`, `device memory` (a GPU's budget_gib
    # null: the card less what the rank holds, which differs run to run) or `none` (CPU, uncapped).
    memory_budget: str = ""
    device: str = ""  # the device model the ranks ran on (run.json's `device`)
    baseline_gib: float | None = None
    # "" for a row this run measured; "baseline" for a row of the cp=1 baseline copied in beside it
    # (cpbench/app/baseline.py): never resumed as this run's point, compared against in the readout.
    source: str = ""
    # Settings a workload records in each of its rows (its optional `columns` hook), after these.
    extra: dict[str, Any] = field(default_factory=dict)

    def with_measured(self, measured: Measured) -> ResultRow:
        """This point measured; one not measured keeps the repeats it was set to take."""
        if measured.repeats is None:
            measured = dataclasses.replace(measured, repeats=self.measured.repeats)
        return dataclasses.replace(self, measured=measured)

    @property
    def key(self) -> str:
        return point_key(self.kind, self.N_tokens, self.N_atoms, self.MSA_depth, self.diffusion_samples)

    def as_dict(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in _FIELDS if f.name != "measured"}
        row |= self.measured.columns()
        return {**{name: row[name] for name in COLUMNS}, **self.extra}


@dataclass(frozen=True)
class RowIdentity:
    """What every row of a run holds alike (ResultRow's columns that no point changes), made once per
    rank; a point's row adds its shape, its kind and the repeats it is set to take."""

    columns: Mapping[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", MappingProxyType(dict(self.columns)))

    def row(self, shape: Shape, kind: str, repeats: int, predicted_peak_gib: float | None) -> ResultRow:
        return ResultRow(
            **self.columns, N_tokens=shape.n_tokens, N_atoms=shape.n_atoms, MSA_depth=shape.msa_depth,
            diffusion_samples=shape.diffusion_samples, kind=kind, predicted_peak_gib=predicted_peak_gib,
            measured=Measured(repeats=repeats),
        )  # fmt: skip


def point_key(kind: str, n_tokens: int, n_atoms: int, msa_depth: int, diffusion_samples: Any = None) -> str:
    """Rows with the same key (and config hash) are the same point: a rerun skips it. The diffusion
    samples are in it where there are some (a blank or NaN cell: none)."""
    key = f"{kind}:{int(n_tokens)}:{int(n_atoms)}:{int(msa_depth)}"
    samples = samples_of(diffusion_samples)
    return key if samples is None else f"{key}:{samples}"


def samples_of(cell: Any) -> int | None:
    """A row's diffusion samples as read back: None for a blank cell (NaN), or a row written before
    the column."""
    return None if cell is None or cell != cell else int(cell)


def row_key(row: Mapping[str, Any]) -> str:
    """The key of a row read back (results.csv, state.json)."""
    samples = row.get("diffusion_samples")
    return point_key(row["kind"], row["N_tokens"], row["N_atoms"], row["MSA_depth"], samples)


def shape_key(kind: str, shape: Shape) -> str:
    return point_key(kind, shape.n_tokens, shape.n_atoms, shape.msa_depth, shape.diffusion_samples)


BASELINE = "baseline"  # the `source` of a cp=1 baseline row
# How a max-fit row's note opens where the probe stopped short of its edge (the time budget): its N is
# a lower bound.
LOWER_BOUND = "max fit >= "

# The failure classes of the `failure` column (docs/failures.md; cpbench/measure/oom.py tells them
# apart): out of memory (status oom: does not fit), a kernel fault (an illegal memory access or a
# device-side assertion: the CUDA context is dead), a communication error, a timeout or hang, a crash
# (anything else: a kill, a Python error, a CUDA that cannot start).
OOM, KERNEL, COMM, TIMEOUT, CRASH = "oom", "kernel", "comm", "timeout", "crash"
FAILURES: tuple[str, ...] = (OOM, KERNEL, COMM, TIMEOUT, CRASH)


# The columns DESIGN.md's contract names, first and in its order; then every other column as declared.
CONTRACT = [
    "workload", "workflow", "topology", "cp", "grid", "N_tokens", "N_atoms", "MSA_depth", "dtype", "status",
    "peak_mem_gib", "walltime_ms", "walltime_iqr_ms", "tokens_per_s", "comm_ms", "checksum", "kind",
]  # fmt: skip
_FIELDS = [f for f in dataclasses.fields(ResultRow) if f.name != "extra"]
_ALL = [g for f in _FIELDS for g in (dataclasses.fields(Measured) if f.name == "measured" else [f])]
COLUMNS: list[str] = CONTRACT + [f.name for f in _ALL if f.name not in CONTRACT]
# Label columns: a config hash such as 6168e7108345 would otherwise parse as a float (inf).
TEXT_COLUMNS: tuple[str, ...] = tuple(f.name for f in _ALL if f.type in ("str", "str | None"))
