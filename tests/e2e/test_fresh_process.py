"""A call in a fresh interpreter (runtime/fresh_process.py): its value and its exception come back as
they would in this process, and a child that dies without answering is said so, not waited on."""

from __future__ import annotations

import os
import signal

import pytest

from cpbench.runtime.fresh_process import FreshProcessDied, call_in_fresh_process


def _pid_and_sum(*numbers: int) -> tuple[int, int]:
    return os.getpid(), sum(numbers)


def _cannot_trace() -> None:
    from cpbench.probe.trace import CannotTrace  # torch, in the one child that needs it

    raise CannotTrace("aten._local_scalar_dense.default", "")


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_the_value_comes_back_from_another_process():
    pid, total = call_in_fresh_process(_pid_and_sum, 1, 2, 3)
    assert total == 6 and pid != os.getpid()


def test_the_exception_comes_back_whole():
    from cpbench.probe.trace import CannotTrace

    with pytest.raises(CannotTrace) as raised:
        call_in_fresh_process(_cannot_trace)
    assert raised.value.op == "aten._local_scalar_dense.default"
    assert "a tensor's value read in Python" in str(raised.value)


def test_a_child_that_dies_is_said_so():
    with pytest.raises(FreshProcessDied, match=r"_killed ended \(exit code -9\)"):
        call_in_fresh_process(_killed)
