"""A rank's process groups end where the rank tears them down, not at interpreter exit.

A SLURM task used to end with "terminate called without an active exception" (SIGABRT, about 1 run in
15) after measuring everything. Its core showed a gloo worker thread (`ProcessGroupGloo::runLoop`)
destroying the work of an all-gather while the main thread was in `Py_FinalizeEx`: the work's output
tensors held Python objects, their release took the GIL, and CPython ends a thread that takes the GIL
during finalization with `pthread_exit`, whose unwinding through a noexcept destructor is
`std::terminate`. The worker was alive because its group outlived `destroy_process_group()`: the rank
imports torch._dynamo inside its own call stack (`load_counter`), under `runtime.startup.loaded`, which
froze the garbage of that import with the imports; torch.fx's `wrap` leaves a frame that refers to
itself, and a frame keeps its callers' frames, so the rank's own frame (and its `control` group) lived
as long as the process. A group destroyed while the interpreter is alive joins its workers first.

The second test: at torch 2.6 a cp=2 convergence run froze after its last step 3 times in 13
(CI's floor lane). Rank 1's main thread was freeing a `ProcessGroup` from the frame of `run_rank` as it
returned, holding the GIL (torch before 2.8 binds it so); freeing its gloo backend waited on the backend's
work lock, held by a worker releasing a finished all-reduce's tensor, which waited for the GIL.
`torch_compat.hold_gloo_backends` keeps the backends past their groups; `.ci/floor` runs this file too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# One rank as a SLURM task runs it: the process group, a gloo group of its own (the rank's `control`),
# the FLOP counter loaded inside the rank's call stack (torch._dynamo imported there), a collective on
# the group, then the teardown. Printed: the threads the group started, and gloo's threads left after.
# (The default group is left out: at torch 2.13 importing torch._dynamo while it exists keeps it past
# `destroy_process_group()` from inside torch, whatever cpbench does. The abort came from the group
# of the rank's last collectives, `control`.)
RANK = textwrap.dedent(
    """
    import gc, os, sys, time
    from datetime import timedelta

    import torch.distributed as dist

    assert "torch._dynamo" not in sys.modules  # imported below, inside the rank's frames, as in a task
    from cpbench.measure.flops import load_counter


    def gloo_threads(at_least=0):
        # gloo's threads here; a group starts its own (a loop, two workers) a moment after it is made.
        for _ in range(500):
            tasks = os.listdir("/proc/self/task")
            found = {task for task in tasks if "gloo" in open(f"/proc/self/task/{task}/comm").read()}
            if len(found) >= at_least:
                return found
            time.sleep(0.01)
        raise AssertionError(f"{len(found)} gloo thread(s), not {at_least}")


    def rank():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            before = gloo_threads(at_least=3)
            control = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
            of_control = gloo_threads(at_least=len(before) + 3) - before
            load_counter()
            gathered = [None]
            dist.all_gather_object(gathered, "done", group=control)
            assert gathered == ["done"]
            return of_control
        finally:
            dist.destroy_process_group()


    of_control = rank()
    gc.collect()
    print("control", len(of_control), flush=True)
    print("left", len(of_control & gloo_threads()), flush=True)
    """
)


def test_a_ranks_gloo_groups_and_their_threads_end_at_its_teardown(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", RANK], capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    counts = {name: int(count) for name, count in (line.split() for line in done.stdout.splitlines())}
    assert counts["control"] == 3  # gloo's loop and two workers were there to be ended
    assert counts["left"] == 0, (
        f"{counts['left']} gloo thread(s) of the rank's group would run into interpreter exit"
    )


# A group that outlives rank_runtime's teardown in its caller's frame (as `control` does in run_rank),
# freed while its gloo workers still release all-reduces whose tensors Python already dropped (each such
# release takes the GIL). Queued on the group object itself: the teardown would drain work queued before it.
FREED_LATE = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist

    from cpbench.core import Topology
    from cpbench.runtime.rank import rank_runtime

    with rank_runtime(Topology("1d", 1, (1, 1)), "gloo", 60, torch.float32, 0):
        control = dist.new_group(backend="gloo")
    for _ in range(20_000):
        control.allreduce([torch.ones(10_000)])
    del control
    print("freed", flush=True)
    """
)


def test_a_group_freed_after_the_teardown_with_work_queued_does_not_hang(tmp_path):
    # At torch 2.6 without the backends held this hung five runs in five (and with them passed five in
    # five, 1.9 s each); torch 2.8 up frees a group without the GIL, where it passes either way.
    done = subprocess.run(
        [sys.executable, "-c", FREED_LATE],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["freed"], done.stderr
