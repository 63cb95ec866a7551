"""`python -m cpbench.predict`: the fake-tensor estimate of the largest N alone, on any machine: the
run's config and overrides (`topology.cp=8 memory.budget_gib=80`), no real step (docs/probe.md)."""

from __future__ import annotations

import sys

from cpbench.__main__ import main

if __name__ == "__main__":
    sys.argv.append("command=predict")
    main()
