"""benchmarks/gpu_check.sh as a GPU machine runs it: started from the repository root, cpbench installed
from a wheelhouse beside the machine's own packages, and the GPUs counted as CUDA will number them.
The GPU steps themselves need a GPU; `--cpu-dry-run` runs them on CPU (docs/development.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from support.processes import ok, run_cmd

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

# `nvidia-smi -L` as drivers print it: whole GPUs, and MIG slices indented under their GPU (R470 and
# later give a slice its own MIG-<uuid>; R450 named it MIG-GPU-<uuid>/<gi>/<ci>).
H100 = "GPU {0}: NVIDIA H100 80GB HBM3 (UUID: GPU-{0}a3c41e2-77b1-4c1e-9f0d-2b6e5d4c3a1f)\n"
EIGHT = "".join(H100.format(i) for i in range(8))
MIXED = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 3g.40gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-1e2f3a4b-0000-1111-2222-333344445555)
GPU 2: NVIDIA A100-SXM4-80GB (UUID: GPU-9e2f3a4b-0000-1111-2222-333344445555)
"""
ALL_SLICED = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2)
  MIG 1g.5gb Device 0: (UUID: MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2/7/0)
  MIG 1g.5gb Device 1: (UUID: MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2/8/0)
"""


@pytest.mark.parametrize(
    ("listing", "visible", "expected"),
    [
        (EIGHT, None, "8 0"),
        (EIGHT, "3", "1 3"),  # a site binding one GPU per task
        (EIGHT, "6,2", "2 6"),  # in the order given
        (EIGHT, "1,9,2", "1 1"),  # CUDA stops at the first index that names no device
        (EIGHT, "1gpu,2", "2 1"),  # an index is read as strtoul reads it
        (EIGHT, "0,1,0", "0 -"),  # a repeated index hides every device
        (EIGHT, "", "0 -"),
        (EIGHT, "GPU-5a3c", "1 5"),  # a UUID cut short where it stays unique
        (MIXED, None, "2 1"),  # 5 lines: a GPU in MIG mode and its 2 slices are no whole GPU
        (MIXED, "0", "1 0"),  # a process sees one MIG slice at most
        (MIXED, "MIG-cba663e8,MIG-c6d4f1ef", "1 0"),
        (ALL_SLICED, None, "1 0"),
    ],
)
def test_gpus_are_counted_as_cuda_numbers_them(listing, visible, expected):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | {"PYTHON": sys.executable}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    count = ["bash", str(SCRIPT), "--count-gpus"]
    proc = subprocess.run(count, input=listing, env=env, capture_output=True, text=True, timeout=60)
    assert ok(proc).stdout.strip() == expected


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A Python that holds cpbench's requirements but not cpbench, as a GPU machine's does: a venv that
    reads this one's site-packages through a .pth line. Such a line adds the folder but not the .pth
    files in it, so the editable install's finder, which maps cpbench.configs to configs/ from any
    folder and would hide the shadowing below, is not loaded."""
    home = tmp_path_factory.mktemp("bare")
    venv.create(home, with_pip=False, symlinks=True)
    site = home / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "requirements.pth").write_text(sysconfig.get_paths()["purelib"])
    return home / "bin" / "python"


def test_from_the_repository_root_each_step_starts_the_installed_cpbench(bare_python, tmp_path):
    # cpbench's wheel, built from a copy of the tree (an in-tree build would leave build/ in it); the
    # wheelhouse holds nothing else, the bare Python holding every other requirement.
    tree = tmp_path / "tree"
    for part in ("cpbench", "configs"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, tree / part)
    wheelhouse = tmp_path / "wheelhouse"
    build = ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheelhouse), str(tree)]
    ok(run_cmd([sys.executable, "-m", "pip", *build], tmp_path, 180))

    # The source tree first on sys.path, twice over: the current folder (what `python -m` puts first)
    # and PYTHONPATH. Its cpbench/ has no cpbench.configs, so a step started here would fail in Hydra.
    env = {"PYTHON": str(bare_python), "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    shadowed = run_cmd([str(bare_python), "-c", "import cpbench.configs"], ROOT, 60, env)
    assert shadowed.returncode != 0 and "No module named 'cpbench.configs'" in shadowed.stderr

    check = ["bash", str(SCRIPT), "--wheelhouse", str(wheelhouse), "--check-install"]
    proc = ok(run_cmd(check, ROOT, 180, env))
    assert "installed 1 wheels" in proc.stdout
    work = next(tmp_path.glob("tmp.*"), None)  # the script's work folder, under TMPDIR, is gone
    assert work is None, work
    installed = f"cpbench 0.1.0 from {tmp_path}/tmp."
    assert installed in proc.stdout and "/site/cpbench, with torch " in proc.stdout, proc.stdout
    assert "python -m cpbench starts from" in proc.stdout
