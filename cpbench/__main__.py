"""`python -m cpbench`: one Hydra application. Under torchrun it is one rank; started plainly it
launches `topology.cp` local ranks itself."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cpbench.bench import RunSpec, run_rank
from cpbench.config.schema import register
from cpbench.config.validate import ConfigError, validate
from cpbench.launch.local import RankFailure, launch_local
from cpbench.report.markdown import write_report
from cpbench.runtime.rank import pick_backend
from cpbench.sweep import InFlight
from cpbench.workloads.adapter import WorkloadError

register()


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _check_environment(cfg: DictConfig, cp: int) -> None:
    if _under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != cp:
            raise ConfigError(
                f"topology.cp={cp}: torchrun started {world} rank(s); give them the same number"
            )
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    else:
        local = cp
    if pick_backend(cfg.dist.backend) == "nccl":
        import torch

        visible = torch.cuda.device_count()
        if local > visible:
            raise ConfigError(
                f"topology.cp={cp}: needs {local} GPUs on this node, {visible} visible (one rank per GPU)"
            )


def _check_workload(cfg: DictConfig) -> None:
    try:
        instantiate(cfg.workload)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, WorkloadError):
            raise ConfigError(str(cause)) from None
        raise ConfigError(
            f"workload: cannot be built from {OmegaConf.to_container(cfg.workload)} "
            f"({str(err).splitlines()[0]})"
        ) from None


def run(cfg: DictConfig) -> int:
    """Validate, then run as one rank (torchrun, or cp=1) or launch the ranks. Returns the exit code."""
    output_dir = Path(cfg.output_dir).resolve()
    try:
        topology = validate(cfg)
        _check_environment(cfg, topology.cp)
        _check_workload(cfg)
    except ConfigError as err:
        print(f"cpbench: error: {err}", file=sys.stderr)
        if output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()  # Hydra made it for this run; a rejected run leaves nothing
        return 2
    spec = RunSpec(
        cfg=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), output_dir=str(output_dir)
    )
    if _under_torchrun() or topology.cp == 1:
        run_rank(spec)
        return 0
    try:
        launch_local(spec, topology.cp, cfg.launch.max_restarts)
    except RankFailure as failure:
        InFlight(output_dir).close("crashed" if failure.crashed else "error", str(failure))
        write_report(output_dir)
        print(f"cpbench: {failure}", file=sys.stderr)
        if failure.traceback:
            print(failure.traceback, file=sys.stderr)
        print(f"cpbench: rows measured so far are in {output_dir / 'results.csv'}", file=sys.stderr)
        return 1
    return 0


@hydra.main(version_base="1.3", config_path="pkg://cpbench.configs", config_name="config")
def app(cfg: DictConfig) -> None:
    code = run(cfg)
    if code:
        raise SystemExit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
