"""Helpers to run cpbench through its real entry points, each bounded and cleaned up: `cpbench(...)` (a
launch forked from the test worker's server, or a fresh interpreter), `torchrun(...)`, `run_cmd(...)`,
`refused(...)` (main() in this process, for an input refused before anything starts), and the settings
every test launch starts from (`BASE`, `TIMING`, `FAST`)."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

TESTS = Path(__file__).resolve().parents[1]  # tests/: on the PYTHONPATH of what the tests start (adapters)
# The cheapest workload, unless a test names another (a later override wins); each test measures its
# own cp alone, without the cp=1 baseline (tests/e2e/test_baseline.py turns it on), and with no time budget:
# a test run is no benchmark, and its step count stays what the test sets (tests/e2e/test_budget.py sets one).
# The tests' sizes were chosen under a 0.5 GiB CPU cap; the default run's own (configs/config.yaml) is
# smaller, for a short first run, and tests/e2e/test_like_for_like.py measures under it.
BASE = ["workload=axial_mix", "baseline=false", "budget.minutes=null", "memory.cpu_budget_gib=0.5"]
# Fixed step counts (caps at the floors): the adaptive warm-up and repeats are tested on their own.
TIMING = [
    "timing.warmup=1",
    "timing.repeats=2",
    "timing.warmup_max=1",
    "timing.repeats_max=2",
    "log.progress=false",
]
FAST = [*TIMING, "probe.enabled=false"]  # walltime points only: tests of the probe turn it on


# What a rank 0 imports to draw the report's plots (cpbench/report/plots.py imports it when it draws, so
# that ranks that never draw do not pay for it): about 0.35 s of CPU a run.
_PLOTS = ["matplotlib.figure", "matplotlib.backends.backend_agg"]


def rank_processes() -> multiprocessing.context.BaseContext:
    """Processes a test starts itself (a launcher, ranks): forked from one server per test worker that
    loaded `python -m cpbench`'s modules, torch, the rank loop, the FLOP counter and matplotlib once
    (multiprocessing's forkserver, as the local launcher's ranks are), instead of started as fresh
    interpreters, each importing them anew (seconds of CPU a process). Never forked from the test
    process itself, whose threads a fork would copy half."""
    multiprocessing.set_forkserver_preload(
        ["cpbench.__main__", "cpbench.launch.rank_image", "cpbench.models.fold", *_PLOTS]
    )
    return multiprocessing.get_context("forkserver")


def run_cmd(
    cmd: list[str], cwd: Path, timeout: float = 180, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run in its own session so that on timeout the whole process tree is killed."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n{out}\n{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def cpbench(
    *args: str, cwd: Path, timeout: float = 180, env: dict | None = None, fresh: bool = False
) -> subprocess.CompletedProcess:
    """`python -m cpbench ...` as a process of its own. Forked from the test worker's server
    (`rank_processes`) unless `fresh`: `main()` runs with the command's arguments, working folder and
    environment, and its output and exit code are the process's, as `python -m cpbench` gives them,
    but its imports are not paid again (about 2 s of CPU a launch; its rank server holds the rank loop
    and the FLOP counter already). `fresh`: a new interpreter, `python -m cpbench` itself, for what
    only its start shows; tests/e2e/test_outputs.py runs one command both ways and gets the same checksums."""
    flags = ["-m"] if args[:1] == ("-m",) else []  # Hydra takes its flags before the overrides
    overrides = [*flags, *BASE, *args[len(flags) :]]
    if fresh:
        return run_cmd([sys.executable, "-m", "cpbench", *overrides], cwd, timeout, env)
    command = ["cpbench", *overrides]
    with tempfile.TemporaryDirectory() as streams:
        out, err = Path(streams) / "stdout", Path(streams) / "stderr"
        process = rank_processes().Process(
            target=_run_main, args=(overrides, str(cwd), _environment(env), str(out), str(err))
        )
        process.start()
        try:
            process.join(timeout)
            if process.exitcode is None:
                pytest.fail(f"{' '.join(command)} timed out after {timeout}s\n{_text(out)}\n{_text(err)}")
        finally:
            if process.exitcode is None:
                os.killpg(process.pid, signal.SIGKILL)  # its session: the launcher and its ranks
                process.join()
        return subprocess.CompletedProcess(command, process.exitcode, _text(out), _text(err))


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _environment(env: dict | None) -> dict[str, str]:
    """The environment `run_cmd` gives a process: this one's, the tests' folder on PYTHONPATH (for the
    test adapters), and the test's own variables; CPBENCH_OUTPUT_DIR only if the test sets it."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    full = {**os.environ, "PYTHONPATH": path, **(env or {})}
    if "CPBENCH_OUTPUT_DIR" not in (env or {}):
        full.pop("CPBENCH_OUTPUT_DIR", None)
    return full


def _run_main(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """A forked launcher's whole life, set up as `python -m cpbench` finds its process: its own session
    (a timeout kills it with its ranks), stdout and stderr to files, the command's arguments, folder,
    environment and import path (the working folder first, then PYTHONPATH); it ends as the interpreter
    does, its exit handlers run and its streams flushed, with main()'s exit code."""
    import atexit
    import importlib
    import traceback

    from cpbench.__main__ import __file__ as main_file
    from cpbench.__main__ import main

    os.setsid()
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    sys.path[:0] = [cwd, *env["PYTHONPATH"].split(os.pathsep)]
    importlib.invalidate_caches()
    sys.argv = [main_file, *args]
    code = 0
    try:
        main()
    except SystemExit as done:
        code = _exit_code(done, sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _exit_code(done: SystemExit, stderr) -> int:
    """The exit code the interpreter gives a SystemExit on its way out, printing a message it carries."""
    if isinstance(done.code, int) or done.code is None:
        return done.code or 0
    print(done.code, file=stderr)
    return 1


def refused(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m cpbench`'s own `main()`, run in this test process, for an input that is refused before
    anything starts: the same code, its exit code and all it writes to stdout and stderr (the file
    descriptors, as a process's would be), without a fresh interpreter's seconds of imports.
    tests/e2e/test_failures.py and tests/e2e/test_faults.py also run a refusal as a process of its own."""
    from cpbench.__main__ import main

    root = logging.getLogger()  # Hydra configures logging for its run: this process's is given back
    handlers, level, argv, here = root.handlers[:], root.level, sys.argv, os.getcwd()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        streams = [open(fd, "w", closefd=False) for fd in (1, 2)]  # noqa: SIM115
        command = ["cpbench", *BASE, *args]
        sys.argv, code = command, 0
        output_dir = os.environ.pop("CPBENCH_OUTPUT_DIR", None)  # as run_cmd leaves it out
        os.chdir(cwd)
        try:
            with contextlib.redirect_stdout(streams[0]), contextlib.redirect_stderr(streams[1]):
                main()
        except SystemExit as done:
            code = _exit_code(done, streams[1])
        finally:
            for stream, fd, old in zip(streams, (1, 2), saved, strict=True):
                stream.flush()
                os.dup2(old, fd)
                os.close(old)
            sys.argv, root.handlers[:] = argv, handlers
            root.setLevel(level)
            os.chdir(here)
            if output_dir is not None:
                os.environ["CPBENCH_OUTPUT_DIR"] = output_dir
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, code, out.read().decode(), err.read().decode())


def torchrun(
    nproc: int, *args: str, cwd: Path, timeout: float = 180, env: dict | None = None, max_restarts: int = 0
):
    # torchrun's own logs under the test's folder: by default it leaves a torchelastic_* folder in /tmp.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--max-restarts={max_restarts}", f"--log-dir={cwd / 'torchrun_logs'}", "-m", "cpbench", *BASE,
           *args]  # fmt: skip
    return run_cmd(cmd, cwd, timeout, env)


def results(output_dir: Path) -> pd.DataFrame:
    """results.csv as cpbench reads it back (`read_results`): a label column stays text, so that a hash
    of digits alone (sizes_hash 55110350) is not read as a number."""
    from cpbench.results.store import read_results

    return read_results(output_dir / "results.csv")


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def wait_for(condition, what: str = "the condition", job: subprocess.Popen | None = None,
             timeout: float = 120) -> None:  # fmt: skip
    """Poll `condition` until it holds; fail the test after `timeout` seconds, or as soon as `job` (the
    run the test waits on, if any) has ended without it."""
    deadline = time.monotonic() + timeout
    while not condition():
        if job is not None and job.poll() is not None:
            pytest.fail(f"the run ended before {what}: {job.communicate()}")
        if time.monotonic() >= deadline:
            pytest.fail(f"never saw {what}")
        time.sleep(0.02)


def one_line_exit_2(proc) -> str:
    """The run ended with its one line and exit 2, no traceback."""
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("cpbench: error:")][-1]
