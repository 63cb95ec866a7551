"""Inference chunking: how many rows of a pair block an op processes at a time, and a trace mode
that runs only the chunks that set an op's peak.

With chunking on and autograd off, an op updates z in place, one chunk of rows at a time, so no
N x N x (hidden) intermediate and no N^3 attention logits live whole (AlphaFold3 and FastFold
inference do the same). `chunk_size` is the rows per chunk, or `auto`: as many rows as keep the
op's largest per-chunk transient under `auto_elements()`, so the chunk shrinks as N grows.

That bound follows the rank's memory cap (`sized_for`). A fixed one is a chunk sized for an 80 GB
card under any cap: on a small cap one transient then holds most of the cap at one CP size and not
at another, and what fits is decided by the driver, not the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

AUTO = "auto"
AUTO_CEILING = 2**27  # per-chunk transient under `auto`: at most 512 MiB of float32
AUTO_SHARE = 1 / 64  # and at most this share of the rank's cap: small beside what N^2 holds
_peak_only = False
_auto_elements = AUTO_CEILING


def auto_elements(cap_gib: float | None) -> int:
    """The per-chunk transient under `auto`, in elements (counted as float32 whatever the dtype), for
    a rank capped at `cap_gib` GiB (None: no cap, the ceiling)."""
    if cap_gib is None:
        return AUTO_CEILING
    return max(1, min(AUTO_CEILING, int(cap_gib * 2**30 * AUTO_SHARE) // 4))


@contextmanager
def sized_for(cap_gib: float | None) -> Iterator[None]:
    """`auto` chunks bounded for a rank with this memory cap, for the real steps and the fake-tensor
    trace alike (one rule, so that the trace runs the chunks that run: probe/trace.py `TraceSpec`)."""
    global _auto_elements
    before, _auto_elements = _auto_elements, auto_elements(cap_gib)
    try:
        yield
    finally:
        _auto_elements = before


def in_place(chunk_size: int | str | None) -> bool:
    """Whether an op takes its chunked, in-place form: chunking asked for and autograd off."""
    return chunk_size is not None and not torch.is_grad_enabled()


def row_slices(length: int, chunk_size: int | str | None, per_row: int) -> list[slice]:
    """Row slices of `length` rows; `per_row` is the op's largest transient per row (elements), which
    sizes the chunk under `auto`. Under `peak_only`, only the first two slices: every later full
    chunk allocates what the second did while the first's last tensors are still bound."""
    if chunk_size is None:
        return [slice(0, length)]
    rows = max(1, _auto_elements // max(1, per_row)) if chunk_size == AUTO else int(chunk_size)
    slices = [slice(i, min(i + rows, length)) for i in range(0, length, rows)]
    return slices[:2] if _peak_only else slices


@contextmanager
def peak_only() -> Iterator[None]:
    """Run two chunks per chunk loop (for a memory trace on fake tensors, where values do not
    matter): the peak is the same as with every chunk, at a fraction of the ops."""
    global _peak_only
    before, _peak_only = _peak_only, True
    try:
        yield
    finally:
        _peak_only = before


def check_chunk_size(value: object) -> None:
    """Fail by name unless chunk_size is null, `auto` or a positive integer."""
    if value is None or value == AUTO:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"chunk_size={value!r}: must be null or a positive integer (or auto)")
