"""What the tests hand a run: the example feature file (`EXAMPLE`), the adapter that records what it
is told (`TOLD`, tests/adapters/told.py), the tests' experiment plans (`PLANS`, tests/plans/) and the
loopback interface's name (`LOOPBACK`)."""

from __future__ import annotations

import socket

from support.processes import TESTS

EXAMPLE = TESTS.parent / "examples" / "complex_304.npz"
TOLD = ["workload=adapter", "workload.module=adapters.told"]
# Hydra finds the tests' own plans (tests/plans/experiment/) beside the shipped ones.
PLANS = f"hydra.searchpath=[file://{TESTS / 'plans'}]"
LOOPBACK = next(name for _, name in socket.if_nameindex() if name == "lo")
