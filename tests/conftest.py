"""The suite's pytest hooks and fixtures: the lanes (a test's folder decides), the order of the files,
the measured durations, and the SLURM clusters. What tests import lives in tests/support/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.processes import TESTS

UNIT = TESTS / "unit"

# Seconds each file took in a real run of the suite (setup, call and teardown summed over its tests),
# written by that run: `CPBENCH_DURATIONS=tests/durations.json pytest -q` (docs/development.md). A file
# not in it (a new one) is taken as quick.
DURATIONS = TESTS / "durations.json"
FILE_SECONDS: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
_measured: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's phases, summed by file, where CPBENCH_DURATIONS asks for them (on xdist's controller
    too, which receives every worker's reports)."""
    if os.environ.get("CPBENCH_DURATIONS"):
        name = Path(report.nodeid.split("::", 1)[0]).name
        _measured[name] = _measured.get(name, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The measured durations written once, by the controller (a worker has only its own files)."""
    target = os.environ.get("CPBENCH_DURATIONS")
    if target and _measured and not hasattr(session.config, "workerinput"):
        ordered = dict(sorted(((k, round(v, 1)) for k, v in _measured.items()), key=lambda kv: -kv[1]))
        Path(target).write_text(json.dumps(ordered, indent=1) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test's folder is its lane: tests/unit/ is `unit` (in-process, `pytest -m unit`, the same tests
    as `pytest tests/unit`), every other test `e2e` (it starts real processes, `pytest -m e2e`). The
    floor lane's tests (tests/e2e/test_torch_floor.py) run only where `-m` names them: CI runs them at
    the floor torch.

    The files go to the workers longest first (a file's tests stay on one worker, `--dist loadfile`):
    the longest-processing-time rule, so that no worker is left with a long file while the others have
    finished. The slow SLURM files lead that list anyway (a worker mostly waits on the scheduler there,
    while the others keep the cores busy); the in-process files, quick, fill the last gaps. xdist keeps
    this order only with `--no-loadscope-reorder` (pyproject's addopts): by default it sends the files
    with the most tests first, the many quick in-process ones, and the slow files ran last (on this
    2-core machine the suite took 11m34s in xdist's order at f4139c8, 10m42s in this one)."""
    for item in items:
        item.add_marker(pytest.mark.unit if UNIT in item.path.resolve().parents else pytest.mark.e2e)
    if "floor" not in (config.option.markexpr or ""):
        floor = [item for item in items if item.get_closest_marker("floor") is not None]
        config.hook.pytest_deselected(items=floor)
        items[:] = [item for item in items if item.get_closest_marker("floor") is None]

    def order(item: pytest.Item) -> tuple[int, int]:
        return (item.get_closest_marker("unit") is not None, -round(FILE_SECONDS.get(item.path.name, 0)))

    first: dict[Path, tuple[int, int]] = {}
    for item in items:
        first[item.path] = min(first.get(item.path, (1, 0)), order(item))
    items.sort(key=lambda item: first[item.path])  # stable: a file's tests stay together, in order


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The private one-node SLURM cluster (tests/support/slurm_cluster.py), shared by the tests of a
    session."""
    from support import slurm_cluster

    slurm_cluster.skip_without_slurm()
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture
def idle_cluster(slurm_cluster):
    """The cluster, with no job on it when a test starts or ends."""
    slurm_cluster.cancel_all()
    yield slurm_cluster
    slurm_cluster.cancel_all()


@pytest.fixture(scope="session")
def two_node_cluster(tmp_path_factory):
    """A private SLURM cluster of two nodes (two slurmd on this host, tests/support/slurm_cluster.py),
    shared by the tests of a session; its node names resolve through /etc/hosts while it runs."""
    from support import slurm_cluster

    slurm_cluster.skip_without_slurm()
    slurm_cluster.skip_without_hosts_file()
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm2"), nodes=2)
    yield cluster
    cluster.stop()


@pytest.fixture
def clean_alloc_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Neither allocator variable set, and whatever the test sets undone after it (setenv records the
    original)."""
    from cpbench.measure.memory import ALLOC_CONF_VARS

    for name in ALLOC_CONF_VARS:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch
