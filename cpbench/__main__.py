"""`python -m cpbench`: one Hydra application. Under torchrun it is one rank; started plainly it
launches `topology.cp` local ranks itself; with `slurm.enabled=true` it submits them as one SLURM job.
In a multirun each job writes to its own folder and a failed job does not stop the sweep."""

from __future__ import annotations

import sys

from cpbench.runtime.startup import loaded

with loaded():
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    from cpbench.app.campaign import run
    from cpbench.app.multirun import plan_run, run_job, sweep_job_dir
    from cpbench.app.preflight import checked
    from cpbench.app.process import begin
    from cpbench.core import ConfigError
    from cpbench.experiment.runner import run_plan
    from cpbench.settings.overrides import check_overrides
    from cpbench.settings.schema import register

register()


@hydra.main(version_base="1.3", config_path="pkg://cpbench.configs", config_name="config")
def app(cfg: DictConfig) -> None:
    job_dir = sweep_job_dir()
    if cfg.experiment is not None:
        if job_dir is not None:
            print("cpbench: error: experiment: a plan runs its own runs, not in a multirun", file=sys.stderr)
            raise SystemExit(2)
        overrides = HydraConfig.get().overrides.task
        code = run_plan(cfg, overrides, checked, plan_run)
        if code:
            raise SystemExit(code)
        return
    if job_dir is None:
        code = run(cfg)
        if code:
            raise SystemExit(code)
        return
    run_job(cfg, job_dir)


def main() -> None:
    call = begin()
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        app()
    except SystemExit as done:
        # Hydra exits 1 for its own config errors (an unknown key, a bad override): a bad input, as ours.
        if done.code == 1 and not call.composed:
            raise SystemExit(2) from None
        raise


if __name__ == "__main__":
    main()
