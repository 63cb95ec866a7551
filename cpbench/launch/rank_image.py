"""What the local launcher's forkserver loads once, for every rank it forks: the rank loop (and torch
with it) and the FLOP counter's first use, which otherwise cost each rank seconds of CPU at start.
Nothing here runs a backward or touches a device: every rank is forked from this process, and one
cuInit here (autograd's first backward runs one on a GPU machine) fails them all
(cpbench/runtime/fresh_process.py).

All of it is loaded outside the garbage collector and frozen (`runtime.startup.loaded`): a rank
collects before every point (`measure.memory.release`), and walking the hundreds of thousands of
objects of its imports took about a second of CPU per rank; frozen, they are never walked (nor copied
on write by the walk)."""

from cpbench.runtime.startup import loaded

with loaded():
    from cpbench.launch import local  # noqa: F401  (the ranks' entry point, `local._rank`)
    from cpbench.measure import flops

    flops.load_counter()
