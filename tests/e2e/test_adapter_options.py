"""Your own model's settings and what the driver tells it, through `python -m cpbench` (docs/adapters.md):
a `_target_` class gets only the keys given; an adapter module's hooks get `options`, `ctx` and
`features` under both contracts (tests/adapters/told.py); options are recorded in run.json and move
config_hash and the baseline key; bfloat16 runs the step under autocast unless the module owns its
precision; a feature file reaches build_batch (what cannot reach the model is refused in one line:
tests/unit/test_adapter_options_checked.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.processes import BASE, FAST, cpbench, ok, results, run_cmd
from support.run_inputs import EXAMPLE, TOLD

from cpbench.results.row import BASELINE

# Without the FLOP count (the model's step again on fake tensors at each shape): nothing here reads it.
POINT = ["sweep.n_tokens=[16]", *FAST, "measure.count_flops=false"]


def _seen(report: Path, world: int, rank: int, hook: str) -> dict:
    return json.loads((report / f"w{world}_r{rank}_{hook}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """foldcp on its 1x1 mesh in bfloat16 with the module owning its precision; native at cp=2 in
    bfloat16 on a feature file, options from a file and the command line, with its cp=1 baseline; the
    same with one option changed."""
    root = tmp_path_factory.mktemp("options")
    (root / "opts.yaml").write_text("width: 4\ndepth: {a: 1, b: 2}\n")
    native = [*TOLD, "workload.contract=native", "topology.cp=2", "dtype=bfloat16", f"data.path={EXAMPLE}",
              "probe.enabled=false", "workload.options_file=opts.yaml", "baseline=true", *FAST,
              "measure.count_flops=false"]  # fmt: skip
    plans = {
        "foldcp": [*TOLD, "topology.kind=2d", "topology.cp=1", "dtype=bfloat16", "workload.autocast=false",
                   *POINT, "workload.options={width: 8, report_dir: REPORT}"],
        "native": [*native, "workload.options={width: 8, depth: {b: 3}, report_dir: REPORT}"],
        "other": [*native, "workload.options={width: 8, depth: {b: 5}, report_dir: REPORT}"],
    }  # fmt: skip
    for name, args in plans.items():
        report = root / name / "report"
        report.mkdir(parents=True)
        args = [a.replace("REPORT", str(report)) for a in args]
        ok(cpbench(*args, f"output_dir={root / name / 'out'}", cwd=root, timeout=240))
    return root


def test_options_ctx_and_features_reach_every_hook_under_both_contracts(runs):
    foldcp, native = runs / "foldcp" / "report", runs / "native" / "report"
    for hook in ("build_model", "build_batch", "run_step"):
        assert _seen(foldcp, 1, 0, hook)["options"]["width"] == 8
        for rank in (0, 1):  # file first, the command line's keys over it
            assert _seen(native, 2, rank, hook)["options"]["depth"] == {"a": 1, "b": 3}
    assert _seen(foldcp, 1, 0, "build_model")["mesh"] == ["cp0", "cp1"]
    model = _seen(native, 2, 1, "build_model")
    assert (model["rank"], model["dtype"], model["seed"], model["mesh"]) == (1, "torch.bfloat16", 0, ["cp"])
    batch = _seen(native, 2, 0, "build_batch")
    assert (batch["N"], batch["features"]["res_type"], batch["features"]["msa"]) == (304, [304], [32, 304])
    assert _seen(foldcp, 1, 0, "build_batch")["features"] is None  # synthesized inputs: none


def test_bfloat16_runs_the_step_under_autocast_unless_the_module_owns_it(runs):
    step = _seen(runs / "native" / "report", 2, 0, "run_step")
    assert (step["autocast"], step["out_dtype"]) == (True, "torch.bfloat16")
    step = _seen(runs / "foldcp" / "report", 1, 0, "run_step")
    assert (step["autocast"], step["out_dtype"]) == (False, "torch.float32")
    changed = json.loads((runs / "foldcp" / "out" / "run.json").read_text())["what_changed"]
    [row] = [c for c in changed if c["what"] == "precision"]
    assert row["benchmark"] == "the module's own (workload.autocast=false)" and row["limitation"]


def test_options_are_recorded_and_move_config_hash_and_the_baseline_key(runs):
    record = json.loads((runs / "native" / "out" / "run.json").read_text())["workload"]
    assert record["options"] == {
        "width": 8,
        "depth": {"a": 1, "b": 3},
        "report_dir": str(runs / "native" / "report"),
    }
    assert record["options_file"] == "opts.yaml"
    frames = {name: results(runs / name / "out") for name in ("native", "other")}
    for frame in frames.values():
        assert list(frame["status"]) == ["ok", "ok"] and list(frame["N_tokens"]) == [304, 304]
        assert list(frame["source"] == BASELINE) == [True, False] and set(frame["input"]) == {"complex_304"}
    assert set(frames["native"]["config_hash"]).isdisjoint(frames["other"]["config_hash"])
    keys = [{p.name for p in (runs / name / "out" / "baseline").iterdir()} for name in ("native", "other")]
    assert len(keys[0]) == len(keys[1]) == 1 and keys[0] != keys[1]


def test_the_readout_says_where_comm_time_is_blank_and_why(runs):
    report = (runs / "native" / "out" / "cp_benchmark.md").read_text()
    why = "Time in collectives is not known at cp=2: the model's collectives bypass cpbench's ledger"
    assert why in report
    assert results(runs / "native" / "out")["comm_ms"].isna().all()


def test_a_target_class_gets_only_the_keys_given(tmp_path):
    """Without a `workload=` choice, fold_small's keys (c_s, sampling, ...) would fail RowScale's
    constructor; `python -m cpbench` itself, as the README gives the command."""
    out = tmp_path / "out"
    own = [arg for arg in BASE if not arg.startswith("workload=")]
    args = [*own, "workload._target_=adapters.own_class.RowScale", "+workload.width=8", "topology.cp=2",
            "baseline=true", *POINT, f"output_dir={out}"]  # fmt: skip
    ok(run_cmd([sys.executable, "-m", "cpbench", *args], tmp_path, timeout=240))
    frame = results(out)
    assert list(frame["status"]) == ["ok", "ok"] and list(frame["cp"]) == [1, 2]  # with its baseline
    assert set(frame["workload"]) == {"row_scale"} and set(frame["preset"]) == {"RowScale"}
    recorded = json.loads((out / "run.json").read_text())["workload"]
    assert recorded == {"_target_": "adapters.own_class.RowScale", "width": 8}
