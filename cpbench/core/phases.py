"""Named phases of a step, timed inside it: a model marks them (`with phase("trunk"):`) and the step
runner reads them, so that a loop the real job runs more often than the benchmark (recycling,
sampling steps) can be scaled by its own time, not by the whole step's.

On a GPU each boundary is a CUDA event recorded on the current stream: timing adds no
synchronisation inside the step, and the events are read once the step's own synchronisation is
done. On CPU, where ops run synchronously, the wall clock. With no timer on (FLOP counting, fake
tensor traces, a model run outside the step runner), `phase` costs one global read.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

TRUNK = "trunk"  # one trunk pass (a recycling iteration: MSA module and Pairformer)
SAMPLING_STEP = "sampling_step"  # one denoising step of the diffusion sampler (training: its one step)
# The phases with a column of their own in results.csv (ResultRow): a new phase adds one here and there.
COLUMNS = {TRUNK: "trunk_ms", SAMPLING_STEP: "sampling_step_ms"}
# The setting that counts each phase's passes: the real job's count over the benchmark's scales the
# phase's time (the what-changed table, docs/budget.md).
COUNTED_BY = {TRUNK: "workload.n_cycles", SAMPLING_STEP: "workload.sampling.steps"}


class PhaseTimer:
    """The spans of each named phase during one step. A phase entered again while it is open (a
    recursive call) is one span, so that its time counts once; phases of other names nest freely,
    the outer one's time including the inner one's."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: dict[str, list[tuple[Any, Any]]] = {}
        self.open: list[str] = []  # the phases open now, the innermost last

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()  # on the current stream, behind the work queued before it
            return event
        return time.perf_counter()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        if name in self.open:
            yield
            return
        self.open.append(name)
        start = self._mark()
        try:
            yield
        finally:
            self.open.remove(name)
        self.spans.setdefault(name, []).append((start, self._mark()))  # a failed step is not read

    def per_pass(self) -> dict[str, float]:
        """Seconds of one pass of each phase: the mean of its spans in the step. On a GPU, read after
        the step has synchronised: each event is then complete, and waiting on it costs nothing."""
        seconds = {}
        for name, spans in self.spans.items():
            if self.cuda:
                for _, end in spans:
                    end.synchronize()  # done already, unless the model recorded it on a side stream
                total = sum(start.elapsed_time(end) for start, end in spans) / 1e3
            else:
                total = sum(end - start for start, end in spans)
            seconds[name] = total / len(spans)
        return seconds


_active: PhaseTimer | None = None


def phase(name: str) -> AbstractContextManager[Any]:
    """Time the block as one pass of phase `name` while a step is timed; otherwise do nothing."""
    timer = _active
    return nullcontext() if timer is None else timer.span(name)


def innermost() -> str | None:
    """The innermost phase open now, while phases are timed: a count of the step's work
    (measure/flops.py) files each op under it."""
    return _active.open[-1] if _active is not None and _active.open else None


@contextmanager
def timing(device: torch.device) -> Iterator[PhaseTimer]:
    """Turn phase timing on for the block (one step); the timer it yields holds the spans."""
    global _active
    outer, _active = _active, PhaseTimer(device)
    try:
        yield _active
    finally:
        _active = outer


def slowest_median_ms(per_rank: Sequence[Sequence[Mapping[str, float]]]) -> dict[str, float]:
    """Each phase's milliseconds as walltime_ms is reduced (measure/stats.py): per timed repeat the
    slowest rank's, then the median over repeats. `per_rank[r][i]`: rank r's seconds per pass in
    repeat i. A phase some rank or repeat did not run has no figure."""
    records = [record for rank in per_rank for record in rank]
    if not records:
        return {}
    names = set.intersection(*(set(record) for record in records))
    return {
        name: statistics.median(max(r[name] for r in repeat) * 1e3 for repeat in zip(*per_rank, strict=True))
        for name in sorted(names)
    }
