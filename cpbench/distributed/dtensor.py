"""DTensor recognised without importing its module: `torch.distributed.tensor` costs about 0.7 s of
every process's start-up (each rank, each test run), and a value can only be a DTensor once the model
that made it has imported that module."""

from __future__ import annotations

import sys
from typing import Any


def is_dtensor(value: Any) -> bool:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def is_dtensor_type(kind: type) -> bool:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and issubclass(kind, module.DTensor)
