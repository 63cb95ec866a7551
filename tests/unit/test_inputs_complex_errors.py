"""Bad complex inputs: one line naming the file and what is wrong, exit 2, before any rank starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.processes import FAST, refused

from cpbench.inputs import FeatureError, load_features

A3M = Path(__file__).resolve().parents[2] / "examples" / "inputs" / "msa_ligand.a3m"


def _af3(*sequences: dict, **top) -> str:
    return json.dumps({"name": "b", "dialect": "alphafold3", "sequences": list(sequences), **top})


# (file name, its text, what the one line says after "data.path=<file>: ")
BAD = {
    "malformed-json": ("x.json", '{"name": "b", "sequences": [', "not valid JSON (Expecting value: line 1"),
    "malformed-yaml": ("x.yaml", "sequences:\n  - protein:\n      id: A\n     sequence: [GAS\n",
                       "not valid YAML (while parsing a block mapping"),
    "residue-letter": ("x.json", _af3({"protein": {"id": "A", "sequence": "GABS"}}),
                       "sequences[0] (protein A): residue 3 'B' is not a protein letter "
                       "(allowed: ACDEFGHIKLMNPQRSTVWY)"),
    "dna-letter": ("x.yaml", "sequences:\n  - dna:\n      id: D\n      sequence: ACGU\n",
                   "sequences[0] (dna D): residue 4 'U' is not a dna letter (allowed: ACGT)"),
    "smiles": ("x.yaml", "sequences:\n  - ligand:\n      id: L\n      smiles: 'C1CC(('\n",
               "sequences[0] (ligand L): unreadable SMILES 'C1CC(('"),
    "missing-msa": ("x.json", _af3({"protein": {"id": "A", "sequence": "GAS",
                                                "unpairedMsaPath": "absent.a3m"}}),
                    "sequences[0] (protein A): MSA file {dir}/absent.a3m: no such file"),
    "msa-query": ("x.yaml", f"sequences:\n  - protein:\n      id: A\n      sequence: GASTV\n"
                            f"      msa: {A3M}\n",
                  "sequences[0] (protein A): MSA file {a3m}: its first sequence (the query) "
                  "'SDQLEDSEVEAVAKGLEEMY...' is not the chain's 'GASTV'"),
    "msa-row": ("x.json", _af3({"protein": {"id": "A", "sequence": "GAS",
                                            "unpairedMsa": ">q\nGAS\n>h\nGA\n"}}),
                "sequences[0] (protein A): unpairedMsa: row 2 has 2 aligned columns, the query 3"),
    "bond-atom": ("x.json", _af3({"protein": {"id": "A", "sequence": "GCG"}},
                                 {"ligand": {"id": "L", "ccdCodes": ["SO4"]}},
                                 bondedAtomPairs=[[["A", 1, "SG"], ["L", 1, "S"]]]),
                  "bondedAtomPairs[0]: chain A residue 1 (GLY) has no atom 'SG' (atoms: N CA C O)"),
    "bond-chain": ("x.yaml", "sequences:\n  - protein:\n      id: A\n      sequence: GCG\n"
                   "constraints:\n  - bond:\n      atom1: [A, 2, SG]\n      atom2: [Z, 1, C1]\n",
                   "constraints[0] (bond): no chain 'Z' (chains: A)"),
    "ccd-code": ("x.json", _af3({"ligand": {"id": "L", "ccdCodes": ["XYZ"]}}),
                 "sequences[0] (ligand L): CCD code 'XYZ' is not in cpbench's bundled table "
                 "(give the ligand as a SMILES instead)"),
}  # fmt: skip


def _write(tmp_path: Path, kind: str) -> tuple[Path, str]:
    name, text, message = BAD[kind]
    path = tmp_path / name
    path.write_text(text)
    return path, message.format(dir=tmp_path, a3m=A3M)


@pytest.mark.parametrize("kind", BAD)
def test_bad_input_is_named_in_one_line(tmp_path, kind):
    path, message = _write(tmp_path, kind)
    with pytest.raises(FeatureError) as err:
        load_features(str(path))
    assert str(err.value).startswith(f"{path}: {message}") and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["malformed-yaml", "smiles"])
def test_bad_input_stops_the_run_before_any_rank_with_exit_2(tmp_path, kind):
    path, message = _write(tmp_path, kind)
    out = tmp_path / "out"
    proc = refused(f"data.path={path}", "topology.cp=2", *FAST, f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"cpbench: error: data.path={path}: {message}"), proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())


def test_a_smiles_without_rdkit_names_the_extra_in_one_line(monkeypatch):
    """RDKit is an optional extra: a SMILES ligand without it says how to get it."""
    from cpbench.inputs.ligand import LigandError, ligand_from_smiles

    monkeypatch.setitem(sys.modules, "rdkit", None)  # what `import rdkit` meets where it is not installed
    with pytest.raises(LigandError, match=r"^SMILES 'CCO' needs RDKit.*pip install 'cpbench\[ligands\]'$"):
        ligand_from_smiles("CCO", seed=0)
