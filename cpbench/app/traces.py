"""The launching process's fake-tensor traces: the memory estimate before the ranks start (alone, it
is `python -m cpbench.predict`'s command) and who holds the peak after them. A training trace runs a
backward, which a process that forks ranks must never run (cpbench/runtime/fresh_process.py says
why), so it runs in a fresh process that builds the workload from the settings as the ranks do; an
inference trace runs no autograd and stays here."""

from __future__ import annotations

import sys

from hydra.utils import instantiate

from cpbench.app.invocation import Invocation
from cpbench.core import Topology
from cpbench.probe import predict
from cpbench.probe.predict import Prediction
from cpbench.probe.trace import CannotTrace
from cpbench.results.folder import RunFolder
from cpbench.runtime.fresh_process import call_in_fresh_process
from cpbench.settings.schema import BenchConfig, Command, Workflow
from cpbench.workloads.base import Workload


def estimate(settings: BenchConfig, workload: Workload, topology: Topology) -> Prediction:
    """The run's fake-tensor estimate (`predict.for_run`); CannotTrace as it raises it."""
    if settings.workflow is Workflow.training:
        return call_in_fresh_process(_estimate, settings, topology)
    return predict.for_run(settings, workload, topology)


def holders_at(
    settings: BenchConfig, workload: Workload, topology: Topology, n: int
) -> list[tuple[str, int]]:
    """Who holds the run's peak at N (`predict.holders_at`)."""
    if settings.workflow is Workflow.training:
        return call_in_fresh_process(_holders_at, settings, topology, n)
    return predict.holders_at(settings, workload, topology, n)


def predict_alone(call: Invocation) -> int:
    """`python -m cpbench.predict`: the estimate printed and kept, no rank started; 1 when none."""
    return 0 if estimate_for(call) else 1


def estimate_for(call: Invocation) -> Prediction | None:
    """The run's estimate, recorded where this process leads the run folder."""
    run = call.run
    return fake_tensor_estimate(
        run.settings, run.workload, run.topology, call.folder if run.launcher.leads else None
    )


def fake_tensor_estimate(
    settings: BenchConfig, workload: Workload, topology: Topology, folder: RunFolder | None
) -> Prediction | None:
    """The fake-tensor estimate, made here before any process group starts (under torchrun, by each
    rank before it joins); the lock holder records it in prediction.json and prints it when alone."""
    try:
        prediction = estimate(settings, workload, topology)
    except CannotTrace as err:
        alone = settings.command is Command.predict
        then = "no estimate" if alone else "the plain probe runs"
        print(f"cpbench: probe.predict: cannot run on fake tensors: {err}; {then}", file=sys.stderr)
        return None
    if folder is None:
        return prediction
    folder.write_json(folder.prediction, prediction.as_json())
    if settings.command is Command.predict:
        print("\n".join(predict.summary(prediction)))
    else:
        print(
            f"cpbench: probe.predict: max N_tokens {prediction.proposal or 'none'} predicted within "
            f"{prediction.cap_gib:g} GiB per rank; real steps confirm it",
            file=sys.stderr,
        )
    return prediction


def _estimate(settings: BenchConfig, topology: Topology) -> Prediction:
    return predict.for_run(settings, instantiate(settings.workload), topology)


def _holders_at(settings: BenchConfig, topology: Topology, n: int) -> list[tuple[str, int]]:
    return predict.holders_at(settings, instantiate(settings.workload), topology, n)
