"""The time model (docs/predict.md): its arithmetic on a hand-computed step, the calibration's fits,
the fake-tensor count against the op timer on real tensors, the fold model's work filed by phase and
matching its FLOP count, the datasheet presets, and the forecast's refusals (the entry points:
tests/e2e/test_forecast_entry_points.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import yaml
from support.flops_expected import builtin
from support.processes import refused

from cpbench.core import ConfigError, Shape, Topology
from cpbench.core.phases import SAMPLING_STEP, TRUNK
from cpbench.measure.flops import FlopCount, count_step
from cpbench.measure.tally import REST, Tally, merged
from cpbench.probe.trace import fake_rank
from cpbench.steptime.calibrate import CommPoint, fit_link, fit_ops, measured_cost, nonnegative_lstsq
from cpbench.steptime.hardware import load_hardware
from cpbench.steptime.model import INTER, INTRA, Hardware, Link, OpCost, rank_seconds, step_seconds
from cpbench.steptime.op_timer import OpTimer, OpTimes
from cpbench.steptime.predicted import phase_scales, topologies

HAND = Hardware(
    "by hand",
    rates={"matmul": 1e12, "memory": 1e11},
    kernel_s=1e-6,
    links={
        INTRA: Link(alpha_s=1e-5, bytes_per_s=1e10, hop_s=2e-6),
        INTER: Link(alpha_s=2e-5, bytes_per_s=1e9, hop_s=5e-6),
    },
    devices_per_node=2,
    dtype="float32",
    ops={"aten.bmm": OpCost(kernel_s=3e-6, per_s=5e11)},
)


def _trunk() -> Tally:
    return Tally(
        runs=Counter({"aten.mm": 10, "aten.bmm": 4, "aten.add": 20}),
        flops=Counter({"aten.mm": 2 * 10**12, "aten.bmm": 10**12}),
        bytes=Counter({"aten.add": 5 * 10**10}),
        calls=Counter({(0, 1): 3, (0, 2): 1}),
        sent=Counter({(0, 1): 3 * 10**9, (0, 2): 10**9}),
    )


def test_the_model_prices_a_hand_computed_step():
    """Ranks 0, 1 on node 0 and 2 on node 1 (2 ranks a node). By hand:
    mm (matmul's class rate and kernel cost): 10 x 1 us + 2e12 / 1e12 = 2.00001 s
    bmm (its own calibrated cost):            4 x 3 us + 1e12 / 5e11 = 2.000012 s
    add (memory's class rate):               20 x 1 us + 5e10 / 1e11 = 0.50002 s
    a collective over ranks 0, 1 (intra):    3 x (10 us + 1 x 2 us) + 3e9 / 1e10 = 0.300036 s
    a collective over ranks 0, 2 (inter):    1 x (20 us + 1 x 5 us) + 1e9 / 1e9 = 1.000025 s
    the rest of the step, one mul:            1 x 1 us + 1e11 / 1e11 = 1.000001 s."""
    rest = Tally(runs=Counter({"aten.mul": 1}), bytes=Counter({"aten.mul": 10**11}))
    step = {(TRUNK, "pairformer.tri_mul_out"): _trunk(), (REST, "other"): rest}
    seconds = rank_seconds(step, HAND, ranks_per_node=2)
    assert seconds.compute[(TRUNK, "pairformer.tri_mul_out")] == pytest.approx(2.00001 + 2.000012 + 0.50002)
    assert seconds.comm[(TRUNK, "pairformer.tri_mul_out")] == pytest.approx(0.300036 + 1.000025)
    assert seconds.total == pytest.approx(4.500042 + 1.300061 + 1.000001)
    assert seconds.comm_total == pytest.approx(1.300061)
    # The real job runs 11 trunk passes where the benchmark ran 4; the rest once.
    assert seconds.job({TRUNK: 11 / 4}) == pytest.approx(11 / 4 * (4.500042 + 1.300061) + 1.000001)
    assert seconds.dominant("compute") == ("pairformer.tri_mul_out", pytest.approx(4.500042))
    # Two ranks a device (a node of 2 devices running 4 ranks): each gets half, for all it does.
    shared = rank_seconds(step, HAND, ranks_per_node=2, shared=2.0)
    assert shared.total == pytest.approx(2 * (4.500042 + 1.000001 + 1.300061))
    assert shared.comm_total == pytest.approx(2 * 1.300061)
    # The step is its slowest rank's.
    lighter = {
        (TRUNK, "pairformer.tri_mul_out"): Tally(runs=Counter({"aten.mm": 1}), flops=Counter({"aten.mm": 1}))
    }
    assert step_seconds({0: lighter, 1: step}, HAND, 2).total == pytest.approx(seconds.total)
    # A collective between nodes with no inter-node figures is refused by name.
    one_node = Hardware("one node", HAND.rates, 0.0, {INTRA: HAND.links[INTRA]}, 2, "float32")
    with pytest.raises(ValueError, match="no inter-node link"):
        rank_seconds(step, one_node, ranks_per_node=2)
    # A calibrated op's measured runs, 1e6 FLOPs in 2 ms and 4e6 in 5 ms, and 1e9 FLOP/s beyond:
    measured = OpCost(0.0, 1e9, ((1e6, 2e-3), (4e6, 5e-3)))
    assert measured.seconds(2, 5e6) == pytest.approx(2 * 3.5e-3)  # 2.5e6 a run: halfway, 3.5 ms
    assert measured.seconds(1, 6e6) == pytest.approx(5e-3 + 2e6 / 1e9)  # beyond: 2e6 more at 1e9
    assert measured.seconds(3, 3e5) == pytest.approx(3 * 2e-3)  # below the smallest: held at 2 ms


def test_the_fits_recover_the_costs_that_made_the_times():
    """Times made from known costs at four sizes: each op's fixed cost and rate, each class's, and a
    link's alpha-beta come back; a cost the points cannot tell from zero stays at zero."""
    truth = {"aten.mm": OpCost(5e-6, 2e10), "aten.add": OpCost(2e-6, 8e9)}
    points = []
    for n in (32, 64, 96, 128):
        times = OpTimes(flop_ops={"aten.mm"})
        for op, runs, work in (("aten.mm", 100, 2.0 * n**3), ("aten.add", 300, 4.0 * n**2 * 64)):
            times.runs[op], times.work[op] = runs, work
            times.seconds[op] = runs * truth[op].kernel_s + work / truth[op].per_s
        points.append(times)
    ops, classes = fit_ops(points)
    for op, cost in truth.items():
        # Each op's measured runs give back each point, and a run larger than any grows at the
        # marginal rate between the two largest: the true rate.
        for p in points:
            assert ops[op].seconds(p.runs[op], p.work[op]) == pytest.approx(p.seconds[op], rel=1e-9)
        runs, work = 100, 3 * points[-1].work[op]
        assert ops[op].per_s == pytest.approx(cost.per_s, rel=1e-6)
        truly = runs * cost.kernel_s + work / cost.per_s
        assert ops[op].seconds(runs, work) == pytest.approx(truly, rel=1e-9)
    # Noise that makes a larger run look quicker is held at the smaller's time.
    noisy = measured_cost([1, 1, 1], [1e6, 2e6, 3e6], [2e-3, 1.5e-3, 4e-3])
    assert noisy.measured == ((1e6, 2e-3), (2e6, 2e-3), (3e6, 4e-3)) and noisy.per_s == pytest.approx(5e8)
    # Scaled to a step twice as long, each op takes twice its seconds; its runs and work stay.
    doubled = points[0].scaled_to(2 * sum(points[0].seconds.values()))
    assert doubled.seconds["aten.mm"] == pytest.approx(2 * points[0].seconds["aten.mm"])
    assert doubled.runs == points[0].runs and doubled.work == points[0].work
    assert classes["matmul"].per_s == pytest.approx(2e10, rel=1e-6)
    assert classes["memory"].per_s == pytest.approx(8e9, rel=1e-6)
    link = fit_link(
        [CommPoint(calls, sent, calls * 1e-4 + sent / 1e9) for calls, sent in ((4, 1e6), (8, 8e6), (2, 5e7))]
    )
    assert (link.alpha_s, link.bytes_per_s) == (pytest.approx(1e-4), pytest.approx(1e9))
    # Unconstrained, x = (3, -0.5); held non-negative, the second column is dropped and the first
    # takes the mean of b.
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    x = nonnegative_lstsq(a, a @ np.array([3.0, -0.5]))
    assert x[1] == 0 and x[0] == pytest.approx(2.0)


def _ops(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Ops of each kind: a matmul, a view, an allocation, a copy, in-place and out-of-place work."""
    y = (x @ w).softmax(-1)
    z = torch.empty_like(y)
    z.copy_(y.t().contiguous().t())
    z.add_(1.0)
    return (z * y).view(-1).sum()


def test_the_count_on_fake_tensors_sees_the_work_the_timer_times():
    """The same ops on fake tensors (the count) and on real ones (the op timer): the same runs,
    FLOPs and bytes, op by op; the timer's seconds are real."""
    with FlopCount(tally=True) as count:
        _ops(torch.randn(64, 32), torch.randn(32, 48))
    counted = merged(count.result().tally)
    timer = OpTimer(torch.device("cpu"))
    with timer:
        _ops(torch.randn(64, 32), torch.randn(32, 48))
    timed = timer.times
    assert dict(timed.runs) == dict(counted.runs)
    assert timed.flop_ops == {"aten.mm"} and counted.flops["aten.mm"] == 2 * 64 * 32 * 48
    assert {op: w for op, w in timed.work.items() if op != "aten.mm"} == dict(counted.bytes)
    assert counted.bytes["aten.empty_like"] == 0 and counted.bytes["aten.t"] == 0  # an allocation, a view
    assert counted.bytes["aten.add_"] == 2 * 64 * 48 * 4  # read and written in place
    assert all(s > 0 for s in timed.seconds.values())


def test_a_fold_step_is_counted_by_phase_with_its_flops_and_collectives():
    """fold_small at cp=2: the trunk's passes and the sampling steps are filed apart from the rest;
    the tally's FLOPs are the FLOP counter's; each rank's collectives span both ranks."""
    workload, _ = builtin("fold_small")
    topology = Topology.from_config("1d", 2, None)
    with fake_rank(topology, 0, torch.float32, 0) as ctx:
        counted = count_step(workload, None, Shape(32, 288, 16, 2), ctx, False, 0, tally=True)
    phases = {phase for phase, _ in counted.tally}
    assert {TRUNK, SAMPLING_STEP, REST} <= phases
    total = merged(counted.tally)
    assert sum(total.flops.values()) == counted.flops
    assert set(total.calls) == {(0, 1)} and total.sent[(0, 1)] > 0
    trunk = merged({k: t for k, t in counted.tally.items() if k[0] == TRUNK})
    assert 0 < sum(trunk.flops.values()) < counted.flops


def test_presets_load_with_their_sources_and_bad_figures_are_refused(tmp_path):
    hw = load_hardware("h100_sxm")
    assert hw.rates["matmul"] == 989.4e12 and hw.devices_per_node == 8 and hw.dtype == "bfloat16"
    assert hw.links[INTRA].bytes_per_s == 450e9 and hw.links[INTER].bytes_per_s == 50e9
    assert {"rates", "links.intra", "links.inter", "memory_gib"} <= set(hw.sources)
    assert load_hardware("h200_sxm").memory_gib == 141
    with pytest.raises(ConfigError, match="neither a file nor a preset.*h100_sxm"):
        load_hardware("b300")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "half", "rates": {"matmul": 1.0}}))
    with pytest.raises(ConfigError, match="bad.yaml is not a machine's figures"):
        load_hardware(str(bad))
    with pytest.raises(ConfigError, match="no file"):
        load_hardware(str(tmp_path / "missing.yaml"))


def test_the_real_job_scales_only_the_phases_it_times_and_the_planning_table_tries_powers_of_two():
    assert phase_scales({"workload.n_cycles": 2.75, "workload.sampling.steps": 50.0}) == {
        TRUNK: 2.75, SAMPLING_STEP: 50.0}  # fmt: skip
    assert phase_scales({"workload.n_blocks": 2.0}) is None  # a loop no phase times apart
    tried = list(topologies("2d", 16))
    assert [(t.kind.value, t.cp) for t in tried] == [("1d", 1), ("2d", 2), ("2d", 4), ("2d", 8), ("2d", 16)]
    assert [t.grid for t in tried if t.cp in (4, 16)] == [(2, 2), (4, 4)]


def test_a_forecast_without_figures_or_with_bad_settings_is_refused(tmp_path):
    out = f"output_dir={tmp_path / 'f'}"
    proc = refused("command=forecast", out, cwd=tmp_path)
    assert proc.returncode == 2 and "forecast.hardware: name a preset" in proc.stderr
    figures = ("command=forecast", "forecast.hardware=h100_sxm", out)
    proc = refused(*figures, f"forecast.against={tmp_path / 'nowhere'}", cwd=tmp_path)
    assert proc.returncode == 2 and "no results.csv there" in proc.stderr
    proc = refused(*figures, f"forecast.pool={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "forecast.pool: the runs a calibration pools" in proc.stderr
    proc = refused("command=calibrate", f"forecast.pool={tmp_path / 'cal*'}", out, cwd=tmp_path)
    assert proc.returncode == 2 and "no results.csv there" in proc.stderr
    proc = refused(*figures, "forecast.plan_max_cp=0", cwd=tmp_path)
    assert proc.returncode == 2 and "forecast.plan_max_cp=0: must be > 0" in proc.stderr
    assert not (tmp_path / "f").exists()  # a refused forecast leaves nothing


def test_times_read_in_full_to_three_figures():
    """A forecast's step of 1,000 s and more in full, never in exponent form; ms below a second."""
    from cpbench.report.cells import duration

    cases = {0.0123: "12.3 ms", 0.9996: "1 s", 24.14: "24.1 s", 999.6: "1,000 s", 8043.2: "8,040 s",
             41912.0: "41,900 s", None: "not estimated"}  # fmt: skip
    assert {seconds: duration(seconds) for seconds in cases} == cases
