"""Mechanisms that matter on NCCL, exercised on 2 real gloo ranks: a ring step posts its send and its
receive as one grouped operation (two peers that both send first deadlock NCCL when they are not,
NVIDIA/nccl#479), and after a point that did not fit, peers compare how many collectives each issued, so
that a GPU rank never waits on the device for a collective its peer left (measure/point.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from support.cp_ranks import rank_context, spawn


def _on_two_ranks(rank: int, world: int, tmp: str, check) -> None:
    """One rank of a 2-rank gloo group running `check(rank)`, which returns what went wrong."""
    failures: list[str] = []
    try:
        rank_context(rank, world, tmp, "1d", (world, 1))
        failures += check(rank)
    except Exception as err:  # noqa: BLE001 - reported to the test process
        failures.append(repr(err))
    finally:
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(failures))
        dist.destroy_process_group()


def _ring_step_is_grouped(rank: int) -> list[str]:
    from cpbench.distributed import comm

    grouped: list[int] = []
    real = dist.batch_isend_irecv

    def spy(ops):  # the real call, counted
        grouped.append(len(ops))
        return real(ops)

    dist.batch_isend_irecv = spy
    peer = 1 - rank  # a grid with 2 columns: each rank's peer is both where it sends and receives from
    x = torch.full((3,), float(rank), requires_grad=True)
    got = comm.send_recv(x, dst=peer, src=peer)
    got.sum().backward()
    failures = [] if got.tolist() == [float(peer)] * 3 else [f"rank {rank} received {got.tolist()}"]
    if grouped != [2, 2]:  # forward and backward: each one send and one receive, together
        failures.append(f"rank {rank}: grouped operations {grouped}")
    return failures


def test_a_ring_step_posts_send_and_receive_as_one_group():
    assert spawn(_on_two_ranks, 2, _ring_step_is_grouped, timeout=120) == [[], []]


def _in_flight(rank: int) -> list[str]:
    from cpbench.measure.point import collectives_in_flight

    cases = {  # (this rank's count, counted) -> expected
        "equal": ((5, True), False),
        "one more on rank 1": ((5 + rank, True), True),
        "uncounted": ((5, False), True),
    }
    return [
        f"rank {rank}: {name}: expected {expected}"
        for name, ((issued, counted), expected) in cases.items()
        if collectives_in_flight(issued, dist.group.WORLD, counted) != expected
    ]


def test_collectives_left_in_flight_are_found_by_comparing_counts():
    assert spawn(_on_two_ranks, 2, _in_flight, timeout=120) == [[], []]
