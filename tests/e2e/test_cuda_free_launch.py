"""The launching process never initialises CUDA: it forks the rank server, and every local rank forks
from that, so one cuInit there (torch.cuda.is_available() runs it) would leave every rank "Cannot
re-initialize CUDA in forked subprocess" on a GPU node. On CPU torch.cuda.is_initialized() stays false
whatever runs, so the test watches the calls themselves: a sitecustomize on PYTHONPATH wraps torch's
CUDA-initialising entry points as torch.cuda is imported and logs each call made by the process the
test started (not by the processes it forks or starts)."""

from __future__ import annotations

import ctypes.util
import os
import sys
from pathlib import Path

import pytest
import torch
from support.processes import FAST, cpbench, results, run_cmd

import cpbench as cpbench_package
from cpbench.runtime.rank import _gpus_of_child

# What a watched process imports first: nothing but the import hook, which wraps torch.cuda's entry
# points as soon as torch.cuda has run, before any other module takes a reference to them (its own
# submodules took theirs already: on a CUDA build those end in torch._C's, which are wrapped too).
SHIM = """
import importlib.abc
import importlib.machinery
import os
import sys
import traceback

WATCHED = {"torch.cuda": ("is_available", "device_count", "init", "_lazy_init"),
           "torch._C": ("_cuda_getDeviceCount", "_cuda_init")}


def _log(name):
    if os.getppid() != int(os.environ["CUDA_WATCH_PARENT"]):  # a process the launcher forked or started
        return
    caller = traceback.extract_stack(limit=4)[-3]
    with open(os.environ["CUDA_WATCH_LOG"], "a") as log:
        nvml = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"
        log.write(f"{name} nvml={nvml} from {caller.filename}:{caller.lineno}\\n")


def _wrapped(owner, prefix, name):
    original = getattr(owner, name)

    def call(*args, **kwargs):
        _log(f"{prefix}.{name}")
        return original(*args, **kwargs)

    setattr(owner, name, call)


class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cuda":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for owner, prefix in ((module, "torch.cuda"), (sys.modules["torch._C"], "torch._C")):
                for name in WATCHED[prefix]:
                    if hasattr(owner, name):
                        _wrapped(owner, prefix, name)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Watch())
"""


def _watched(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a process whose CUDA calls are logged, and the log."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    log = tmp_path / "cuda_calls.log"
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "CUDA_WATCH_LOG": str(log), "CUDA_WATCH_PARENT": str(os.getpid())}, log


def _calls(log: Path) -> list[str]:
    """Each logged call: "<function> nvml=<PYTORCH_NVML_BASED_CUDA_CHECK set> from <caller>"."""
    return log.read_text().splitlines() if log.exists() else []


def test_the_shim_sees_a_cuda_query_of_the_started_process_only(tmp_path):
    """The control: a query in the process the test starts is logged (on a CUDA build, torch._C's
    count beneath it too); the same query in a process that one starts is not."""
    env, log = _watched(tmp_path)
    query = "import torch; torch.cuda.is_available(); torch.cuda.device_count()"
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {query!r}], check=True)"
    logged = []
    for code in (query, child):
        done = run_cmd([sys.executable, "-c", code], tmp_path, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        logged.append(_calls(log))
    assert {"torch.cuda.is_available", "torch.cuda.device_count"} <= {c.split()[0] for c in logged[0]}
    assert logged[1] == logged[0]


def test_a_cp2_run_and_its_baseline_never_touch_cuda_in_the_launching_process(watched_run):
    """A real `python -m cpbench` at cp=2 with its cp=1 baseline and the fake-tensor estimate (the
    training run the autograd test watches too: `watched_run`): both launches fork their ranks from the
    rank server, after the launcher decided the backend, checked the GPUs (`check_gpus`) and made the
    estimate. cpbench asks nothing of CUDA there; torch's own code (FakeTensorMode, DeviceMesh,
    LaunchConfig since torch 2.9) asks whether CUDA is available, which it must do through NVML
    (PYTORCH_NVML_BASED_CUDA_CHECK=1), never through cuInit."""
    done, out, log, _ = watched_run
    assert done.returncode == 0, done.stderr
    assert set(results(out)["status"]) == {"ok"} and set(results(out)["cp"]) == {1, 2}
    calls = _calls(log)
    package = str(Path(cpbench_package.__file__).parent)
    assert [c for c in calls if f" from {package}" in c] == []
    through_nvml = ("torch.cuda.is_available nvml=True ", "torch.cuda.device_count nvml=True ")
    if torch.backends.cuda.is_built() and ctypes.util.find_library("cuda") is None:
        # A CUDA build on a machine without a CUDA driver (the floor lane's wheel on CPU): NVML cannot
        # count, so torch's NVML-based check falls back to CUDA's count, which finds nothing to initialise.
        through_nvml += (f"torch._C._cuda_getDeviceCount nvml=True from {torch.cuda.__file__}:",)
    assert [c for c in calls if not c.startswith(through_nvml)] == []


def test_where_nvml_cannot_count_a_child_process_asks_torch():
    """The fallback of `visible_gpus` (MIG devices, no NVML beside a CUDA driver, ROCm): torch's own
    count in a process of its own, 0 on this machine."""
    assert _gpus_of_child(None) == 0


# What a watched process imports first for the autograd test: once torch has loaded, every way into
# autograd's engine that cpbench and torch's own helpers take is wrapped to log the process it ran in
# (pid, parent), and every os.fork logs its forker. On a GPU machine autograd's first backward asks
# CUDA's C++ device count (cuInit) and arms its fork guard (torch/csrc/autograd/engine.cpp,
# start_device_threads), which no Python-level CUDA check sees: on CPU the count is 0, so the calls
# themselves are what the test watches.
AUTOGRAD_SHIM = """
import importlib.abc
import importlib.machinery
import os
import sys


def _log(what):
    with open(os.environ["AUTOGRAD_WATCH_LOG"], "a") as log:
        log.write(f"{what} {os.getpid()} {os.getppid()}\\n")


os.register_at_fork(before=lambda: _log("fork"))


def _wrapped(owner, name):
    original = getattr(owner, name)

    def call(*args, **kwargs):
        _log("autograd")
        return original(*args, **kwargs)

    setattr(owner, name, call)


class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _wrapped(module.Tensor, "backward")
            _wrapped(module.autograd, "backward")
            _wrapped(module.autograd, "grad")

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Watch())
"""


@pytest.fixture(scope="module")
def watched_run(tmp_path_factory):
    """One training run at cp=2 with its cp=1 baseline and the fake-tensor estimate, each launch forking
    its ranks from the rank server, watched by both shims at once (each in a namespace of its own in one
    sitecustomize): the CUDA calls of the launching process, and every backward and fork. Returns the
    finished process, its output folder and the two logs."""
    tmp_path = tmp_path_factory.mktemp("watched")
    env, cuda_log = _watched(tmp_path)
    namespaces = "\n".join(
        f"exec(compile({code!r}, {name!r}, 'exec'), {{'__name__': {name!r}}})"
        for code, name in ((SHIM, "cuda_watch"), (AUTOGRAD_SHIM, "autograd_watch"))
    )
    (tmp_path / "shim" / "sitecustomize.py").write_text(namespaces + "\n")
    autograd_log = tmp_path / "autograd.log"
    env = {**env, "AUTOGRAD_WATCH_LOG": str(autograd_log)}
    out = tmp_path / "out"
    probe = ["probe.enabled=true", "probe.predict=true", "probe.start=32", "probe.max_tokens=64"]
    run = [*FAST, *probe, "probe.granularity=32", "workflow=training", "topology.cp=2",
           "sweep.n_tokens=[32]", "baseline=true"]  # fmt: skip
    done = cpbench(*run, f"output_dir={out}", cwd=tmp_path, timeout=300, env=env, fresh=True)
    return done, out, cuda_log, autograd_log


def test_no_process_that_forks_ranks_runs_autograd(watched_run):
    """A training run at cp=2 with its cp=1 baseline and the fake-tensor estimate, each launch forking
    its ranks from the rank server: every backward (the estimate's and the peak holders' traces, the
    FLOP counter's warm-up, the ranks' steps) runs in a rank or in a helper that forks nothing, never
    in the launching process nor in the process the ranks fork from."""
    done, out, _, log = watched_run
    assert done.returncode == 0, done.stderr
    assert set(results(out)["status"]) == {"ok"} and set(results(out)["cp"]) == {1, 2}
    entries = [line.split() for line in log.read_text().splitlines()]
    launcher = {pid for what, pid, parent in entries if int(parent) == os.getpid()}
    forkers = {pid for what, pid, _ in entries if what == "fork"}
    ran = [(pid, parent) for what, pid, parent in entries if what == "autograd"]
    assert len(launcher) == 1, entries
    assert {parent for _, parent in ran} & forkers, "no rank ran a backward: the shim saw nothing"
    assert [(pid, parent) for pid, parent in ran if pid in launcher | forkers] == []
