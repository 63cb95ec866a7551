"""What the local launcher's forkserver loads once, for every rank it forks: the rank loop (and torch
with it) and the FLOP counter's first use, which otherwise cost each rank seconds of CPU at start.

What it loaded is then frozen out of the garbage collector: a rank collects before every point
(`measure.memory.release`), and walking the hundreds of thousands of objects of its imports took
about a second of CPU per rank; frozen, they are never walked (nor copied on write by the walk)."""

import gc

from cpbench.launch import local  # noqa: F401  (the ranks' entry point, `local._rank`)
from cpbench.measure import flops

flops.load_counter()
gc.collect()
gc.freeze()
