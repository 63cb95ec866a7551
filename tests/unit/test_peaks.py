"""The datasheet table against the names the driver really gives (torch.cuda.get_device_name, as
public runs record them): each maps to its own card, and a name the table has no card for maps to
none rather than to a neighbour's figure."""

from __future__ import annotations

import pytest

from cpbench.record import peaks

REAL_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 SXM5 80GB": "H100 SXM",
    "NVIDIA H100 SXM5 80GB HBM3": "H100 SXM",
    "H100 SXM5": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA A100-SXM4-80GB": "A100",
    "NVIDIA A100-SXM4-40GB": "A100",
    "NVIDIA A100 80GB PCIe": "A100",
    "NVIDIA A100-PCIE-40GB": "A100",
    "NVIDIA B200": "B200",
    "NVIDIA GB200": "GB200",
    # A Grace Hopper superchip: its own datasheet's row, not the H200's.
    "NVIDIA GH200 480GB": "GH200",
    "NVIDIA GH200 144G HBM3e": "GH200",
    # A MIG slice is not its card (its figure would be the whole card's).
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb": None,
    "NVIDIA A100-SXM4-40GB MIG 3g.20gb": None,
    "NVIDIA H100 80GB HBM3 MIG 3g.40gb": None,
    "NVIDIA H100": None,  # which H100: SXM, PCIe and NVL differ by a third
    "NVIDIA H800 PCIe": None,
    "NVIDIA L40S": None,
}


@pytest.mark.parametrize("name", sorted(REAL_NAMES))
def test_each_real_name_maps_to_its_own_card(name):
    assert peaks.datasheet_device(name) == REAL_NAMES[name]


def test_every_card_of_the_table_is_reached_by_a_real_name():
    assert {card for card in REAL_NAMES.values() if card} == set(peaks.DENSE_TFLOPS)


def test_the_sxm5_name_gets_the_sxm_figure_not_the_pcie_one():
    """`\\bSXM\\b` missed "SXM5": the name then matched nothing and the MFU went blank."""
    sxm5 = peaks.peak_of("cuda", "NVIDIA H100 SXM5 80GB", "bfloat16", "highest", None)
    assert sxm5.tflops == 989.0 and "H100 SXM" in sxm5.source
    nvl = peaks.peak_of("cuda", "NVIDIA H100 NVL", "bfloat16", "highest", None)
    assert nvl.tflops == 835.5 and "H100 NVL" in nvl.source


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA A100-SXM4-40GB MIG 7g.40gb"])
def test_a_mig_slice_gets_no_peak_and_says_why(name):
    """Its card's figure would overstate it (3g.40gb has 60 of an H100's 132 SMs); its profile's name
    does not give its SMs (two H100 "1g" profiles have 16 and 26): no figure, and the way to one."""
    peak = peaks.peak_of("cuda", name, "bfloat16", "highest", None)
    assert peak.tflops is None and name in peak.source
    assert "MIG slice" in peak.source and "measure.peak_tflops" in peak.source
    assert peaks.peak_of("cuda", name, "bfloat16", "highest", 420.0).tflops == 420.0


def test_gh200_has_its_datasheet_row():
    gh200 = peaks.peak_of("cuda", "NVIDIA GH200 480GB", "bfloat16", "highest", None)
    assert gh200.tflops == 989.0 and "GH200" in gh200.source
    assert peaks.DENSE_TFLOPS["GH200"] == {"fp32": 67.0, "tf32": 494.5, "bf16": 989.0, "fp16": 989.0}


def test_the_blackwell_rows_are_one_tables_per_gpu_figures():
    """NVIDIA's per-GPU table (sparse Tensor Core figures halved): HGX B200 FP32 75, TF32 2.2 PF,
    FP16/BF16 4.5 PF; GB200 FP32 80, TF32 2.5 PF, FP16/BF16 5 PF. Not the 8-GPU total's 1,125."""
    assert peaks.DENSE_TFLOPS["B200"] == {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0}
    assert peaks.DENSE_TFLOPS["GB200"] == {"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0}
    b200 = peaks.peak_of("cuda", "NVIDIA B200", "float32", "high", None)
    assert b200.tflops == 1100.0 and b200.precision == "tf32"
