"""A checksum of whatever a step returns: tensors, DTensors and tuples, lists and dicts of them.

Each rank contributes its share; the shares summed over the ranks are the checksum. A DTensor is
counted once: its shards each count, a replica only on the first rank of its mesh dim, a pending
sum as it is and a pending average divided by the ranks it averages over (any other pending
reduction is taken from the first rank). Nothing returned leaves the checksum blank, never 0."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from cpbench.distributed.dtensor import is_dtensor

_CHUNK = 2**20  # elements


def _sum(tensor: torch.Tensor) -> float:
    """The float64 sum a chunk at a time: a float64 copy of a whole output would count in the
    point's peak memory (twice the output's size in float32)."""
    chunks = tensor.detach().reshape(-1).split(_CHUNK)
    return math.fsum(float(chunk.sum(dtype=torch.float64)) for chunk in chunks)


def local_share(out: Any) -> float | None:
    """This rank's share of the float64 sum of `out`; None when `out` holds no tensor."""
    if is_dtensor(out):
        coordinate = out.device_mesh.get_coordinate()
        if coordinate is None:  # this rank is not on the tensor's mesh
            return None
        share = _sum(out.to_local())
        for dim, placement in enumerate(out.placements):
            op = getattr(placement, "reduce_op", None) if placement.is_partial() else None
            if op == "avg":
                share /= out.device_mesh.size(dim)
            elif op != "sum" and not placement.is_shard() and coordinate[dim] != 0:
                return 0.0  # a replica (or a pending max or min): counted on the first rank only
        return share
    if isinstance(out, torch.Tensor):
        return _sum(out)
    if isinstance(out, Mapping):
        parts = [local_share(v) for v in out.values()]
    elif isinstance(out, (tuple, list)):
        parts = [local_share(v) for v in out]
    else:
        return None
    found = [p for p in parts if p is not None]
    return sum(found) if found else None
