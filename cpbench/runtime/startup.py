"""A process's imports, kept out of the garbage collector's way.

torch, Hydra and cpbench's own modules leave hundreds of thousands of objects that live as long as the
process. Collected as they are made, and walked again by every later full collection (a rank collects
before each point) and once more at interpreter exit, they cost about a second of CPU per process:
`import cpbench.__main__` took 2.2 s of CPU with its exit, 1.2 s with `loaded()` around it (this
machine, docs/architecture.md). Frozen (`gc.freeze`), they are never walked; garbage made later is
collected as usual."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def loaded() -> Iterator[None]:
    """Around a process's imports: no collection while they run, and what they made frozen after.

    Their garbage is collected first, never frozen: frozen, it lives as long as the process. An import
    run inside a caller's frames (a rank loading the FLOP counter) makes such garbage: torch.fx's `wrap`
    leaves a frame that refers to itself, and a frame keeps its callers' frames and their locals. Frozen,
    it kept a rank's process groups past `destroy_process_group()`, and their gloo threads ran into
    interpreter exit, where one that released a work's tensors aborted the process ("terminate called
    without an active exception", tests/e2e/test_teardown.py). Only the youngest generation is walked: all
    that was made with collection off is there."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect(0)
        gc.freeze()
        if enabled:
            gc.enable()


def freeze_loaded() -> None:
    """For a process whose imports ran outside `loaded()` (a submitit task unpickling its callable)."""
    gc.freeze()
