"""probe.predict: the fake-tensor estimate of each rank's peak, the search it leads and its fallback (its
columns in a real run: tests/e2e/test_predict_runs.py)."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from cpbench.core import ConfigError, Shape, Topology
from cpbench.probe import predict, trace
from cpbench.probe.search import SearchConfig, Trial, bounds, next_trial
from cpbench.probe.trace import TraceSpec
from cpbench.settings.schema import BenchConfig, ProbeConfig, register
from cpbench.settings.validate import validate
from cpbench.sweep import resolve_shape

TOPOLOGIES = [("1d", 1), ("1d", 2), ("2d", 4)]


def _workload(name: str):
    register()
    with initialize_config_module("cpbench.configs", version_base=None):
        cfg = compose("config", [f"workload={name}"])
    return instantiate(cfg.workload), cfg.shape


def _estimate(workload, shape_cfg, kind: str, cp: int, n: int, train: bool = False) -> float:
    """Rank 0's estimate alone (a cheap test; a prediction traces every role of the grid)."""
    topology = Topology.from_config(kind, cp, None)
    shape = resolve_shape(shape_cfg, n_tokens=n)
    return trace.estimate(workload, topology, shape, TraceSpec(train, torch.float32), (0,)).peak_gib


@pytest.mark.parametrize("name", ["axial_mix", "pairformer_small", "fold_small"])
def test_the_estimate_runs_for_each_builtin_workload_and_topology(name):
    workload, shape = _workload(name)
    peaks = {(kind, cp): _estimate(workload, shape, kind, cp, 32) for kind, cp in TOPOLOGIES}
    assert all(p > 0 for p in peaks.values())
    # Sharding the pair tensor shrinks each rank's share.
    assert peaks[("2d", 4)] < peaks[("1d", 1)]
    assert peaks[("1d", 2)] < peaks[("1d", 1)]


def test_training_is_traced_with_its_backward():
    workload, shape = _workload("axial_mix")
    assert _estimate(workload, shape, "1d", 2, 64, train=True) > _estimate(workload, shape, "1d", 2, 64)


def test_the_proposal_is_the_largest_traced_n_within_the_budget():
    workload, shape = _workload("axial_mix")
    topology = Topology.from_config("2d", 4, None)
    spec = TraceSpec(False, torch.float32, chunk_cap_gib=0.01)
    p = predict.predict(workload, topology, lambda n: resolve_shape(shape, n_tokens=n), spec,
                        ProbeConfig(start=32, factor=2.0))  # fmt: skip
    assert p.proposal and p.proposal % topology.tiling.multiple == 0
    assert p.at(p.proposal) <= 0.01 < max(e.peak_gib for e in p.estimates)
    assert p.ranks == (0, 1, 3)


def test_calibration_adds_what_a_real_step_held_beyond_its_trace():
    traces = [trace.Estimate(n, 0.01 * (n / 64) ** 2) for n in (64, 128, 256)]  # peak = 0.01 (N/64)^2
    raw = predict.Prediction(traces, cap_gib=0.1, proposal=192, ranks=(0,))
    calibrated = raw.calibrated(64, 0.03, 32)  # the real step at N=64 held 0.02 GiB more than its trace
    assert calibrated.missed_gib == pytest.approx(0.02) and calibrated.calibrated_at == 64
    assert calibrated.at(128) == pytest.approx(0.06) and calibrated.at(96) == pytest.approx(0.0425)
    # 0.01 (N/64)^2 <= 0.1 - 0.02 up to N = 64 sqrt(8) = 181: 160 on a grid of 32
    assert calibrated.proposal == 160 and raw.proposal == 192 and raw.at(128) == pytest.approx(0.04)
    assert raw.calibrated(64, 0.0, 32).proposal == 192  # a trace that held more than the step: N grows
    assert raw.calibrated(64, 0.5, 32).proposal is None  # nothing fits: the plain probe takes over


class _OneLinear:
    """A bias-free Linear(256, 256) on a batch of 4 rows: weight 256 KiB, batch and output 4 KiB each."""

    def build_model(self, ctx):
        return torch.nn.Linear(256, 256, bias=False)

    def build_batch(self, shape: Shape, ctx):
        return torch.ones(4, 256)

    def run_step(self, model, batch, train):
        return model(batch)


def test_a_weight_read_through_a_view_is_counted_once():
    """A linear reads its weight transposed (a view): the weight's bytes are held once, not again
    as a new storage (with real weights under fake tensors, the view was a fake copy's)."""
    one_rank = Topology("1d", 1, (1, 1))
    peak = trace.trace_peak(_OneLinear(), one_rank, Shape(4, 0, 1), TraceSpec(False, torch.float32), 0)
    assert peak == 256 * 256 * 4 + 2 * 4 * 256 * 4


@torch.library.custom_op("cpbench_test::opaque", mutates_args=())
def _opaque(x: torch.Tensor) -> torch.Tensor:
    return x.clone()  # a custom kernel with no fake implementation


class _CustomKernel:
    name = "custom_kernel"

    def build_model(self, ctx):
        return torch.nn.Linear(4, 4)

    def build_batch(self, shape: Shape, ctx):
        return torch.ones(shape.n_tokens, 4)

    def run_step(self, model, batch, train):
        return _opaque(model(batch))


def test_an_op_without_a_fake_implementation_falls_back_naming_it(capsys):
    from cpbench.app.traces import fake_tensor_estimate

    settings = BenchConfig(workload=None, output_dir="unused")
    settings.memory.budget_gib, settings.probe.enabled, settings.probe.predict = 1.0, True, True
    assert fake_tensor_estimate(settings, _CustomKernel(), Topology.from_config("1d", 2, None), None) is None
    line = capsys.readouterr().err.strip()
    assert "cpbench_test.opaque" in line and line.endswith("the plain probe runs") and "\n" not in line


def test_settings_are_checked():
    settings = BenchConfig(workload=None, output_dir="unused")
    settings.probe.predict = True
    with pytest.raises(ConfigError, match="probe.predict=true"):
        validate(settings)
    settings.probe.enabled = True
    settings.memory.cpu_budget_gib = None
    with pytest.raises(ConfigError, match="needs a per-rank budget"):
        validate(settings)


def _confirm_run(edge: int, predicted: int, points: tuple[int, ...] = ()) -> list[Trial]:
    """The probe's steps, after walltime points at `points` (trials it did not step)."""
    cfg = SearchConfig(ProbeConfig(start=64, granularity=32), multiple=2, cap_gib=1.0, predicted=predicted)
    trials = [Trial(n=n, fits=n <= edge, status="ok" if n <= edge else "oom", point=True) for n in points]
    while (p := next_trial(cfg, trials)) is not None:
        trials.append(Trial(n=p.n, fits=p.n <= edge, status="ok" if p.n <= edge else "oom", guided=p.guided))
    return [t for t in trials if not t.point]


@pytest.mark.parametrize(
    ("edge", "predicted", "points", "steps"),
    [(500, 490, (), 2), (500, 510, (), 2), (500, 510, (64,), 2), (500, 490, (64, 1024), 2),
     (500, 300, (), None), (500, 700, (64,), None)],
)  # fmt: skip
def test_a_predicted_search_confirms_in_two_steps_when_the_prediction_holds(edge, predicted, points, steps):
    trials = _confirm_run(edge, predicted, points)
    best, fail = bounds(trials)
    assert best.n <= edge < fail.n and fail.n - best.n <= 32
    assert trials[0].n == predicted and trials[0].guided
    if steps is not None:  # a walltime point far below (or above) the edge does not end the opening
        assert len(trials) == steps
    else:  # far off: it gallops away from the proposal, then bisects, and still ends within the granularity
        assert len(trials) <= 8
