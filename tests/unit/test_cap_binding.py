"""Issue 63, items 4 and 5, as far as a machine without a GPU can run them: the warm-up's sizes and ring
order, the fit judged on the memory the cap binds on (a GPU's reserved segments), the estimate
calibrated on that figure, the allocator's default on GPU ranks, the per-point allocator counters
(blank on CPU) and the NCCL figure in run.json. The warm-up's collectives themselves run on four gloo
ranks in tests/e2e/test_warmup_ranks.py."""

from __future__ import annotations

import os
import resource
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from cpbench.core import Shape, Topology
from cpbench.distributed.grid import Grid
from cpbench.distributed.warmup import SMALLEST, ladder, message_cap, ring_steps
from cpbench.measure import memory
from cpbench.measure.cap import (
    RESERVED,
    RESIDENT,
    Cap,
    Warmed,
    bound_gib,
    bound_peak_gib,
    cap_rank,
    gpu_cap,
    warm_before_cap,
    warm_buffers_bytes,
)
from cpbench.measure.memory import GIB, Peaks
from cpbench.measure.point import PointSettings, measure_point
from cpbench.measure.step import StepRunner
from cpbench.probe.predict import Prediction
from cpbench.probe.search import Trial
from cpbench.probe.trace import Estimate
from cpbench.rank.probe import _calibrated
from cpbench.record.run_record import MemoryCap, RunMetadata
from cpbench.report.sections.memory_cap import lines as cap_lines
from cpbench.report.sections.run_metadata import run_lines
from cpbench.results.row import COLUMNS
from cpbench.runtime.rank import rank_runtime
from cpbench.settings.schema import MemoryConfig, TimingConfig

# An "80 GB" H100 as mem_get_info gives it after start-up (tests/unit/test_gpu_memory.py's figures), with
# 96 MiB of allocator segments holding 64 MiB of tensors when the cap is set.
TOTAL, HELD = 85_029_158_912, int(0.52 * GIB)
RESERVED_BYTES, ALLOCATED_BYTES = 96 * 2**20, 64 * 2**20


# --- the warm-up's sizes and ring order -----------------------------------------------------------------


def test_the_ladder_climbs_by_four_from_4_kib_to_the_largest_message_itself():
    top = 3 * 2**20 + 5
    assert ladder(top) == [4096, 16384, 65536, 262144, 1048576, top]
    assert ladder(SMALLEST) == [SMALLEST] and ladder(100) == [100] and ladder(0) == []


def test_a_kinds_largest_message_is_what_its_buffers_leave_room_for():
    budget = 10 * 2**20
    assert message_cap("all_gather", 4, budget) == budget // 5  # the input and 4 of it gathered
    assert message_cap("reduce_scatter", 4, budget) == int(budget / 1.25)
    assert message_cap("all_reduce", 8, budget) == budget // 2  # the message and the layer's copy
    assert message_cap("all_to_all", 8, budget) == budget // 3  # received, then concatenated
    assert message_cap("reduce", 8, budget) == budget  # in place


def test_warm_buffers_are_half_of_what_a_point_may_use():
    free = TOTAL - HELD
    assert warm_buffers_bytes(free, None) == free // 2
    assert warm_buffers_bytes(free, 20.0) == 10 * GIB  # a smaller budget bounds a point's messages
    assert warm_buffers_bytes(free, 100.0) == free // 2


@pytest.mark.parametrize("rows, cols", [(3, 3), (1, 4), (4, 1), (2, 2), (2, 3)])
def test_every_ring_send_meets_its_receive_at_the_same_step(rows, cols):
    """Each rank runs its ring steps in order; at step k, what rank a sends to d must be what d
    receives at its own step k from a, or the grouped send and receive wait on each other for ever."""
    table = tuple(tuple(r * cols + c for c in range(cols)) for r in range(rows))
    steps = {
        table[r][c]: ring_steps(Grid(rows=rows, cols=cols, r=r, c=c, ranks=table))
        for r in range(rows)
        for c in range(cols)
    }
    assert len({len(s) for s in steps.values()}) == 1
    for me, mine in steps.items():
        for k, (dst, src) in enumerate(mine):
            assert steps[dst][k][1] == me and steps[src][k][0] == me
    if rows > 2 and cols > 2:  # both rings, each way round: four peers
        assert len(steps[0]) == 4 and {d for d, _ in steps[0]} == {1, 2, 3, 6}


# --- the fit and the calibration on the figure the cap binds on ----------------------------------------


def test_the_figure_is_the_one_the_cap_binds_on():
    assert bound_gib(RESIDENT, 1.5, None) == 1.5
    assert bound_gib(RESERVED, 1.5, 1.8) == 1.8
    with pytest.raises(ValueError, match="reserved"):
        bound_gib(RESERVED, 1.5, None)
    gpu = Cap(20.0, 0.06, 0.52, binds_on=RESERVED, reserved_gib=0.09)
    assert bound_peak_gib(gpu, 1.5, 1.8) == 1.8 and bound_peak_gib(gpu, 1.5, None) is None
    assert bound_peak_gib(Cap(0.5, 0.25), 1.5, None) == 1.5 and bound_peak_gib(None, 1.5, 1.8) == 1.5


def test_a_gpu_point_whose_tensors_fit_but_whose_segments_do_not_does_not_fit():
    """The case of the issue: 19.9 GiB of tensors over the baseline fit a 20 GiB budget, but the
    allocator reserved 20.2 GiB for them, where its limit stops it: judged on what the cap binds on."""
    gib, fraction = gpu_cap(20.0, TOTAL - HELD, TOTAL, RESERVED_BYTES)
    cap = Cap(gib, ALLOCATED_BYTES / GIB, HELD / GIB, binds_on=RESERVED, reserved_gib=RESERVED_BYTES / GIB)
    assert cap.limit_gib * GIB == pytest.approx(fraction * TOTAL)  # the fit's limit is the allocator's own
    tight = Peaks(gib=cap.baseline_gib + 19.9, reserved_gib=cap.reserved_gib + 20.2)
    assert cap.exceeded(tight) == "reserved peak 20.200 GiB over the baseline exceeds 20 GiB"
    assert cap.exceeded(Peaks(gib=cap.baseline_gib + 19.0, reserved_gib=cap.reserved_gib + 19.9)) is None
    cpu = Cap(20.0, 0.25)  # a CPU cap judges the resident figure the rows report
    assert cpu.exceeded(Peaks(gib=0.25 + 19.9)) is None
    assert cpu.exceeded(Peaks(gib=0.25 + 20.1)) == "peak 20.100 GiB over the baseline exceeds 20 GiB"


def _session(cap: Cap | None) -> SimpleNamespace:
    """What `_calibrated` reads of a rank's session: its cap, its broadcast (one rank), its grid."""
    return SimpleNamespace(cap=cap, broadcast=lambda value: value, lead=False,
                           ctx=SimpleNamespace(topology=Topology.from_config("1d", 2, None)))  # fmt: skip


PREDICTION = Prediction(
    [Estimate(64, 1.0), Estimate(128, 4.0), Estimate(256, 16.0)], cap_gib=20.0, proposal=256
)


def test_a_gpu_estimate_is_calibrated_on_the_reserved_peak():
    """Two fits: at N=128 the allocator reserved 5.1 GiB for 4.3 GiB of tensors. The miss the
    estimate adds is the reserved peak over the reserved baseline less the trace: fragmentation in."""
    cap = Cap(20.0, 0.06, 0.52, binds_on=RESERVED, reserved_gib=0.1)
    trials = [Trial(64, True, "ok", peak_gib=1.2), Trial(128, True, "ok", peak_gib=4.3)]
    done = _calibrated(_session(cap), PREDICTION, trials, {64: 1.4, 128: 5.1})
    assert done.calibrated_at == 128 and done.missed_gib == pytest.approx(5.1 - 0.1 - 4.0)
    # The same steps under a CPU cap: the resident figure the trials record, over its baseline.
    cpu = _calibrated(_session(Cap(20.0, 0.25)), PREDICTION, trials, {64: 1.2, 128: 4.3})
    assert cpu.missed_gib == pytest.approx(4.3 - 0.25 - 4.0)
    # A GPU step whose reserved peak was not recorded (a probe step before a restart) calibrates
    # nothing: the largest fit that has it does.
    older = _calibrated(_session(cap), PREDICTION, trials, {64: 1.4})
    assert older.calibrated_at == 64 and older.missed_gib == pytest.approx(1.4 - 0.1 - 1.0)
    assert _calibrated(_session(cap), PREDICTION, trials, {}) is PREDICTION


# --- the allocator's settings on a GPU rank ----------------------------------------------------------------


def test_a_gpu_rank_defaults_to_expandable_segments_and_a_cpu_rank_keeps_the_environment(clean_alloc_env):
    memory.set_alloc_conf(None, gpu=False)
    assert not set(memory.ALLOC_CONF_VARS) & set(os.environ)
    memory.set_alloc_conf(None, gpu=True)
    assert [os.environ[n] for n in memory.ALLOC_CONF_VARS] == ["expandable_segments:True"] * 2
    assert memory.alloc_conf() == "expandable_segments:True"  # what run.json records


@pytest.mark.parametrize("name", memory.ALLOC_CONF_VARS)
def test_the_default_never_replaces_a_users_variable(clean_alloc_env, name):
    clean_alloc_env.setenv(name, "max_split_size_mb:128")
    memory.set_alloc_conf(None, gpu=True)
    assert {n: os.environ.get(n) for n in memory.ALLOC_CONF_VARS} == {
        n: "max_split_size_mb:128" if n == name else None for n in memory.ALLOC_CONF_VARS
    }
    memory.set_alloc_conf("expandable_segments:False", gpu=True)  # memory.alloc_conf is the user's too
    assert memory.alloc_conf() == "expandable_segments:False"


def test_the_default_is_not_set_once_cuda_started(clean_alloc_env):
    """The allocator read its settings already: setting the variable then would only make the record
    lie (and an explicit setting is refused, tests/unit/test_gpu_memory.py)."""
    clean_alloc_env.setattr(torch.cuda, "is_initialized", lambda: True)
    memory.set_alloc_conf(None, gpu=True)
    assert memory.alloc_conf() == "default"


# --- what a CPU rank records ------------------------------------------------------------------------------


class _Ones:
    name = "ones"

    def build_batch(self, shape: Shape, ctx) -> None:  # noqa: ANN001
        return None

    def run_step(self, model: torch.nn.Module, batch: None, train: bool) -> torch.Tensor:
        return torch.ones(2**20)


def test_a_cpu_rank_warms_nothing_and_its_points_leave_the_allocator_columns_blank():
    assert {"alloc_retries", "alloc_ooms"} <= set(COLUMNS)
    with rank_runtime(Topology("1d", 1, (1, 1)), "gloo", 60, torch.float32, 0) as ctx:
        warmed = warm_before_cap(ctx, MemoryConfig(), dist.group.WORLD)
        assert (warmed.nccl_gib, warmed.calls) == (None, 0)  # gloo connected its pairs at group creation
        runner = StepRunner(_Ones(), torch.nn.Identity(), False, ctx, 1e-4, 0.0)
        result = measure_point(runner, Shape(16, 1, 1), ctx, dist.group.WORLD,
                               PointSettings(TimingConfig(1, 1, 1, 1)))  # fmt: skip
    assert result.status == "ok"
    assert (result.alloc_retries, result.alloc_ooms, result.peak_reserved_gib) == (None, None, None)
    assert memory.read_peaks(torch.device("cpu")).alloc_retries is None


def test_a_cpu_cap_binds_on_the_resident_peak_and_records_no_nccl_figure():
    limits = resource.getrlimit(resource.RLIMIT_DATA)  # the cap sets this process's: put back after
    try:
        cap = cap_rank(MemoryConfig(cpu_budget_gib=4.0), torch.device("cpu"), Warmed())
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, limits)
    assert (cap.binds_on, cap.nccl_gib, cap.reserved_gib) == (RESIDENT, None, None)
    assert cap.bound_baseline_gib == cap.baseline_gib and cap.limit_gib == cap.baseline_gib + 4.0


def test_the_nccl_figure_is_recorded_read_back_and_reported():
    meta = RunMetadata(device="NVIDIA H100 80GB HBM3", memory=MemoryCap(78.67, 0.06, 0.52, 0.31))
    raw = meta.to_json()
    assert (raw["held_gib"], raw["nccl_gib"]) == (0.52, 0.31) and RunMetadata.from_json(raw) == meta
    assert "| of it, NCCL's warm-up before the cap GiB (rank 0's device) | 0.31 |" in run_lines(meta)
    assert "nccl_gib" not in RunMetadata(memory=MemoryCap(0.5, 0.27)).to_json()  # CPU: none, not 0
    assert (
        "reserved peak" in cap_lines(meta.memory)[1] and "reserved" not in cap_lines(MemoryCap(0.5, 0.27))[1]
    )
