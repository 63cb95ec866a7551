"""A call run in a fresh interpreter, for what a process that forks ranks must never do itself.

On a machine that sees a GPU, autograd's engine starts its device threads at the first backward: to
size them it asks CUDA's C++ device count (cudaGetDeviceCount, which runs cuInit) and arms a fork handler
(torch/csrc/autograd/engine.cpp: `start_device_threads`, `track_bad_autograd_forks`). A rank forked
after that fails at torch.cuda.set_device ("CUDA error: initialization error"), and one that got past it
would fail at its first backward ("Unable to handle autograd's threading in combination with fork-based
multiprocessing"). PYTORCH_NVML_BASED_CUDA_CHECK covers Python's torch.cuda.is_available() only, and on
CPU the count is 0 and nothing shows. So the launching process and the rank server run no backward and
touch no device; what needs either (a training trace on fake tensors, the calibration's real steps) runs
here: a child started by multiprocessing's `spawn` (a new interpreter, not a fork), which forks no rank
and ends with its call. It costs the child's imports, about 3 s of CPU on this 2-core machine."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")


class FreshProcessDied(RuntimeError):
    """The fresh process ended without an answer (killed, out of memory, a crash in C++)."""


def call_in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` (a module-level function, its arguments picklable) in a fresh interpreter: its
    value, or its exception raised here. Interrupted, it ends the child too."""
    context = multiprocessing.get_context("spawn")
    answer, send = context.Pipe(duplex=False)
    child = context.Process(target=_answer, args=(send, fn, args), name=f"cpbench {fn.__name__}")
    child.start()
    send.close()  # the child holds the only write end: its death reads as EOF here
    try:
        ok, value = answer.recv()
    except EOFError:
        child.join()
        raise FreshProcessDied(
            f"{fn.__module__}.{fn.__name__} ended (exit code {child.exitcode}) before it answered"
        ) from None
    except BaseException:  # Ctrl-C, a signal turned into an exception: the child ends with this call
        child.terminate()
        child.join()
        raise
    finally:
        answer.close()
    child.join()
    if ok:
        return value
    raise value


def _answer(send: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        reply: tuple[bool, Any] = (True, fn(*args))
    except Exception as err:  # noqa: BLE001 - the caller's to judge
        reply = (False, err)
    try:
        send.send(reply)
    except Exception:  # noqa: BLE001 - an answer that cannot be pickled goes back as its text
        send.send((False, RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))
    send.close()
