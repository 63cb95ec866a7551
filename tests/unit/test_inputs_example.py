"""The example input in the repository, the command that writes it, and the contract docs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from cpbench.inputs import FEATURES, load_features
from cpbench.inputs.make_example import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "inputs.md").read_text()
EXAMPLE = ROOT / "examples" / "complex_304.npz"


def documented_command() -> list[str]:
    lines = [line.strip() for line in DOCS.splitlines() if "python -m cpbench.inputs.make_example" in line]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_docs_table_is_the_contract():
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", DOCS, re.MULTILINE)}
    for spec in FEATURES:
        assert spec.name in rows, f"docs/inputs.md lacks a row for {spec.name}"
        cells = [cell.strip() for cell in rows[spec.name].strip("|").split("|")]
        assert cells[1].startswith(spec.dims_label()), spec.name
        assert cells[2:5] == [str(spec.dtype), spec.range_label(), spec.index], spec.name
        assert cells[6].startswith("required" if spec.required else "optional"), spec.name


def test_example_input_is_small_valid_and_reproducible(tmp_path, capsys):
    assert EXAMPLE.stat().st_size < 1 << 20
    features = load_features(str(EXAMPLE))
    assert (features.n_tokens, features.n_atoms, features.msa_depth) == (304, 2736, 32)
    assert set(features.arrays["mol_type"].tolist()) == {0, 2, 3}
    assert features.arrays["sym_id"].max() == 1

    command = documented_command()
    assert command[:3] == ["python", "-m", "cpbench.inputs.make_example"]
    out = command.index("--out") + 1
    assert ROOT / command[out] == EXAMPLE
    command[out] = str(tmp_path / "again.npz")
    assert main(command[3:]) == 0
    assert "N_tokens=304 N_atoms=2736 S=32" in capsys.readouterr().out
    with np.load(EXAMPLE) as committed, np.load(command[out]) as again:
        assert committed.files == again.files
        for name in committed.files:
            old, new = committed[name], again[name]
            assert old.dtype == new.dtype and np.array_equal(old, new), name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chains", "A:protein:10", "--out", "x.pt"], "must end in .npz"),
        (["--chains", "A:peptide:10", "--out", "x.npz"], "not one of"),
    ],
)
def test_command_rejects_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit):
        main(args)
    assert message in capsys.readouterr().err
