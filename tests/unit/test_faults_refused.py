"""Inputs refused in one line with exit 2, through cpbench's main() in this process: a setting out of
range, an unreadable feature file, an output_dir that is a file or cannot be written."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from support.processes import FAST, refused


def _feature_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    """Each kind of unreadable feature file, with what its one line must say."""
    text_npz, text_pt = tmp / "text.npz", tmp / "text.pt"
    text_npz.write_text("not a zip\n")
    text_pt.write_text("not a torch file\n")
    whole = tmp / "whole.npz"
    np.savez_compressed(whole, res_type=np.zeros((64, 33)), msa=np.zeros((8, 64)))
    truncated = tmp / "truncated.npz"
    truncated.write_bytes(whole.read_bytes()[:200])
    corrupt = tmp / "corrupt.npz"  # the archive is whole, the deflate stream of its first member is not
    data = bytearray(whole.read_bytes())
    with zipfile.ZipFile(whole) as archive:
        info = archive.infolist()[0]
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + 10 : start + 40] = bytes(30)
    corrupt.write_bytes(bytes(data))
    return {
        "text-npz": (text_npz, f"data.path={text_npz}: not an .npz archive"),
        "truncated-npz": (truncated, f"data.path={truncated}: not an .npz archive"),
        "corrupt-member": (corrupt, f"data.path={corrupt}: member '{info.filename[:-4]}' cannot be read"),
        "text-pt": (text_pt, f"data.path={text_pt}: not a readable torch file"),
    }


SETTINGS = [
    (["launch.max_restarts=-1"], "launch.max_restarts=-1: must be >= 0"),
    (["memory.cpu_budget_gib=-1"], "memory.cpu_budget_gib=-1.0: must be > 0"),
    (["memory.budget_gib=0"], "memory.budget_gib=0.0: must be > 0"),
    (["fault.kind=explode"], "fault.kind=explode: allowed values are oom, kill, overrun"),
    (["fault.where=nowhere"], "fault.where=nowhere: allowed values are batch, step"),
    (["topology.cp=2", "fault.rank=7"], "fault.rank=7: must be a rank of topology.cp=2 (0 to 1) or null"),
    (["fault.rank=0", "fault.at_n=0"], "fault.at_n=0: must be > 0"),
    # A workload knob out of range names its key (the workload's own check, read before anything runs).
    (
        ["workload=fold_small", "workload.chunk_size=-1"],
        "workload.chunk_size=-1: must be null or a positive integer (or auto)",
    ),
    (
        ["workload=fold_small", "workload.kernels=flash"],
        "workload.kernels='flash': allowed values are reference, sdpa, cueq",
    ),
    (
        ["workload=fold_small", "workload.kernels=cueq"],
        "kernels=cueq runs NVIDIA's CUDA kernels only; this run's ranks are on cpu",
    ),
    (
        ["workload=fold_small", "workload.diffusion_samples=5"],
        "workload.diffusion_samples=5: the samples are set per workflow, "
        "e.g. workload.diffusion_samples.inference=5 (or .training)",
    ),
]


def _bad_input(tmp_path: Path, args: list[str], message: str, out: Path) -> None:
    proc = refused(*args, *FAST, f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"cpbench: error: {message}"), proc.stderr
    assert message in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("overrides,message", SETTINGS, ids=[" ".join(o) for o, _ in SETTINGS])
def test_a_setting_out_of_range_is_one_line_and_exit_2(tmp_path, overrides, message):
    out = tmp_path / "out"
    _bad_input(tmp_path, overrides, message, out)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("kind", ["text-npz", "truncated-npz", "corrupt-member", "text-pt"])
def test_an_unreadable_feature_file_is_one_line_and_exit_2(tmp_path, kind):
    path, message = _feature_files(tmp_path)[kind]
    out = tmp_path / "out"
    _bad_input(tmp_path, [f"data.path={path}", "topology.cp=2"], message, out)
    assert not out.exists() or not any(out.iterdir())


def test_an_output_dir_that_is_a_file_or_cannot_be_written_is_one_line_and_exit_2(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me\n")
    _bad_input(tmp_path, ["topology.cp=2"], f"output_dir={a_file}: is a file; give a folder", a_file)
    assert a_file.read_text() == "keep me\n"
    _bad_input(tmp_path, [], "output_dir=/proc/cpbench: cannot be written", Path("/proc/cpbench"))
