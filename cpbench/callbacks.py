"""Hydra callbacks (configs/config.yaml, hydra.callbacks): the end of a multirun merges its jobs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from cpbench.app.process import this_call


class CheckOutputDir(Callback):
    """Before Hydra makes the run's folder: one that cannot be written is a bad input (exit 2), not
    Hydra's traceback. Its call also tells that Hydra composed the config: an exit before that is Hydra
    rejecting the config or an override."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        this_call().composed = True
        self._check(str(config.output_dir))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        this_call().composed = True
        self._check(str(config.hydra.sweep.dir))

    @staticmethod
    def _check(path: str) -> None:
        from cpbench.core import ConfigError
        from cpbench.results.lock import check_writable
        from cpbench.results.paths import RunPaths

        try:
            check_writable(RunPaths(Path(path).resolve()))
        except ConfigError as err:
            print(f"cpbench: error: {err}", file=sys.stderr)
            raise SystemExit(2) from None


class MergeSweep(Callback):
    """At the end of a multirun: wait for the SLURM jobs it left running, then merge every job folder
    of the sweep into one results.csv and cp_benchmark.md (with plots) at the sweep folder's root.
    The sweep ran past failed jobs; it lists them, then exits non-zero."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """submitit's own log (the Hydra submitit launchers wait through it) goes to the sweep's
        `.submitit/submitit.log`, each message once, instead of three times on the console; while a
        submitit SLURM launcher waits, each change of a job's state is one line."""
        from cpbench.app.ranks import tell
        from cpbench.launch.slurm import log_submitit_to, watch_hydra_jobs

        log_submitit_to(Path(str(config.hydra.sweep.dir)) / ".submitit" / "submitit.log")
        this_call().watching.enter_context(watch_hydra_jobs(config.hydra, tell))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # Imported here: every Hydra run builds its callbacks, few of them end a multirun.
        from cpbench.app.ranks import finish_deferred
        from cpbench.report.merge import merge

        this_call().watching.close()
        finish_deferred()
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        merged = merge([sweep_dir])
        print(
            f"cpbench: merged {len(merged.frame)} row(s) from {len(merged.runs)} job(s) -> {merged.report}",
            file=sys.stderr,
        )
        if merged.failed:
            for run in merged.failed:
                print(f"cpbench: job {run.name} failed: {run.error}", file=sys.stderr)
            raise SystemExit(1)
