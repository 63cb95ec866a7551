"""torch makes its compile cache folder (`$TMPDIR/torchinductor_<user>`) the first time torch._dynamo is
imported, whether or not anything is compiled; the fake tensors of the FLOP counter and of the
prediction import it. A run leaves nothing behind: a folder that import made and left empty goes
again. A workload that compiles (pairformer's `compile` knob) writes its cache there later, as the real
job does, and keeps it."""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress


def import_dynamo() -> None:
    """torch._dynamo, imported without the empty folder: before the first fake tensor of a process."""
    with _no_empty_compile_cache():
        import torch._dynamo  # noqa: F401


@contextmanager
def _no_empty_compile_cache() -> Iterator[None]:
    """The folder is found by torch's rule without importing torch's own (which imports torch._dynamo);
    torch writes the folder it made to TORCHINDUCTOR_CACHE_DIR, and only that folder, if it is the one
    found, new and empty, is removed."""
    preset = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid: torch picks another, which is left alone
        user = None
    folder = os.path.abspath(preset or os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))
    existed = user is None or os.path.isdir(folder)
    try:
        yield
    finally:
        if not existed and os.environ.get("TORCHINDUCTOR_CACHE_DIR") == folder:
            with suppress(OSError):  # not empty: something was cached there, and stays
                os.rmdir(folder)
