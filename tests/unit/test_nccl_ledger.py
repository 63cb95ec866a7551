"""Every collective through the ledger is counted as issued (what peers compare after a point that did
not fit; tests/e2e/test_nccl_semantics.py runs the comparison on real ranks)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def test_every_collective_through_the_ledger_is_counted_as_issued():
    from cpbench.distributed.comm import LEDGER, all_reduce_sum

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        before = LEDGER.issued
        all_reduce_sum(torch.ones(2), dist.group.WORLD)
        LEDGER.reset()  # a point's figures are reset; the count of what was issued is not
        all_reduce_sum(torch.ones(2), dist.group.WORLD)
        assert LEDGER.issued - before == 2
    finally:
        dist.destroy_process_group()
