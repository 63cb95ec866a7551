"""A complex input through the real entry point: `-m data.path=a.json,a.yaml,a.npz` sweeps over the
inputs (one job each, merged), every row records the input's name, chains and real sizes, the three
formats give one checksum, and 1d cp=2 and 2d 2x2 runs of fold_small agree with the cp=1 row.
Cheap on purpose: the fold model's test sizes (tests/support/tiny_fold.py), one trunk pass, one sampling
step, one warm-up and one timed step, no probe, no FLOP count (not checked here; a fold step on fake
tensors at each input), the smaller example."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import TIMING, cpbench, ok, results
from support.tiny_fold import SIZES

from cpbench.inputs.convert import main as convert

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "inputs"
RUN = ["workload=fold_small", *SIZES, "workload.n_cycles=1", "workload.sampling.steps=1", *TIMING,
       "timing.repeats=1", "timing.repeats_max=1", "probe.enabled=false",
       "measure.count_flops=false"]  # fmt: skip
RTOL = 1e-5  # mode=accuracy's float32 tolerance across CP layouts


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """cp=1 over the JSON, the YAML and the npz converted from the JSON, as one Hydra multirun."""
    cwd = tmp_path_factory.mktemp("complex_sweep")
    npz = cwd / "msa_ligand.npz"
    assert convert([str(EXAMPLES / "msa_ligand.json"), str(npz)]) == 0
    paths = [EXAMPLES / "msa_ligand.json", EXAMPLES / "msa_ligand.yaml", npz]
    out = cwd / "out"
    ok(cpbench("-m", *RUN, "topology.cp=1", f"data.path={','.join(map(str, paths))}", f"output_dir={out}",
               cwd=cwd, timeout=600))  # fmt: skip
    return out, results(out)


def test_each_input_is_its_own_job_merged_and_recorded(sweep):
    out, frame = sweep
    assert len(list(out.glob("[0-9]_cp1"))) == 3 and len(frame) == 3, frame.to_dict("records")
    assert set(frame["status"]) == {"ok"} and set(frame["input"]) == {"msa_ligand"}
    sizes = frame[["N_tokens", "N_atoms", "MSA_depth", "chains"]].drop_duplicates().values.tolist()
    assert sizes == [[167, 1059, 32, 3]]
    assert set(frame["input_msa_depth"]) == {32}
    report = (out / "cp_benchmark.md").read_text()
    assert "| input | chains | N_tokens |" in report and "| msa_ligand | 3 | 167 | 1059 | 32 |" in report


def test_json_yaml_and_npz_give_the_same_checksum(sweep):
    _, frame = sweep
    assert frame["checksum"].nunique() == 1, frame[["run", "checksum"]]


LAYOUTS = {"1d-cp2": ["topology.kind=1d", "topology.cp=2"], "2d-2x2": ["topology.kind=2d", "topology.cp=4"]}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_cp_layouts_agree_with_the_cp1_row(sweep, tmp_path, layout):
    reference = sweep[1]["checksum"].iloc[0]
    out = tmp_path / "out"
    ok(cpbench(*RUN, *layout, f"data.path={EXAMPLES / 'msa_ligand.yaml'}", f"output_dir={out}", cwd=tmp_path,
               timeout=600))  # fmt: skip
    row = results(out).iloc[0]
    assert (row["status"], row["N_tokens"], row["N_atoms"], row["MSA_depth"]) == ("ok", 167, 1059, 32)
    assert row["checksum"] == pytest.approx(reference, rel=RTOL)
