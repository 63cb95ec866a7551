"""The walltime points of a run and what is already done, so a restarted run resumes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from cpbench.results.store import RESULTS_CSV, append_row, write_atomically
from cpbench.workloads.base import Shape

STATE_JSON = "state.json"


def resolve_shape(
    cfg: DictConfig, n_tokens: int | None = None, n_atoms: int | None = None, msa_depth: int | None = None
) -> Shape:
    """A point's shape: given values, else `shape.*`; atoms default to atoms_per_token * N."""
    n = n_tokens or cfg.shape.n_tokens
    atoms = n_atoms or cfg.shape.n_atoms or cfg.shape.atoms_per_token * n
    return Shape(n_tokens=n, n_atoms=atoms, msa_depth=msa_depth or cfg.shape.msa_depth)


def sweep_points(cfg: DictConfig) -> list[Shape]:
    """The product of the sweep lists, each point once, in order."""
    points = [
        resolve_shape(cfg, n, a, s)
        for n, a, s in itertools.product(cfg.sweep.n_tokens, cfg.sweep.n_atoms, cfg.sweep.msa_depth)
    ]
    return list(dict.fromkeys(points))


def point_key(kind: str, shape: Shape) -> str:
    return f"{kind}:{shape.n_tokens}:{shape.n_atoms}:{shape.msa_depth}"


def done_keys(frame: pd.DataFrame, config_hash: str) -> set[str]:
    """Points of this configuration that already have a row, whatever their status."""
    if frame.empty or "config_hash" not in frame.columns:
        return set()
    mine = frame[frame["config_hash"] == config_hash]
    return {f"{r.kind}:{r.N_tokens}:{r.N_atoms}:{r.MSA_depth}" for r in mine.itertuples()}


class InFlight:
    """Names the point being measured, so a run that dies mid-point leaves a row behind: the point
    is recorded (crashed or error) and not tried again."""

    def __init__(self, output_dir: Path):
        self.path = output_dir / STATE_JSON
        self.results = output_dir / RESULTS_CSV

    def start(self, row: dict) -> None:
        write_atomically(self.path, json.dumps({"in_flight": row}) + "\n")

    def finish(self, row: dict) -> None:
        """Append the point's row, then clear the in-flight mark."""
        append_row(self.results, row)
        write_atomically(self.path, json.dumps({"in_flight": None}) + "\n")

    def close(self, status: str, error: str) -> dict | None:
        """Record a point left in flight by a run that died; return its row, if there was one."""
        if not self.path.exists():
            return None
        row = json.loads(self.path.read_text()).get("in_flight")
        if row is None:
            return None
        row = {**row, "status": status, "error": error}
        self.finish(row)
        return row
