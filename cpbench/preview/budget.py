"""The time budget of a run, as a pure function of its plan, one measured step and the budget.

The estimate: a step at N costs the measured step's time scaled by (N / N_measured)^2, the size of the
pair representation (docs/budget.md compares it with measured steps: close at the N a CPU runs; where
the cubic triangle updates dominate, at large N, it comes out low); every walltime point runs its
warm-up and timed steps; the probe's steps are the search of `cpbench.probe.search` run against a peak
memory scaled the same way from the measured step's, then the full measurement at the N it predicts.

Over budget, only what a benchmark may trim is cut, in this order: repeats down to
`budget.min_repeats`, sweep points (never the largest N, never the N of a point kept), the probe's
granularity (doubled up to its start N). The job's shape (model, N, precision, CP size) is never
changed: a plan whose points cannot fit without it is refused. A probe still over runs: it stops before
the step that would overrun the budget, its largest fit then a bound.

The budget depends on the device (`budget_minutes`): `budget.minutes` on CPU, `budget.cuda_minutes`
(default none) on CUDA, where the job is GPU-sized and the N^2 extrapolation from one small step would
refuse or trim it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cpbench.core import Shape
from cpbench.probe.search import SearchConfig, Trial, bounds, next_trial


@dataclass(frozen=True)
class PlannedWork:
    """What a run will measure: its walltime points, their steps, and the probe (None: off)."""

    points: tuple[Shape, ...]
    warmup: int
    repeats: int
    probe: SearchConfig | None = None
    measure_at_max: bool = True  # the probe's full measurement at the largest N that fits
    # The run's walltime points at the probe's shape, measured (with their peaks) or to be (peak None:
    # predicted): the probe starts from their answers, which guide its first steps, and steps none again.
    probe_seeds: tuple[Trial, ...] = ()


@dataclass(frozen=True)
class PilotStep:
    """The measured step the estimate scales from: its N, time, and peak memory against the cap."""

    n: int
    seconds: float
    peak_gib: float | None = None
    baseline_gib: float = 0.0  # held before any step (CPU); the part of the peak that does not grow
    # What a measurement costs besides its steps (building the batch, agreeing, releasing memory),
    # paid once per point and once per probe step.
    overhead_s: float = 0.0
    # The FLOP count of a measured point's shape (fake tensors, measure.count_flops): about the same at
    # every N, as it walks one pass of each repeated loop; paid once per point and for the edge's.
    count_s: float = 0.0
    # The part of the peak over the baseline that does not grow with N (workspaces, weights, fixed-size
    # activations), where measured points tell it apart (`fixed_part`); 0: unknown, all of it grows.
    fixed_gib: float = 0.0
    # A step's seconds fitted to the steps of two or more N (before the probe); None: scaled by N^2.
    growth: StepGrowth | None = None


@dataclass(frozen=True)
class BudgetVerdict:
    work: PlannedWork  # the plan to run: the trimmed one; refused, the least the job allows
    seconds: float  # its estimated time
    probe_steps: int  # the probe's expected steps in it
    cuts: tuple[str, ...] = ()
    refusal: str | None = None  # set: nothing runs

    def summary(self, budget_minutes: float | None, step: PilotStep) -> str:
        """One line: `plan: 3 point(s) x (3 warm-up + 5 repeats) x ~0.4 s at N=64 (x (N/64)^2) + probe
        ~8 step(s) = ~1.2 min, budget 8 min`."""
        p = self.work
        points = f"{len(p.points)} point(s) x ({p.warmup} warm-up + {p.repeats} repeats)"
        points += f" x ~{step.seconds:.2g} s at N={step.n} (x (N/{step.n})^2)"
        if step.overhead_s:
            points += f" + ~{step.overhead_s:.2g} s a measurement"
        if step.count_s:
            points += f" + ~{step.count_s:.2g} s a FLOP count"
        probe = f" + probe ~{self.probe_steps} step(s)" if p.probe else ""
        if p.probe and step.fixed_gib >= 0.5 / 1024:
            probe += f" ({step.fixed_gib * 1024:.0f} MiB of the peak fixed)"
        budget = "no budget" if budget_minutes is None else f"budget {budget_minutes:g} min"
        return f"plan: {points}{probe} = ~{duration(self.seconds)}, {budget}"


def budget_minutes(minutes: float | None, cuda_minutes: float | None, device_type: str) -> float | None:
    """The run's time budget on its ranks' device: `cuda_minutes` on CUDA, `minutes` elsewhere (None:
    no budget). Two keys, not one: the CPU default (8 min) is sized for the CPU preset's steps, while
    on a GPU a step of AF3-size work at the probe's N costs minutes, and scaled by N^2 from the first
    point's step it comes out far off (docs/budget.md), so a default there would refuse or trim the
    very job the GPU is for."""
    return cuda_minutes if device_type == "cuda" else minutes


def duration(seconds: float) -> str:
    """`12 s`, `4.2 min`: as the plan line says it."""
    return f"{seconds / 60:.2g} min" if seconds >= 60 else f"{seconds:.2g} s"


def step_seconds(step: PilotStep, n: int) -> float:
    return step.growth.seconds(n) if step.growth else step.seconds * (n / step.n) ** 2


@dataclass(frozen=True)
class StepGrowth:
    """A step's seconds in N as a + b N^2 + c N^3, no term negative: what does not grow, the pair
    representation's ops, the triangle updates'. The plan's N^2 leaves the cubic term out; fold_small's
    steps under a 0.5 GiB cap grew as N^2.9 from N=512 to 1,026 (27 s to 192 s). Fitted to the steps
    measured so far, it prices the probe's next step, which stops the probe short of overrunning."""

    a: float
    b: float
    c: float

    @classmethod
    def fit(cls, steps: list[tuple[int, float]]) -> StepGrowth | None:
        """The least squared error in seconds over the terms' subsets (an N's slowest step counts), so
        that the largest steps, the nearest to the next, weigh the most (by relative error, milliseconds
        of noise at small N priced a step after 4 s at 1.8 s, where it took 32); with two N several
        subsets fit exactly, and the one that prices a step at twice the largest N highest is taken.
        From one N alone the step is all cubic, the steepest growth the model allows. None: no step
        measured."""
        slowest: dict[int, float] = {}
        for n, seconds in steps:
            slowest[n] = max(seconds, slowest.get(n, 0.0))
        if not slowest:
            return None
        if len(slowest) == 1:
            [(n, seconds)] = slowest.items()
            return cls(0.0, 0.0, seconds / n**3)
        n, seconds = (np.array(v, dtype=float) for v in zip(*slowest.items(), strict=True))
        terms = np.stack([np.ones_like(n), n**2, n**3], axis=1)
        fits = []
        for subset in ([0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2]):
            coefficients, *_ = np.linalg.lstsq(terms[:, subset], seconds, rcond=None)
            if (coefficients < 0).any():
                continue
            full = np.zeros(3)
            full[subset] = coefficients
            growth = cls(*(float(v) for v in full))
            error = float(np.sum((terms @ full - seconds) ** 2))
            fits.append((round(error, 9), -growth.seconds(2 * int(n.max())), growth))
        return min(fits, key=lambda fit: fit[:2])[2]

    def seconds(self, n: int) -> float:
        return self.a + self.b * n**2 + self.c * n**3


def _peak_gib(step: PilotStep, n: int) -> float | None:
    """The step's peak scaled to `n`, its fixed part kept; None where the step held nothing measurable
    over the baseline (a tiny step can read below it: the baseline is start-up's high-water mark), which
    no scaling can grow."""
    if step.peak_gib is None or step.peak_gib <= step.baseline_gib:
        return None
    fixed = min(step.fixed_gib, step.peak_gib - step.baseline_gib)
    return step.baseline_gib + fixed + (step.peak_gib - step.baseline_gib - fixed) * (n / step.n) ** 2


def fixed_part(peaks: list[tuple[int, float]]) -> float:
    """a of the least-squares a + b N^2 through measured (N, peak over the baseline) pairs, at least 0;
    0 below two distinct N. From its N=128 step alone fold_small's peak over the baseline (0.026 GiB,
    near half of it fixed) scaled by N^2 put the edge under a 0.05 GiB cap near 177, where it was 213."""
    if len({n for n, _ in peaks}) < 2:
        return 0.0
    n, over = (np.array(v, dtype=float) for v in zip(*peaks, strict=True))
    b, a = np.polyfit(n**2, over, 1)
    return max(0.0, float(a)) if b > 0 else 0.0


def _predicted_trial(search: SearchConfig, step: PilotStep, n: int, point: bool = False) -> Trial:
    peak = _peak_gib(step, n)
    fits = search.cap_gib is None or peak is None or peak <= search.cap_gib
    return Trial(n=n, fits=fits, status="ok" if fits else "oom", peak_gib=peak, point=point)


def probe_trials(search: SearchConfig, step: PilotStep, seeds: tuple[Trial, ...] = ()) -> list[Trial]:
    """The trials the probe is expected to step (`point` False), after the walltime points `seeds` it
    starts from: its own search, fed the peaks predicted from `step`. With no predicted end (no memory
    cap or no predicted peak, and no max_tokens) one ramp step is counted."""
    trials = [t if t.peak_gib is not None else _predicted_trial(search, step, t.n, point=True) for t in seeds]
    stepped = 0
    while (proposal := next_trial(search, trials)) is not None and stepped < 64:
        trial = _predicted_trial(search, step, proposal.n)
        trials.append(trial)
        stepped += 1
        if (search.cap_gib is None or trial.peak_gib is None) and search.config.max_tokens is None:
            break
    return trials


def estimate(work: PlannedWork, step: PilotStep) -> tuple[float, int]:
    """Seconds of the plan's steps, and the probe's expected step count."""
    per_point = work.warmup + work.repeats
    measured = step.overhead_s + step.count_s  # a measured point's cost besides its steps
    seconds = sum(measured + per_point * step_seconds(step, s.n_tokens) for s in work.points)
    if work.probe is None:
        return seconds, 0
    trials = probe_trials(work.probe, step, work.probe_seeds)
    stepped = [t for t in trials if not t.point]
    seconds += sum(step.overhead_s + step_seconds(step, t.n) for t in stepped)
    best, _ = bounds(trials)
    if work.measure_at_max and best is not None and not best.point:  # a point's N is measured already
        seconds += measured + per_point * step_seconds(step, best.n)
    return seconds, len(stepped)


def _drop_one(points: tuple[Shape, ...]) -> tuple[Shape, ...] | None:
    """Fewer points: the smallest N other than the largest, so the job's size stays measured."""
    if len(points) <= 1:
        return None
    largest = max(points, key=lambda s: s.n_tokens)
    victim = min((s for s in points if s is not largest), key=lambda s: s.n_tokens)
    return tuple(s for s in points if s is not victim)


def fit_budget(work: PlannedWork, step: PilotStep, minutes: float | None, min_repeats: int) -> BudgetVerdict:
    """The plan that fits `minutes`, with each cut named; or, when even the most trimmed plan does
    not fit, a refusal (with that plan and its cuts). `minutes=None`: no budget, the plan as given."""
    seconds, probe_steps = estimate(work, step)
    if minutes is None or seconds <= minutes * 60:
        return BudgetVerdict(work, seconds, probe_steps)
    limit, trimmed, cuts = minutes * 60, work, []

    def fits(candidate: PlannedWork) -> bool:
        return estimate(candidate, step)[0] <= limit

    floor = min(work.repeats, min_repeats)
    while trimmed.repeats > floor and not fits(trimmed):
        trimmed = replace(trimmed, repeats=trimmed.repeats - 1)
    if trimmed.repeats < work.repeats:
        cuts.append(
            f"timing.repeats {work.repeats} -> {trimmed.repeats} "
            f"(the floor is budget.min_repeats={min_repeats})"
        )
    dropped: list[int] = []
    while not fits(trimmed) and (fewer := _drop_one(trimmed.points)) is not None:
        dropped += [s.n_tokens for s in trimmed.points if s not in fewer]
        seeds = tuple(t for t in trimmed.probe_seeds if t.n not in dropped)
        trimmed = replace(trimmed, points=fewer, probe_seeds=seeds)
    if dropped:
        kept = ", ".join(str(s.n_tokens) for s in trimmed.points)
        cuts.append(f"sweep points: N={', '.join(map(str, dropped))} dropped, N={kept} kept")
    if trimmed.probe is not None:
        search = trimmed.probe
        while not fits(trimmed) and search.config.granularity * 2 <= search.config.start:
            search = replace(search, config=replace(search.config, granularity=search.config.granularity * 2))
            trimmed = replace(trimmed, probe=search)
        if search.config.granularity != work.probe.config.granularity:
            cuts.append(f"probe.granularity {work.probe.config.granularity} -> {search.config.granularity}")
    seconds, probe_steps = estimate(trimmed, step)
    if seconds <= limit:
        return BudgetVerdict(trimmed, seconds, probe_steps, tuple(cuts))
    if trimmed.probe is not None and estimate(replace(trimmed, probe=None), step)[0] <= limit:
        # The probe stops before a step that would overrun (rank/budget.py `probe_step_over`): what
        # the points leave is its, and its largest fit then a bound.
        cuts.append("probe: its estimate runs past the budget; it stops before the step that would "
                    "overrun, and its largest fit is then a bound")  # fmt: skip
        return BudgetVerdict(trimmed, seconds, probe_steps, tuple(cuts))
    least = BudgetVerdict(trimmed, seconds, probe_steps).summary(minutes, step).removeprefix("plan: ")
    refusal = (
        f"budget.minutes={minutes:g}: even trimmed to the least the job allows ({least}) the plan does "
        "not fit; nothing run (raise budget.minutes, or budget.minutes=null to run it all)"
    )
    return BudgetVerdict(trimmed, seconds, probe_steps, tuple(cuts), refusal)
