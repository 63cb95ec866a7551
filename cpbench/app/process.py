"""What one `python -m cpbench` process carries from one Hydra call to the next, in one place. Hydra
runs a multirun's jobs in this process one after another and builds its callbacks apart from them (a
Hydra submitit launcher pickles the callbacks into every job), so nothing here can live on a job or a
callback; `main()` starts each call with a new one (tests run main() many times in one process)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cpbench.launch.base import Launcher, Submitted


@dataclass
class ThisCall:
    composed: bool = False  # Hydra composed the config: an exit before that is Hydra rejecting it
    # Jobs a multirun submitted without waiting (the basic launcher runs its jobs one after another);
    # the end of the sweep waits for them all, so that they run side by side.
    deferred: list[tuple[Launcher, Submitted]] = field(default_factory=list)
    watching: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # the sweep's jobs


_CALL = ThisCall()


def begin() -> ThisCall:
    """A new call of main(): nothing carried over from an earlier one."""
    global _CALL
    _CALL = ThisCall()
    return _CALL


def this_call() -> ThisCall:
    return _CALL
