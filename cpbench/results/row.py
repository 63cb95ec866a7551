"""A results row, declared once: the columns of results.csv in the order of the contract
(docs/measurement.md), which of them are labels (read back as text, whatever they look like) and the
resume key of a point.
A new column is one field here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


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
    # What was measured.
    status: str | None = None  # ok | oom | crashed | error | mismatch (mode=accuracy: differs from cp=1)
    peak_mem_gib: float | None = None  # max over ranks
    walltime_ms: float | None = None  # median over repeats of the slowest rank
    walltime_iqr_ms: float | None = None
    tokens_per_s: float | None = None
    comm_ms: float | None = None
    checksum: float | None = None
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
    oom_at: int | None = None  # max-fit rows: the first N that did not fit
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    # One pass of a phase the model marks inside the step (core/phases.py), slowest rank, median:
    # one trunk pass and one sampling step (training: its denoising step); blank without phases.
    trunk_ms: float | None = None
    sampling_step_ms: float | None = None
    comm_mib_per_step: float | None = None
    # Model FLOPs of the step over all ranks (counted, docs/measurement.md), the achieved TFLOP/s of one
    # rank and its MFU (blank where the device's peak is unknown); ops outside aten, not counted.
    model_tflop: float | None = None
    tflops_per_rank: float | None = None
    mfu: float | None = None
    # The same with a forward recomputed in the backward (activation checkpointing) counted again: what
    # the hardware ran (HFU). Equal to model_tflop and mfu without recomputation.
    hardware_tflop: float | None = None
    hfu: float | None = None
    flops_uncounted: str = ""
    # probe.predict: the fake-tensor estimate of peak_mem_gib (the baseline included, as the measure)
    predicted_peak_gib: float | None = None
    # max-fit rows of built-in workloads: who holds the peak at that N by the fake-tensor trace, the
    # two largest holders and their shares (app/peak_holders.py), e.g. "msa.tri_mul_out 61%, ..."
    peak_holder: str = ""
    peak_mem_min_gib: float | None = None  # the least peak over ranks: beside the max, the grid's imbalance
    # GPU, beside peak_mem_gib (tensors): the caching allocator's peak of reserved segments, and NVML's
    # used memory of the device at the peak (every process on it: the CUDA context and NCCL's buffers
    # too); the largest over ranks, blank on CPU (measure/memory.py `read_peaks`).
    peak_reserved_gib: float | None = None
    device_used_gib: float | None = None
    # The quantities that must not change (mode=accuracy checks them against cp=1): native training's
    # loss (its output, so also the checksum) and, in accuracy mode, the summed gradients' L2 norm.
    loss: float | None = None
    grad_norm: float | None = None
    # One-off costs, apart from the steady median: the warm-up steps taken and the first step's time
    # (compilation, autotuning, the allocator's first requests), slowest rank.
    warmup_steps: int | None = None
    first_step_ms: float | None = None
    repeats_ms: str = ""  # every timed repeat's walltime (slowest rank), space-separated
    # How it was measured.
    warmup: int  # the warm-up floor (timing.warmup); warmup_steps says how many were taken
    repeats: int  # the timed repeats taken (before the point is measured: timing.repeats)
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
    error: str = ""
    # "" for a row this run measured; "baseline" for a row of the cp=1 baseline copied in beside it
    # (cpbench/app/baseline.py): never resumed as this run's point, compared against in the readout.
    source: str = ""
    # Settings a workload records in each of its rows (its optional `columns` hook), after these.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return point_key(self.kind, self.N_tokens, self.N_atoms, self.MSA_depth)

    def as_dict(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**row, **self.extra}


def point_key(kind: str, n_tokens: int, n_atoms: int, msa_depth: int) -> str:
    """Rows with the same key (and config hash) are the same point: a rerun skips it."""
    return f"{kind}:{n_tokens}:{n_atoms}:{msa_depth}"


BASELINE = "baseline"  # the `source` of a cp=1 baseline row

_FIELDS = [f for f in dataclasses.fields(ResultRow) if f.name != "extra"]
COLUMNS: list[str] = [f.name for f in _FIELDS]
# Label columns: a config hash such as 6168e7108345 would otherwise parse as a float (inf).
TEXT_COLUMNS: tuple[str, ...] = tuple(f.name for f in _FIELDS if f.type in ("str", "str | None"))
