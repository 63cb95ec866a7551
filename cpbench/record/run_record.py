"""run.json: what a run records about itself, its schema in one module and its only writer.

The rank session writes the record as the run starts; each later phase (the time budget, the
convergence curve, the end of the run) and the app after it (the footprint, repeat_check) replaces one
section through `update`, atomically. Readers get typed fields. A run.json written by an earlier
version reads too: a section or field it lacks is None, a key no longer known is ignored."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from cpbench.results.folder import RunFolder


def _known(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """The entries of `raw` that are fields of the dataclass `cls` (an old file may hold others)."""
    return {f.name: raw[f.name] for f in fields(cls) if f.name in raw}


@dataclass(frozen=True)
class MemoryCap:
    """The per-rank cap as the run applied it (cpbench/measure/cap.py); cap_gib None: no cap (CPU
    only: a GPU rank is always capped, with memory.budget_gib null at the card less what it holds).
    run.json keeps it under the key `budget_gib`, as earlier runs wrote it."""

    cap_gib: float | None
    baseline_gib: float | None  # what rank 0 held after start-up, as its peak counts it
    held_gib: float | None = None  # CUDA: what rank 0's device held then (context, NCCL, the rest)
    # CUDA: of that, what the NCCL warm-up before the cap took (measure/cap.py `Warmed`)
    nccl_gib: float | None = None


@dataclass(frozen=True)
class DevicePeak:
    """The dense peak MFU divides by, per rank at the run's precision (cpbench/record/peaks.py);
    `tflops` None on an unknown device; `gemm` the CPU GEMM measurement behind a CPU figure."""

    tflops: float | None
    precision: str | None = None  # None: not recorded (a run.json that lacks it reads too)
    source: str | None = None
    gemm: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunMetadata:
    """Where and how the run ran, as the session found it at the start. Fields in the report's order;
    None: not recorded (a CPU run has no GPU state; an older run.json lacks newer fields)."""

    date: str | None = None
    host: str | None = None
    device: str | None = None
    device_count: int | None = None
    cpu_cores: int | None = None
    smt: str | None = None
    backend: str | None = None
    torch: str | None = None
    cuda: str | None = None
    topology: str | None = None
    cp: int | None = None
    grid: str | None = None
    world_size: int | None = None
    gpu_driver: str | None = None
    sm_clocks_mhz: str | None = None
    clocks_locked: str | None = None
    power_limit_w: int | str | None = None
    gpu_processes: int | str | None = None
    devices_shared: str | None = None
    oversubscribed: str | None = None
    ranks_per_device: float | None = None
    seed: int | None = None
    comm_timing: str | None = None
    config_hash: str | None = None
    memory: MemoryCap | None = None  # run.json keeps its figures at the top level
    alloc_conf: str | None = None  # the CUDA caching allocator's settings the ranks ran with
    commit: str | None = None
    peak: DevicePeak | None = None  # its own entry in run.json; the efficiency section says it
    # The workload's settings as the run used them (a model's options included): its own entry in run.json.
    workload: dict[str, Any] | None = None

    @property
    def is_oversubscribed(self) -> bool:
        return str(self.oversubscribed or "no").startswith("yes")

    @property
    def on_cpu(self) -> bool:
        """CPU ranks over gloo, no CUDA (an older run.json without `cuda` counts as none)."""
        return self.backend == "gloo" and self.cuda in (None, "none")

    def recorded(self) -> list[tuple[str, Any]]:
        """(name, value) of every figure the run recorded, in order; the cap's figures stand in for
        `memory` (a blank budget is a run without a cap, and is said; held_gib only on a GPU)."""
        items: list[tuple[str, Any]] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "memory" and value is not None:
                items += [("budget_gib", value.cap_gib), ("baseline_gib", value.baseline_gib)]
                items += [("held_gib", value.held_gib)] if value.held_gib is not None else []
                items += [("nccl_gib", value.nccl_gib)] if value.nccl_gib is not None else []
            elif f.name not in ("memory", "peak", "workload") and value is not None:
                items.append((f.name, value))
        return items

    def to_json(self) -> dict[str, Any]:
        own = {"peak": asdict(self.peak)} if self.peak else {}
        return {**dict(self.recorded()), **own, **({"workload": self.workload} if self.workload else {})}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunMetadata:
        known = _known(cls, raw)
        if "budget_gib" in raw:
            known["memory"] = MemoryCap(
                raw["budget_gib"], raw.get("baseline_gib"), raw.get("held_gib"), raw.get("nccl_gib")
            )
        if raw.get("peak"):
            known["peak"] = DevicePeak(**_known(DevicePeak, raw["peak"]))
        return cls(**known)


@dataclass(frozen=True)
class Change:
    """One row of the what-changed table: a way the benchmark differs from the real job."""

    what: str
    benchmark: str
    real: str
    setting: str  # what controls it; a limitation's is empty
    why: str
    limitation: bool = False
    scale: float | None = None  # real / benchmark, when the job's time grows in proportion to it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TimeBudget:
    """The time budget's plan as set (`line`), what it cut, and why it refused a plan that cannot fit."""

    line: str
    cuts: tuple[str, ...] = ()
    refusal: str | None = None
    probe_line: str | None = None  # the estimate again before the probe
    took_s: float | None = None  # what the planned work took, against the estimate
    estimate_s: float | None = None  # the first plan's estimate of the work it runs (trimmed), seconds
    # When the timed step started (Unix time): the budget is the run's, and a restart's plan for what
    # is left counts from here.
    planned_at: float | None = None
    restarts: tuple[str, ...] = ()  # each restart's plan for what was left, against the budget left

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> TimeBudget:
        known = _known(cls, raw)
        lists = {name: tuple(known.get(name, ())) for name in ("cuts", "restarts")}
        return cls(**{**known, **lists})


@dataclass(frozen=True)
class Spread:
    """One figure over repeat_check's runs: min to max, and (max - min) / abs(median)."""

    min: float
    max: float
    spread: float
    relative: float


@dataclass(frozen=True)
class PointSpread:
    n_tokens: int
    n_atoms: int
    msa_depth: int
    figures: dict[str, Spread]  # figures blank in any run are left out
    diffusion_samples: int | None = None  # the point's diffusion batch, where the workload has one

    def to_json(self) -> dict[str, Any]:
        size = {"N_tokens": self.n_tokens, "N_atoms": self.n_atoms, "MSA_depth": self.msa_depth}
        if self.diffusion_samples is not None:
            size["diffusion_samples"] = self.diffusion_samples
        return {**size, **{name: asdict(s) for name, s in self.figures.items()}}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PointSpread:
        size = ("N_tokens", "N_atoms", "MSA_depth", "diffusion_samples")
        figures = {name: Spread(**value) for name, value in raw.items() if name not in size}
        return cls(raw["N_tokens"], raw["N_atoms"], raw["MSA_depth"], figures, raw.get("diffusion_samples"))


@dataclass(frozen=True)
class RepeatCheck:
    """repeat_check's spreads: per point and figure, and per figure the largest relative spread (the
    run's own tolerance)."""

    runs: int
    tolerance: dict[str, float]
    points: tuple[PointSpread, ...]

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "tolerance": self.tolerance, "points": [p.to_json() for p in self.points]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RepeatCheck:
        return cls(
            raw["runs"], dict(raw["tolerance"]), tuple(PointSpread.from_json(p) for p in raw["points"])
        )


@dataclass(frozen=True)
class Footprint:
    """What the run left behind outside its folder (`left` empty: nothing), and the sentence saying it."""

    left: tuple[str, ...]
    line: str

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Footprint:
        return cls(tuple(raw.get("left", ())), raw["line"])


@dataclass(frozen=True)
class ConvergenceSummary:
    """A convergence run's curve key and, when a reference curve was found, the comparison with it
    (`steps` is then the steps both curves have)."""

    curve_key: str
    steps: int
    reference: str | None = None
    rtol: float | None = None
    atol: float | None = None
    step: int | None = None  # the first step outside the tolerance
    column: str | None = None
    value: float | None = None
    expected: float | None = None
    match: bool | None = None
    summary: str | None = None  # the comparison in one line

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ConvergenceSummary:
        return cls(**_known(cls, raw))


@dataclass(frozen=True)
class RunRecord:
    """run.json whole: the metadata at its top level, then one entry per section."""

    metadata: RunMetadata = field(default_factory=RunMetadata)
    what_changed: tuple[Change, ...] = ()
    time_budget: TimeBudget | None = None
    convergence: ConvergenceSummary | None = None
    footprint: Footprint | None = None
    repeat_check: RepeatCheck | None = None
    finished: str | None = None  # when the run ended (UTC), so that a merge can tell overlapping runs

    def to_json(self) -> dict[str, Any]:
        sections: dict[str, Any] = {"what_changed": [c.as_dict() for c in self.what_changed]}
        if self.time_budget is not None:
            budget = self.time_budget
            sections["time_budget"] = {
                **asdict(budget),
                "cuts": list(budget.cuts),
                "restarts": list(budget.restarts),
            }
        if self.convergence is not None:
            sections["convergence"] = asdict(self.convergence)
        if self.footprint is not None:
            sections["footprint"] = {"left": list(self.footprint.left), "line": self.footprint.line}
        if self.repeat_check is not None:
            sections["repeat_check"] = self.repeat_check.to_json()
        if self.finished is not None:
            sections["finished"] = self.finished
        return {**self.metadata.to_json(), **sections}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunRecord:
        def section(name: str, read: Callable[[dict[str, Any]], Any]) -> Any:
            return read(raw[name]) if raw.get(name) else None

        return cls(
            metadata=RunMetadata.from_json(raw),
            what_changed=tuple(Change(**_known(Change, row)) for row in raw.get("what_changed") or ()),
            time_budget=section("time_budget", TimeBudget.from_json),
            convergence=section("convergence", ConvergenceSummary.from_json),
            footprint=section("footprint", Footprint.from_json),
            repeat_check=section("repeat_check", RepeatCheck.from_json),
            finished=raw.get("finished"),
        )


def read(folder: RunFolder) -> RunRecord:
    """The folder's record; an empty one where there is no run.json (or a torn one)."""
    raw = folder.read_json(folder.run_json)
    return RunRecord.from_json(raw) if isinstance(raw, dict) else RunRecord()


def start(
    folder: RunFolder, metadata: RunMetadata, what_changed: tuple[Change, ...], restarted: bool = False
) -> RunRecord:
    """A run's record from its start: whatever an earlier run in the folder recorded is replaced, but
    for a restart of the same run (`restarted`, before it finished), which keeps its time budget and
    the rows that budget's cuts added to the what-changed table."""
    earlier = read(folder) if restarted else RunRecord()
    if earlier.finished is None and earlier.time_budget is not None:
        return _write(folder, RunRecord(metadata, earlier.what_changed, earlier.time_budget))
    return _write(folder, RunRecord(metadata, what_changed))


def update(folder: RunFolder, **sections: Any) -> RunRecord:
    """Replace the named sections of the folder's record (RunRecord's fields) and write it back."""
    return _write(folder, replace(read(folder), **sections))


def _write(folder: RunFolder, record: RunRecord) -> RunRecord:
    folder.write_json(folder.run_json, record.to_json())  # atomic: a rename over the last one
    return record


def is_finished(folder: RunFolder) -> bool:
    """The run ended whole (its end recorded, no failure recorded): a plan does not run it again."""
    return read(folder).finished is not None and not folder.failure.exists()
