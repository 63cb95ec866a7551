"""Real steps of a run's workload with every op timed (`op_timer.py`), on one rank in this process:
a rank of the run as the benchmark measured it, its threads, memory cap and chunks the run's, so
that each op costs here what it cost there."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from cpbench.core import Shape, Topology
from cpbench.measure.cap import cap_rank, lift_cap
from cpbench.measure.memory import release, set_alloc_conf
from cpbench.measure.step import StepRunner
from cpbench.models.pairformer import chunking
from cpbench.probe.trace import TraceSpec
from cpbench.runtime.rank import rank_runtime, threads_per_rank
from cpbench.runtime.seed import seed_all
from cpbench.settings.schema import BenchConfig, Workflow
from cpbench.steptime.op_timer import OpTimer, OpTimes
from cpbench.workloads.base import Workload

# Steps at each shape: the first pays one-off costs; then TIMED plain steps and TIMED op-timed ones in
# turn. The sum of fold_small's op times over two steps at N=128 ranged over 0.99-1.19 s in six
# timings within an hour, where the runs measured 1.13-1.17 s.
WARMUP, TIMED = 1, 5


def time_ops(settings: BenchConfig, workload: Workload, shapes: Sequence[Shape],
             progress: Callable[[str], None] = lambda line: None) -> list[OpTimes]:  # fmt: skip
    """Each shape's ops timed in steps after `WARMUP` (seconds, FLOPs and bytes per step): each op's
    median over `TIMED` op-timed steps, scaled so that they sum to the median of as many plain steps
    taken in turn with them. The plain steps say how long a step takes, Python and autograd between
    the ops included (5-10 % of fold_small's step at N=64-256); the op-timed ones which op takes
    what share. The rank takes the threads a rank of the run took (a cp=1 baseline takes its CP
    run's)."""
    spec = TraceSpec.of(settings)  # the run's precision, backend and cap, as a trace of it takes them
    threads = threads_per_rank(settings.dist.cpu_threads, settings.topology.cp)
    one = Topology.from_config("1d", 1, None)
    # Before CUDA starts here (a fresh process: app/forecast.py), the allocator settings a rank takes.
    set_alloc_conf(settings.memory.alloc_conf, gpu=spec.autocast_device == "cuda")  # the ranks' device
    timed = []
    with rank_runtime(one, spec.backend, settings.dist.timeout_s, spec.dtype, spec.seed, threads) as ctx:
        # The run's allocator settings (fresh pages cost what they did there), not its limit: a shape
        # a CP rank held may not fit one rank under the cap, and its ops are timed all the same.
        cap_rank(settings.memory, ctx.device)
        lift_cap(ctx.device)
        with chunking.sized_for(spec.chunk_cap_gib):
            for shape in shapes:
                progress(f"timing each op of N={shape.n_tokens}")
                timed.append(_time_shape(settings, workload, shape, ctx))
    return timed


def _time_shape(settings: BenchConfig, workload: Workload, shape: Shape, ctx) -> OpTimes:  # noqa: ANN001
    seed_all(settings.seed)
    model = workload.build_model(ctx)
    train = settings.workflow is Workflow.training
    runner = StepRunner(workload, model, train, ctx, settings.optim.lr, settings.optim.weight_decay)
    batch = workload.build_batch(shape, ctx)
    for _ in range(WARMUP):
        runner(batch)
    plain, steps = [], []
    for _ in range(TIMED):
        plain.append(runner(batch)[1].total)
        with OpTimer(ctx.device) as timer:
            runner(batch)
        steps.append(timer.times)
    times = steps[0]  # the same ops and work each step
    for op in times.seconds:
        times.seconds[op] = statistics.median(step.seconds[op] for step in steps)
    batch = model = runner = None
    release(ctx.device)
    return times.scaled_to(statistics.median(plain))


def at_run_speed(
    timed: dict[Shape, OpTimes], run_steps: dict[Shape, float]
) -> tuple[list[OpTimes], list[float]]:
    """The op-timed steps (by shape, in order) at the run's speed, and the ratios that set it: they
    ran in one minute, the run's steps over many, so one factor, the median over the shapes of the
    run's cp=1 step (`run_steps`, seconds) over the plain step here, scales them all (none: 1)."""
    ratios = [run_steps[shape] / t.step_s for shape, t in timed.items() if shape in run_steps]
    drift = statistics.median(ratios) if ratios else 1.0
    return [t.scaled_to(t.step_s * drift) for t in timed.values()], ratios
