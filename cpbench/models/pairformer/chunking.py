"""Inference chunking: how many rows of a pair block an op processes at a time, and a trace mode
that runs only the chunks that set an op's peak.

With chunking on and autograd off, an op updates z in place, one chunk of rows at a time, so no
N x N x (hidden) intermediate and no N^3 attention logits live whole (AlphaFold3 and FastFold
inference do the same). `chunk_size` is the rows per chunk, or `auto`: as many rows as keep the
op's largest per-chunk transient under `AUTO_ELEMENTS`, so the chunk shrinks as N grows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

AUTO = "auto"
AUTO_ELEMENTS = 2**27  # per-chunk transient under `auto`: 512 MiB of float32 (the triangle attention logits)
_peak_only = False


def in_place(chunk_size: int | str | None) -> bool:
    """Whether an op takes its chunked, in-place form: chunking asked for and autograd off."""
    return chunk_size is not None and not torch.is_grad_enabled()


def row_slices(length: int, chunk_size: int | str | None, per_row: int) -> list[slice]:
    """Row slices of `length` rows; `per_row` is the op's largest transient per row (elements), which
    sizes the chunk under `auto`. Under `peak_only`, only the first two slices: every later full
    chunk allocates what the second did while the first's last tensors are still bound."""
    if chunk_size is None:
        return [slice(0, length)]
    rows = max(1, AUTO_ELEMENTS // max(1, per_row)) if chunk_size == AUTO else int(chunk_size)
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
