"""What a run leaves: results.csv and cp_benchmark.md under output_dir, nothing else, the same twice."""

from __future__ import annotations

import pytest
from support.processes import FAST, cpbench, ok, results

CONTRACT = ["workload", "workflow", "topology", "cp", "grid", "N_tokens", "N_atoms", "MSA_depth", "dtype",
            "status", "peak_mem_gib", "walltime_ms", "walltime_iqr_ms", "tokens_per_s", "comm_ms", "checksum",
            "kind"]  # fmt: skip


def test_csv_and_markdown_contents_in_the_default_output_dir(tmp_path):
    ok(
        cpbench(
            "topology.kind=2d",
            "topology.cp=2",
            "topology.grid=[1,2]",
            "sweep.n_tokens=[16,32]",
            "sweep.msa_depth=[4,8]",
            "shape.atoms_per_token=3",
            *FAST,
            cwd=tmp_path,
        )
    )
    assert [p.name for p in tmp_path.iterdir()] == ["cpbench_out"]  # the default output_dir, nothing else
    out = tmp_path / "cpbench_out"
    assert {"results.csv", "cp_benchmark.md", "run.json", "logs"} <= {p.name for p in out.iterdir()}
    frame = results(out)
    assert list(frame.columns[: len(CONTRACT)]) == CONTRACT
    assert len(frame) == 4 and set(frame["kind"]) == {"point"}
    assert list(zip(frame["N_tokens"], frame["MSA_depth"], strict=True)) == [
        (16, 4),
        (16, 8),
        (32, 4),
        (32, 8),
    ]
    assert list(frame["N_atoms"]) == [48, 48, 96, 96]
    assert (
        set(frame["grid"]) == {"1x2"}
        and set(frame["topology"]) == {"2d"}
        and set(frame["dtype"]) == {"float32"}
    )
    assert (frame["walltime_iqr_ms"] >= 0).all()
    assert frame["tokens_per_s"].round(3).equals((frame["N_tokens"] / frame["walltime_ms"] * 1e3).round(3))
    md = (out / "cp_benchmark.md").read_text()
    for label in (
        "date",
        "host",
        "device",
        "device count",
        "backend",
        "torch",
        "CUDA",
        "clocks locked",
        "devices shared",
        "config hash",
        "project commit",
    ):
        assert f"| {label} |" in md
    assert "| gloo |" in md and "## Readout" in md and "-bound" in md
    assert md.count("| point | axial_mix |") == 4


def test_same_config_same_checksums_other_seed_others(tmp_path):
    def checksums(name, *extra, fresh=False):
        out = tmp_path / name
        # No FLOP count (a training step on fake tensors, outside the timed steps): nothing here reads it.
        args = ["topology.cp=2", "workflow=training", "sweep.n_tokens=[32]", *FAST,
                "measure.count_flops=false", *extra]  # fmt: skip
        ok(cpbench(*args, f"output_dir={out}", cwd=tmp_path, fresh=fresh))
        return list(results(out)["checksum"])

    # The first as a new interpreter, the others forked as the tests' launches are
    # (tests/support/processes.py): one answer either way.
    first, again, other = checksums("a", fresh=True), checksums("b"), checksums("c", "seed=1")
    assert first == again
    assert all(x != y for x, y in zip(first, other, strict=True))
    # A training row times each phase of its step.
    row = results(tmp_path / "a").iloc[0]
    assert row["workflow"] == "training" and row["status"] == "ok"
    for phase in ("forward_ms", "backward_ms", "optimizer_ms"):
        assert row[phase] > 0
    assert row["walltime_ms"] == pytest.approx(
        row["forward_ms"] + row["backward_ms"] + row["optimizer_ms"], rel=0.5
    )


def test_env_var_sets_the_output_dir_and_a_rerun_resumes_instead_of_measuring_again(tmp_path):
    out = tmp_path / "elsewhere"
    args = ("topology.cp=1", *FAST, "measure.count_flops=false")
    ok(cpbench(*args, "sweep.n_tokens=[16]", cwd=tmp_path, env={"CPBENCH_OUTPUT_DIR": str(out)}))
    assert [p.name for p in tmp_path.iterdir()] == ["elsewhere"]
    assert (out / "results.csv").exists()
    # The same settings again (the folder named by output_dir this time), one point more.
    proc = ok(cpbench(*args, "sweep.n_tokens=[16,32]", f"output_dir={out}", cwd=tmp_path))
    assert "1 point(s) to measure" in proc.stderr
    assert list(results(out)["N_tokens"]) == [16, 32]
