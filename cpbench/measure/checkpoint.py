"""Checkpoint and resume of a training run through torch.distributed.checkpoint (DCP): the model and
optimizer sharded as the model is (each rank writes its shards, replicated tensors once), the step
and every rank's RNG state in a small file per rank. A checkpoint is complete once `done.json` is
written, after every rank's files: a run killed mid-save resumes from the one before."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from cpbench.results.folder import RunFolder

DONE = "done.json"


@dataclass(frozen=True)
class Saved:
    step: int  # steps done when it was taken
    seconds: float  # the slowest rank's time to write it
    bytes: int  # on disk, every rank's files together


def _rank_file(path: Path, rank: int) -> Path:
    return path / f"rank{rank}.pt"


def _rng_state() -> dict[str, object]:
    state: dict[str, object] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save(
    path: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    group: dist.ProcessGroup,
    key: str,
) -> Saved:
    """Every rank calls it; rank 0 marks the checkpoint complete last, with the `key` of the settings
    it belongs to."""
    rank = dist.get_rank(group)
    start = time.perf_counter()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), process_group=group)
    temp = path / f".rank{rank}.pt.tmp"
    torch.save({"step": step, "rng": _rng_state()}, temp)
    os.replace(temp, _rank_file(path, rank))
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)  # also: every rank's files are written
    size = checkpoint_bytes(path)
    saved = Saved(step, seconds.item(), size)
    if rank == 0:
        RunFolder.write_json(path / DONE, {"step": step, "seconds": saved.seconds, "bytes": size, "key": key})
    dist.barrier(group=group)
    return saved


def checkpoint_bytes(path: Path) -> int:
    """The checkpoint's size: DCP's files and the rank files, all written once the ranks have met.
    Rank 0's `done.json` (and its temporary file, renamed away at any moment) is left out, so that
    every rank counts the same files, however far rank 0 has got."""
    files = (f for f in path.rglob("*") if f.name != DONE and not f.name.startswith(f".{DONE}."))
    return sum(f.stat().st_size for f in files if f.is_file())


def latest(folder: Path, key: str) -> Path | None:
    """The last complete checkpoint under `folder` taken under settings of this `key`, or None."""
    done = sorted(folder.glob(f"*/{DONE}")) if folder.is_dir() else []
    mine = [p.parent for p in done if (RunFolder.read_json(p) or {}).get("key") == key]
    return mine[-1] if mine else None


def load(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, group: dist.ProcessGroup
) -> int:
    """Restore the model, optimizer and this rank's RNG state; return the steps done."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path), process_group=group)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mine = torch.load(_rank_file(path, dist.get_rank(group)), weights_only=True)
    torch.set_rng_state(mine["rng"]["cpu"])
    if "cuda" in mine["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(mine["rng"]["cuda"])
    return int(mine["step"])
