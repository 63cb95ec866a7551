"""The one place where cpbench meets the differences between the torch versions it supports (2.6 up,
as NGC containers ship it) and the private torch names it needs.

- Gather and scatter into one tensor: torch 2.13 adds `all_gather_single` / `reduce_scatter_single` and
  deprecates `all_gather_into_tensor` / `reduce_scatter_tensor`, which older torch has alone. Same
  semantics (output concatenated along dim 0); the newer name is used where it exists.
- Collectives on fake tensors (the FLOP count, the memory prediction): torch 2.6 has no fake kernel for
  the in-place `c10d` ops, later versions do. `SkipCollectives` answers them itself on every version:
  the output argument back and a completed work handle, made with the private
  `torch._C._distributed_c10d._create_work_from_future` (present across the range; torch's own
  `FakeWork` appears only in later versions).
- Counting GPUs without initialising CUDA (a launching process forks its ranks): private
  `torch.cuda._device_count_nvml`, the NVML count `torch.cuda.device_count()` tries first; where torch
  lacks it, -1, "NVML cannot count", and the caller asks CUDA in a process of its own.
- Freeing a process group: before torch 2.8 (pytorch#154976) a `ProcessGroup` is freed holding the GIL,
  and freeing its gloo backend waits for the backend's worker threads, one of which may be releasing a
  finished collective's tensors, which takes the GIL: the rank hangs for good. `hold_gloo_backends`
  keeps each gloo backend alive past its group, and frees it later through the backend's own binding,
  which lets the GIL go first. Private: `torch.distributed.distributed_c10d._world.pg_map` (every group
  of the process) and `ProcessGroup._get_backend`; without them nothing is held.
- `torch.AcceleratorError` (torch 2.8 up) carries "CUDA error: out of memory"; before it that error is a
  plain RuntimeError, which the message still identifies.

Private names used elsewhere, the same across the range (the floor lane imports and runs them at 2.6,
the main lane at 2.13), so they need no bridge: fake tensors (`torch._subclasses.fake_tensor`), dispatch
modes (`torch.utils._python_dispatch`, `torch.utils._pytree`), the fake process group's store
(`torch.testing._internal.distributed.fake_pg.FakeStore`), `torch.nn.utils.stateless._reparametrize_module`
(the memory estimate's fake weights) and `torch.distributed.tensor._sharding_prop.ShardingPropagator` (kept
out of the FLOP count). A version that moves one of them fails the floor lane or the main one by name.
"""

from __future__ import annotations

import atexit

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# Exception classes a device's errors arrive as, beyond RuntimeError (empty where torch has none).
ACCELERATOR_ERRORS: tuple[type[BaseException], ...] = tuple(
    cls for cls in (getattr(torch, "AcceleratorError", None),) if cls is not None
)


def _completed_work() -> torch.ScriptObject:
    """A finished collective's work handle, boxed as a c10d op returns it."""
    from torch._C._distributed_c10d import _create_work_from_future

    done = torch.futures.Future()
    done.set_result(None)
    return _create_work_from_future(done).boxed()


class SkipCollectives(TorchDispatchMode):
    """Every `c10d` collective returns its output argument (the first, by the ops' convention) and a
    completed work, without reaching the backend: fake tensors hold no bytes to send."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func.namespace != "c10d":
            return func(*args, **(kwargs or {}))
        returns = [_completed_work() if "Work" in str(r.type) else args[0] for r in func._schema.returns]
        return returns[0] if len(returns) == 1 else tuple(returns) if returns else None


def nvml_gpu_count() -> int:
    """The GPUs NVML sees, CUDA_VISIBLE_DEVICES honoured; -1 where it cannot count them."""
    count = getattr(torch.cuda, "_device_count_nvml", None)
    return count() if count is not None else -1


_HELD_BACKENDS: list = []


def hold_gloo_backends() -> None:
    """Before `destroy_process_group()`: every gloo backend of this process's groups stays referenced
    here, so that whichever frame drops a group last frees no backend; they are freed at the next call
    or at exit, while the interpreter is whole (a rank the forkserver started skips both: `os._exit`).
    Seen at torch 2.6 in 3 of 13 cp=2 convergence runs (none in 30 with it): rank 1 froze on leaving
    `run_rank` (tests/e2e/test_teardown.py)."""
    release_held_backends()
    pg_map = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", {})
    for group in list(pg_map):
        try:
            _HELD_BACKENDS.append(group._get_backend(torch.device("cpu")))
        except (AttributeError, RuntimeError, ValueError):  # no CPU backend (NCCL alone), or no such API
            continue


def release_held_backends() -> None:
    """Free the held backends; each one's binding lets the GIL go while its workers finish."""
    _HELD_BACKENDS.clear()


atexit.register(release_held_backends)
