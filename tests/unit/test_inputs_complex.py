"""Complex inputs (AlphaFold3 JSON, Boltz YAML) as contract features: the shipped examples' sizes
against counts made here from the sources (the CCD table, RDKit, the a3m), equal features from both
formats and from the converted npz, and the tokenization rules on small inputs written here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from rdkit import Chem

from cpbench.core import Shape
from cpbench.inputs import RES_TYPES, input_columns, input_point, load_features
from cpbench.inputs.ccd import TABLE
from cpbench.inputs.contract import deletion_value_of
from cpbench.inputs.convert import main as convert

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "inputs"
NAMES = ("msa_ligand", "protein_dna")
CCD = json.loads(TABLE.read_text())["components"]
ONE_LETTER = {"protein": dict(zip("ARNDCQEGHILKMFPSTWYV", ("ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU",
              "GLY", "HIS", "ILE", "LEU", "LYS", "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL"),
              strict=True)), "rna": {c: c for c in "ACGU"}, "dna": {c: "D" + c for c in "ACGT"}}  # fmt: skip


def independent_count(path: Path) -> tuple[int, int, int, int]:
    """(tokens, atoms, MSA rows, chains) of an AlphaFold3 JSON, counted from its text: one token per
    standard residue, one per heavy atom of a modified residue or ligand (CCD table, RDKit)."""
    doc = json.loads(path.read_text())
    tokens = atoms = chains = 0
    rows = 1
    for item in doc["sequences"]:
        (kind, entry), copies = next(iter(item.items())), 1
        copies = len(entry["id"]) if isinstance(entry["id"], list) else 1
        chains += copies
        if kind == "ligand":
            if "smiles" in entry:
                heavy = Chem.MolFromSmiles(entry["smiles"]).GetNumHeavyAtoms()
            else:
                heavy = sum(len(CCD[code]["atoms"]) for code in entry["ccdCodes"])
            tokens, atoms = tokens + copies * heavy, atoms + copies * heavy
            continue
        mods = {m.get("ptmPosition", m.get("basePosition")): m.get("ptmType", m.get("modificationType"))
                for m in entry.get("modifications", [])}  # fmt: skip
        for i, letter in enumerate(entry["sequence"], start=1):
            n = len(CCD[mods.get(i, ONE_LETTER[kind][letter])]["atoms"])
            tokens, atoms = tokens + copies * (n if i in mods else 1), atoms + copies * n
        if entry.get("unpairedMsaPath"):
            rows = max(rows, (path.parent / entry["unpairedMsaPath"]).read_text().count(">"))
    return tokens, atoms, rows, chains


def test_the_table_holds_the_known_heavy_atom_counts():
    # Heavy atoms of the residues within a chain (no OXT, no OP3): textbook counts.
    known = {"GLY": 4, "ALA": 5, "SER": 6, "CYS": 6, "PRO": 7, "LYS": 9, "ARG": 11, "TRP": 14, "TYR": 12,
             "A": 22, "G": 23, "C": 20, "U": 20, "DA": 21, "DG": 22, "DC": 19, "DT": 20,
             "MSE": 8}  # fmt: skip
    assert {code: len(CCD[code]["atoms"]) for code in known} == known
    assert CCD["ALA"]["atoms"] == ["N", "CA", "C", "O", "CB"] and CCD["SEP"]["elements"].count(15) == 1


@pytest.mark.parametrize("name", NAMES)
def test_example_sizes_match_an_independent_count(name):
    features = load_features(str(EXAMPLES / f"{name}.json"))
    tokens, atoms, rows, chains = independent_count(EXAMPLES / f"{name}.json")
    assert (features.n_tokens, features.n_atoms, features.msa_depth, features.n_chains) == (
        tokens, atoms, rows, chains)  # fmt: skip
    assert features.name == name


@pytest.mark.parametrize("name", NAMES)
def test_json_yaml_and_converted_npz_give_the_same_features(name, tmp_path, capsys):
    from_json = load_features(str(EXAMPLES / f"{name}.json"))
    from_yaml = load_features(str(EXAMPLES / f"{name}.yaml"))
    out = tmp_path / f"{name}.npz"
    assert convert([str(EXAMPLES / f"{name}.yaml"), str(out)]) == 0
    shape = from_json.shape
    assert capsys.readouterr().out.strip() == (
        f"{out}: {name}: N_tokens={shape.n_tokens} N_atoms={shape.n_atoms} S={shape.msa_depth} "
        f"chains={from_json.n_chains}"
    )
    from_npz = load_features(str(out))
    assert from_npz.name == name
    for other in (from_yaml, from_npz):
        assert other.arrays.keys() == from_json.arrays.keys()
        for key, values in from_json.arrays.items():
            np.testing.assert_array_equal(other.arrays[key], values, err_msg=key)


def test_msa_ligand_example_features():
    f = load_features(str(EXAMPLES / "msa_ligand.json")).arrays
    protein = f["mol_type"] == 0
    # Two selenomethionines (the sequence's only M), one token per heavy atom (8), each keeping MET's
    # class and its residue number.
    met = RES_TYPES.index("MET")
    assert protein.sum() == 134 + 2 * 8 and (f["res_type"][protein] == met).sum() == 2 * 8
    for position in (19, 84):
        tokens = np.flatnonzero(protein & (f["residue_index"] == position - 1))
        assert len(tokens) == 8 and (f["res_type"][tokens] == met).all()
        assert f["token_bonds"][np.ix_(tokens, tokens)].sum() == 2 * 7  # MSE's 7 heavy-atom bonds
    se = np.flatnonzero(f["ref_element"] == 34)
    assert len(se) == 2
    ligand = np.flatnonzero(f["mol_type"] == 3)
    assert len(ligand) == 16 + 1 and (f["res_type"][ligand] == RES_TYPES.index("UNK")).all()
    assert f["token_bonds"][np.ix_(ligand, ligand)].sum() == 2 * 17  # biotin: 16 heavy atoms, two rings
    assert f["asym_id"].tolist() == [0] * 150 + [1] * 16 + [2] and f["entity_id"].max() == 2
    # MSA: 32 a3m rows; the deletions are the a3m's lower-case runs.
    a3m = (EXAMPLES / "msa_ligand.a3m").read_text().split(">")[1:]
    sequences = ["".join(block.splitlines()[1:]) for block in a3m]
    inserted = sum(c.islower() for s in sequences for c in s)
    assert f["msa"].shape == (32, 167) and (f["msa"][1:, ligand] == 1).all()  # ligand columns: gaps
    standard = protein & ~np.isin(f["residue_index"], (18, 83))
    counts = np.round(3 * np.tan(f["deletion_value"] * np.pi / 2)).astype(int)
    assert counts[:, standard].sum() + counts[:, protein & ~standard].sum() // 8 == inserted


def write(tmp_path: Path, doc: dict, name: str = "x.json", **files: str) -> str:
    for filename, text in files.items():
        (tmp_path / filename).write_text(text)
    path = tmp_path / name
    path.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    return str(path)


def af3(*sequences: dict, bonds: list | None = None) -> dict:
    doc = {"name": "t", "dialect": "alphafold3", "version": 4, "sequences": list(sequences)}
    return doc | ({"bondedAtomPairs": bonds} if bonds else {})


def test_copies_share_an_entity_and_count_sym_id_and_identical_entries_are_one_entity(tmp_path):
    doc = af3({"protein": {"id": ["A", "B"], "sequence": "GAS"}}, {"rna": {"id": "C", "sequence": "ACGU"}},
              {"protein": {"id": "D", "sequence": "GAS"}})  # fmt: skip
    f = load_features(write(tmp_path, doc)).arrays
    assert f["asym_id"].tolist() == [0] * 3 + [1] * 3 + [2] * 4 + [3] * 3
    assert f["entity_id"].tolist() == [0] * 6 + [1] * 4 + [0] * 3
    assert f["sym_id"].tolist() == [0] * 3 + [1] * 3 + [0] * 4 + [2] * 3
    assert f["residue_index"].tolist() == [0, 1, 2] * 2 + [0, 1, 2, 3] + [0, 1, 2]
    assert f["mol_type"].tolist() == [0] * 6 + [2] * 4 + [0] * 3
    assert len(f["atom_to_token"]) == 3 * (4 + 5 + 6) + (22 + 23 + 20 + 20)
    assert f["ref_space_uid"].max() == 3 * 3 + 4 - 1  # one reference space per residue


def test_a3m_deletions_paired_then_unpaired_rows_and_gap_filling(tmp_path):
    unpaired = ">q\nGAS\n>h1\nGaaA-\n>h2\n-AgS\n"
    paired = ">q\nGAS\n>p1\nG-S\n"
    doc = af3({"protein": {"id": "A", "sequence": "GAS", "unpairedMsa": unpaired, "pairedMsa": paired}},
              {"protein": {"id": "B", "sequence": "CC", "unpairedMsaPath": "b.a3m",
                           "pairedMsa": ""}})  # fmt: skip
    f = load_features(write(tmp_path, doc, **{"b.a3m": ">q\nCC\n>1\nCC\n>2\nC-\n>3\n-C\n"})).arrays
    g, a, s, c, gap = (RES_TYPES.index(x) for x in ("GLY", "ALA", "SER", "CYS", "-"))
    # S = 1 + one paired row + three unpaired rows (B's three; A's two, then gaps).
    assert f["msa"].tolist() == [[g, a, s, c, c], [g, gap, s, gap, gap], [g, a, gap, c, c],
                                 [gap, a, s, c, gap], [gap, gap, gap, gap, c]]  # fmt: skip
    deletions = np.zeros((5, 5), dtype=np.int64)
    deletions[2, 1], deletions[3, 2] = 2, 1
    np.testing.assert_array_equal(f["deletion_value"], deletion_value_of(deletions))


def test_bonds_name_atoms_and_ligand_conformers_follow_the_seed(tmp_path):
    doc = af3({"protein": {"id": "A", "sequence": "GCG"}}, {"ligand": {"id": "L", "smiles": "CCO"}},
              bonds=[[["A", 2, "SG"], ["L", 1, "C1"]]])  # fmt: skip
    path = write(tmp_path, doc)
    f = load_features(path).arrays
    bonds = np.argwhere(f["token_bonds"]).tolist()
    assert sorted(bonds) == [[1, 3], [3, 1], [3, 4], [4, 3], [4, 5], [5, 4]]  # CYS-C1, C1-C2, C2-O1
    names = ["".join(chr(c + 32) for c in row).strip() for row in f["ref_atom_name_chars"][-3:]]
    assert names == ["C1", "C2", "O1"]
    same, other = load_features(path, seed=0).arrays, load_features(path, seed=42).arrays
    np.testing.assert_array_equal(same["ref_pos"], f["ref_pos"])
    assert not np.array_equal(other["ref_pos"][-3:], f["ref_pos"][-3:])
    np.testing.assert_array_equal(other["ref_pos"][:-3], f["ref_pos"][:-3])  # residues: the CCD's


def test_boltz_bond_constraints_and_ccd_list(tmp_path):
    doc = {"version": 1, "sequences": [{"protein": {"id": "A", "sequence": "GCG", "msa": "empty"}},
           {"ligand": {"id": "L", "ccd": "SO4"}}],
           "constraints": [{"bond": {"atom1": ["A", 2, "SG"], "atom2": ["L", 1, "S"]}}]}  # fmt: skip
    f = load_features(write(tmp_path, doc, "x.yaml")).arrays
    assert len(f["res_type"]) == 3 + 5 and f["token_bonds"][1, 3] and f["msa"].shape == (1, 8)


def test_data_msa_depth_caps_the_rows_run_and_the_row_keeps_the_inputs_own():
    path = str(EXAMPLES / "msa_ligand.yaml")
    assert input_point(path, 0, None) == Shape(167, 1059, 32)
    assert input_point(path, 0, 8) == Shape(167, 1059, 8) and input_point(path, 0, 64).msa_depth == 32
    assert input_columns(path, 0) == {"input": "msa_ligand", "chains": 3, "input_msa_depth": 32}
    assert input_columns(None, 0) == {}


def test_a_gzipped_a3m_and_a_yml_suffix_read_as_the_plain_ones(tmp_path):
    import gzip

    text = ">q\nGAS\n>h\nGaA-\n"
    (tmp_path / "m.a3m.gz").write_bytes(gzip.compress(text.encode()))

    def doc(msa: str) -> dict:
        return {"sequences": [{"protein": {"id": "A", "sequence": "GAS", "msa": msa}}]}

    plain = load_features(write(tmp_path, doc("m.a3m"), "x.yaml", **{"m.a3m": text})).arrays
    zipped = load_features(write(tmp_path, doc("m.a3m.gz"), "x.yml")).arrays
    assert plain["msa"].shape == (2, 3) and plain["deletion_value"][1, 1] > 0
    for key, values in plain.items():
        np.testing.assert_array_equal(zipped[key], values, err_msg=key)
