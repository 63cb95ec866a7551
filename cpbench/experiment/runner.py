"""Running a plan: every run of it is a cpbench run (the app's config with the plan's overrides),
each in its own run folder under output_dir/experiments/, in the order `plan` decides.

Order of runs (A/B/A): the reference of an experiment (the baseline, or its gate's winner) is measured
just before and just after it; the measurement after one experiment is the one before the next when
they share a reference. A run folder that finished is read, not run again, so a plan that was killed
resumes at its first unfinished run (and that run resumes at its own unfinished point)."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose
from omegaconf import DictConfig, OmegaConf, open_dict

from cpbench.core import ConfigError
from cpbench.experiment.plan import (
    BASELINE,
    FAILED,
    SKIPPED,
    Experiment,
    Outcome,
    Plan,
    base_of,
    next_experiment,
    parse_plan,
    skip_reason,
)
from cpbench.experiment.verdict import change_pct, judge, judge_max_n, median_change
from cpbench.record import run_record
from cpbench.report.experiments import write_experiments
from cpbench.results import lock
from cpbench.results.folder import RunFolder
from cpbench.results.row import samples_of

# Checks one composed config as a plain run would (raises ConfigError); runs one (returns its exit code).
Check = Callable[[DictConfig], object]
RunOne = Callable[[DictConfig], int]


def say(message: str) -> None:
    print(f"cpbench: experiment: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RunFigures:
    """What one run of the plan measured: its ok points' repeats, first step and peak by point, and
    the largest N that fit where it probed."""

    name: str
    repeats: dict[tuple, list[float]]
    first_step_ms: dict[tuple, float | None]
    peak_gib: dict[tuple, float | None]
    max_n: int | None

    @classmethod
    def read(cls, name: str, folder: RunFolder) -> RunFigures:
        frame = folder.read_results()
        repeats, first, peak, max_n = {}, {}, {}, None
        if not frame.empty:
            for row in frame.itertuples():
                samples = samples_of(getattr(row, "diffusion_samples", None))
                key = (int(row.N_tokens), int(row.N_atoms), int(row.MSA_depth), samples)
                if row.kind == "max-fit":
                    max_n = int(row.N_tokens) if row.status == "ok" else None
                elif row.status == "ok" and isinstance(row.repeats_ms, str) and row.repeats_ms:
                    repeats[key] = [float(v) for v in row.repeats_ms.split()]
                    first[key] = None if pd.isna(row.first_step_ms) else float(row.first_step_ms)
                    peak[key] = None if pd.isna(row.peak_mem_gib) else float(row.peak_mem_gib)
        return cls(name, repeats, first, peak, max_n)


def compare(exp: Experiment, measured: RunFigures, refs: Sequence[RunFigures], seed: int) -> dict[str, Any]:
    """The experiment's figures against its reference's two measurements, and the verdict: on walltime
    at the largest point all three measured, else (a capacity experiment) on max N."""
    common = set(measured.repeats).intersection(*(r.repeats for r in refs))
    figures: dict[str, Any] = {"max_n": measured.max_n, "ref_max_n": _max_or_none([r.max_n for r in refs])}
    if common:
        point = max(common)
        change = median_change(measured.repeats[point], refs[0].repeats[point], refs[1].repeats[point], seed)
        ref_wall = statistics.median([v for r in refs for v in r.repeats[point]])
        ref_first = [r.first_step_ms[point] for r in refs]
        ref_peak = [r.peak_gib[point] for r in refs]
        figures.update(
            judged_on="walltime",
            N_tokens=point[0],
            walltime_ms=statistics.median(measured.repeats[point]),
            ref_walltime_ms=ref_wall,
            walltime_change_pct=change.pct,
            ci_low_pct=change.low,
            ci_high_pct=change.high,
            drift_pct=change.drift_pct,
            first_step_ms=measured.first_step_ms[point],
            ref_first_step_ms=_mean_or_none(ref_first),
            first_step_change_pct=change_pct(measured.first_step_ms[point], ref_first),
            peak_mem_gib=measured.peak_gib[point],
            ref_peak_mem_gib=_mean_or_none(ref_peak),
            peak_mem_change_pct=change_pct(measured.peak_gib[point], ref_peak),
            verdict=judge(change),
        )
    elif measured.max_n is not None or any(r.max_n is not None for r in refs):
        figures.update(judged_on="max N", verdict=judge_max_n(measured.max_n, [r.max_n for r in refs]))
    else:
        figures.update(judged_on="", verdict=FAILED, note="no point measured ok in both runs")
    return figures


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _max_or_none(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


class PlanRun:
    """One plan under one output_dir: composes each run's config, runs or reads it, decides."""

    def __init__(self, cfg: DictConfig, cli: Sequence[str], check: Check, run_one: RunOne):
        self.plan: Plan = parse_plan(OmegaConf.to_container(cfg.experiment, resolve=True))
        self.root = RunFolder(Path(cfg.output_dir).resolve())
        self.cli = [o for o in cli if _key(o) not in ("experiment", "output_dir")]
        self.check, self.run_one, self.seed = check, run_one, int(cfg.seed)
        self.outcomes: dict[str, Outcome] = {}
        self.references = 0

    def config(self, applied: Sequence[str], name: str) -> DictConfig:
        """The app's config for one run: the plan's baseline, the command line, then the experiment's
        overrides (its gate winner's first); output_dir its own run folder."""
        folder = self.root.experiment_run(name).root
        overrides = [*self.plan.baseline, *self.cli, *applied, f"output_dir={folder}"]
        try:
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        except Exception as err:  # Hydra's own errors: an unknown key, a bad value, a missing group option
            detail = " ".join(str(err).split())
            raise ConfigError(f"{name}: {' '.join(applied) or 'baseline'}: {detail}") from None
        with open_dict(cfg):  # this run's preset: the app's Hydra choice is the command line's
            cfg.workload_preset = cfg.workload_preset or cfg.hydra.runtime.choices.get("workload") or ""
            del cfg["hydra"]
        return cfg

    def check_all(self) -> None:
        """Every experiment composed and checked on the baseline before anything runs."""
        self.check(self.config((), BASELINE))
        for exp in self.plan.experiments:
            try:
                self.check(self.config(exp.overrides, exp.id))
            except ConfigError as err:
                message = str(err)
                prefix = f"{exp.id}: "
                raise ConfigError(
                    f"experiment {exp.id}: {message.removeprefix(prefix)}"
                    if message.startswith(prefix)
                    else f"experiment {exp.id}: {' '.join(exp.overrides)}: {message}"
                ) from None

    def measure(self, name: str, applied: Sequence[str]) -> RunFigures | int:
        """Run one run of the plan (or read it, when it finished before); its exit code if it failed."""
        folder = self.root.experiment_run(name)
        if run_record.is_finished(folder):
            say(f"{name}: finished before, read from {folder.root}")
            return RunFigures.read(name, folder)
        say(f"{name}: running {' '.join(applied) or '(the baseline)'} -> {folder.root}")
        code = self.run_one(self.config(applied, name))
        if code:
            return code
        return RunFigures.read(name, folder)

    def reference(self, label: str, applied: tuple[str, ...]) -> RunFigures | int:
        """The next measurement of an experiment's reference: the baseline, or a gate's winner."""
        name = f"{BASELINE}_{self.references}" + ("" if label == BASELINE else f"_on_{label}")
        self.references += 1
        return self.measure(name, applied)

    def run(self) -> int:
        """Decide every experiment of the plan; the exit code (128 + signal when interrupted)."""
        plan, last = self.plan, None  # last: the latest reference run, when nothing ran after it
        say(f"plan {plan.name or '(unnamed)'}: {len(plan.experiments)} experiment(s) -> {self.root.root}")
        while (exp := next_experiment(plan, self.outcomes)) is not None:
            ran_on, base = base_of(plan, exp, self.outcomes)
            applied = (*base, *exp.overrides)
            if reason := skip_reason(exp, self.outcomes):
                say(f"{exp.id}: skipped: {reason}")
                self.outcomes[exp.id] = Outcome(exp.id, SKIPPED, applied, ran_on, note=reason)
                self._write()
                continue
            if last is None or last[0] != base:
                before = self.reference(ran_on, base)
                if isinstance(before, int):
                    return before
                last = (base, before)
            measured = self.measure(exp.id, applied)
            if isinstance(measured, int):
                if measured >= 128:
                    return measured
                note = f"the run failed (exit {measured}): see {self.root.experiment_run(exp.id).root}"
                self.outcomes[exp.id] = Outcome(exp.id, FAILED, applied, ran_on, note=note)
                self._write()
                continue
            after = self.reference(ran_on, base)
            if isinstance(after, int):
                return after
            figures = compare(exp, measured, [last[1], after], self.seed)
            figures.update(run=measured.name, references=f"{last[1].name} {after.name}")
            verdict, note = figures.pop("verdict"), figures.pop("note", "")
            self.outcomes[exp.id] = Outcome(
                exp.id, verdict, applied, ran_on, figures.get("walltime_change_pct"), note, figures
            )
            last = (base, after)
            pct = figures.get("walltime_change_pct")
            say(f"{exp.id}: {verdict}" + (f" ({pct:+.1f}% walltime)" if pct is not None else ""))
            self._write()
        self._write()
        say(f"done: {self.root.experiments_md}")
        return 0

    def _write(self) -> None:
        plan = self.plan
        rows = []
        for exp in plan.experiments:
            outcome = self.outcomes.get(exp.id)
            row = {
                "id": exp.id, "change": " ".join(exp.overrides), "priority": exp.priority,
                "rationale": exp.rationale, "group": exp.group, "after": exp.after,
                "only_if": " ".join(exp.only_if), "verdict": outcome.verdict if outcome else "pending",
            }  # fmt: skip
            if outcome:
                row.update(outcome.figures, ran_on=outcome.ran_on, applied=" ".join(outcome.applied))
                row["note"] = outcome.note
            rows.append(row)
        intro = [
            *([plan.description, ""] if plan.description else []),
            f"Baseline: `{' '.join([*plan.baseline, *self.cli]) or '(the default run)'}`. Each experiment "
            "runs with the baseline's points, repeats and probe settings plus its change (a gated one on "
            "top of its gate's winner: `ran on`); its reference is measured just before and just after it "
            "(A/B/A), and the figures in brackets are the reference's.",
            "",
            "Walltime change: the median of the experiment's repeats against the median of the reference's "
            "two measurements pooled, with a seeded 95% bootstrap interval. Verdict: better or worse when "
            "the whole interval is on one side of zero and the change exceeds the reference's own drift "
            "between its two measurements; otherwise within noise. Without walltime points (capacity "
            "plans) the verdict compares max N with both reference measurements.",
        ]
        write_experiments(self.root, rows, f"Experiments: {plan.name or 'plan'}", intro)


def _key(override: str) -> str:
    """The key an override sets: `+a.b=1` -> `a`."""
    return override.split("=", 1)[0].lstrip("+~").split(".", 1)[0]


def run_plan(cfg: DictConfig, cli: Sequence[str], check: Check, run_one: RunOne) -> int:
    """Check the whole plan (one line and exit 2 for a bad one), then run it holding output_dir."""
    try:
        plan = PlanRun(cfg, cli, check, run_one)
        plan.check_all()
    except ConfigError as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        root = Path(cfg.output_dir)
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()  # Hydra made it for this run; a refused plan leaves nothing
        return 2
    try:
        with lock.hold(plan.root):
            return plan.run()
    except ConfigError as err:  # another run holds output_dir
        print(f"cpbench: error: {err}", file=sys.stderr)
        return 2
