"""torch makes its compile cache folder (`$TMPDIR/torchinductor_<user>`) the first time torch._dynamo is
imported, whether or not anything is compiled; the fake tensors of the FLOP counter and of the
prediction import it. A run leaves nothing behind, so that import makes its folder in a temporary one
of its own, removed after it. What is compiled later (pairformer's `compile` knob) caches where torch
puts it, as the real job does: the import only fixed the folder of torch's experimental
`TORCH_CACHING_PRECOMPILE` cache, which a run does not use."""

from __future__ import annotations

import os
import sys
import tempfile

_FOLDER = "TORCHINDUCTOR_CACHE_DIR"


def import_dynamo() -> None:
    """Before the first fake tensor of a process. A folder the user named is theirs, and used as named.
    A temporary folder per process, not a check of torch's own: ranks import it at the same moment."""
    if "torch._dynamo" in sys.modules or _FOLDER in os.environ:
        import torch._dynamo  # noqa: F401

        return
    with tempfile.TemporaryDirectory(prefix="cpbench_dynamo_") as folder:
        os.environ[_FOLDER] = folder
        try:
            import torch._dynamo  # noqa: F401
        finally:
            del os.environ[_FOLDER]
