"""An experiment plan and its order, as pure functions: which experiment runs next (priority, then
gates), what it runs on top of (its gate's winner), and whether it is skipped (`only_if`).

A plan is read from the `experiment` config group (configs/experiment/*.yaml). Everything here is
decided from the plan and the outcomes so far, so a resumed plan makes the same choices again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpbench.core import ConfigError

PRIORITIES = ("high", "medium", "low")
# The verdicts of a measured experiment, and what an experiment that did not run is.
BETTER, WORSE, NOISE = "better", "worse", "within noise"
SKIPPED, FAILED = "skipped", "failed"
BASELINE = "baseline"


@dataclass(frozen=True)
class Experiment:
    id: str
    overrides: tuple[str, ...]
    priority: str
    rationale: str
    group: str | None = None
    after: str | None = None  # runs on top of this group's winner, once every member is decided
    only_if: tuple[str, ...] = ()  # runs only if one of these improved


@dataclass(frozen=True)
class Plan:
    name: str
    baseline: tuple[str, ...]  # overrides every run of the plan starts from
    experiments: tuple[Experiment, ...]
    description: str = ""

    def by_id(self, exp_id: str) -> Experiment:
        return next(e for e in self.experiments if e.id == exp_id)

    def members(self, group: str) -> list[Experiment]:
        return [e for e in self.experiments if e.group == group]


@dataclass(frozen=True)
class Outcome:
    """What became of an experiment: its verdict, the overrides it ran with (its gate's winner's
    first), which run it was compared against, and its walltime change."""

    id: str
    verdict: str
    applied: tuple[str, ...] = ()
    ran_on: str = BASELINE
    change_pct: float | None = None
    note: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{where}={value}: give a list")
    if not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}={list(value)}: entries must be strings")
    return tuple(value)


_KEYS = {"id", "overrides", "priority", "rationale", "group", "after", "only_if"}
# What every run of a plan shares with its baseline (the points, repeats and probe settings, where it
# writes): an experiment that changed them would not be comparable.
SHARED = ("sweep", "shape", "data", "timing", "probe", "output_dir", "experiment")


def _check_shared(where: str, overrides: Sequence[str]) -> None:
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.split(".", 1)[0] in SHARED:
            raise ConfigError(
                f"{where}: {override}: every experiment measures with the baseline's points, repeats "
                "and probe settings; set it in the plan's baseline"
            )


def parse_plan(node: Mapping[str, Any]) -> Plan:
    """The plan from its config node; a malformed plan, a gate naming nothing or a cycle of gates is a
    ConfigError of one line, before anything runs."""
    if not isinstance(node, Mapping):
        raise ConfigError(f"experiment={node}: a plan is a mapping (baseline, experiments)")
    unknown = set(node) - {"name", "description", "baseline", "experiments"}
    if unknown:
        allowed = "name, description, baseline, experiments"
        raise ConfigError(f"experiment.{sorted(unknown)[0]}: unknown key (allowed: {allowed})")
    items = node.get("experiments") or []
    if not items:
        raise ConfigError("experiment.experiments: a plan needs at least one experiment")
    experiments = []
    for i, item in enumerate(items):
        where = f"experiment.experiments[{i}]"
        if not isinstance(item, Mapping) or not item.get("id"):
            raise ConfigError(f"{where}: each experiment needs an id")
        where = f"experiment {item['id']}"
        if extra := set(item) - _KEYS:
            allowed = ", ".join(sorted(_KEYS))
            raise ConfigError(f"{where}: unknown key {sorted(extra)[0]} (allowed: {allowed})")
        priority = item.get("priority", "medium")
        if priority not in PRIORITIES:
            raise ConfigError(f"{where}: priority={priority}: allowed values are {', '.join(PRIORITIES)}")
        overrides = _strings(item.get("overrides"), f"{where}: overrides")
        if not overrides:
            raise ConfigError(f"{where}: overrides: give at least one (the change it tests)")
        _check_shared(where, overrides)
        experiments.append(
            Experiment(
                id=str(item["id"]),
                overrides=overrides,
                priority=priority,
                rationale=str(item.get("rationale") or ""),
                group=item.get("group"),
                after=item.get("after"),
                only_if=_strings(item.get("only_if"), f"{where}: only_if"),
            )
        )
    plan = Plan(
        name=str(node.get("name") or ""),
        baseline=_strings(node.get("baseline"), "experiment.baseline"),
        experiments=tuple(experiments),
        description=str(node.get("description") or ""),
    )
    check_gates(plan)
    return plan


def dependencies(plan: Plan) -> dict[str, list[str]]:
    """The experiments each one waits for: every member of its `after` group, and its `only_if` ids."""
    deps = {}
    for e in plan.experiments:
        gate = [m.id for m in plan.members(e.after)] if e.after is not None else []
        deps[e.id] = gate + list(e.only_if)
    return deps


def check_gates(plan: Plan) -> None:
    """Ids unique; `after` names a group and `only_if` experiments of the plan; no cycle of gates."""
    ids = [e.id for e in plan.experiments]
    if dup := next((i for i in ids if ids.count(i) > 1), None):
        raise ConfigError(f"experiment {dup}: the id is used twice")
    groups = {e.group for e in plan.experiments if e.group}
    for e in plan.experiments:
        if e.after is not None and e.after not in groups:
            raise ConfigError(f"experiment {e.id}: after={e.after} names no group of the plan")
        for other in e.only_if:
            if other not in ids:
                raise ConfigError(f"experiment {e.id}: only_if names {other}, no experiment of the plan")
    if cycle := find_cycle(dependencies(plan)):
        raise ConfigError(f"experiment: the gates form a cycle: {' -> '.join(cycle)}")


def find_cycle(graph: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of the graph as its path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], path[len(path) :] = 1, [node]
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if state.get(nxt) is None and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in graph:
        if state.get(node) is None and (found := visit(node)):
            return found
    return None


def next_experiment(plan: Plan, outcomes: Mapping[str, Outcome]) -> Experiment | None:
    """The next experiment to decide: of those whose gates are decided, the highest priority, then
    the plan's order. None when every experiment is decided."""
    deps = dependencies(plan)
    ready = [e for e in plan.experiments if e.id not in outcomes and all(d in outcomes for d in deps[e.id])]
    if not ready:
        return None
    return min(ready, key=lambda e: PRIORITIES.index(e.priority))  # min keeps the plan's order on ties


def winner(plan: Plan, group: str, outcomes: Mapping[str, Outcome]) -> Outcome | None:
    """The group's winner: of its members judged better, the largest walltime gain (capacity
    experiments: the largest max N); None (the baseline) when none improved."""
    better = [outcomes[m.id] for m in plan.members(group) if outcomes[m.id].verdict == BETTER]
    return min(better, key=lambda o: (o.change_pct or 0.0, -(o.figures.get("max_n") or 0)), default=None)


def skip_reason(exp: Experiment, outcomes: Mapping[str, Outcome]) -> str | None:
    """Why an `only_if` experiment does not run: none of the experiments it names improved."""
    if not exp.only_if or any(outcomes[i].verdict == BETTER for i in exp.only_if):
        return None
    return f"none of {', '.join(exp.only_if)} improved"


def base_of(plan: Plan, exp: Experiment, outcomes: Mapping[str, Outcome]) -> tuple[str, tuple[str, ...]]:
    """What `exp` runs on top of: its gate's winner (its id and applied overrides), else the baseline."""
    if exp.after is not None and (won := winner(plan, exp.after, outcomes)) is not None:
        return won.id, won.applied
    return BASELINE, ()
