"""The datasheet table against the names the driver really gives (torch.cuda.get_device_name, as
public runs record them): each maps to its own card, and a name the table has no card for maps to
none rather than to a neighbour's figure."""

from __future__ import annotations

import pytest

from cpbench.record import peaks

pytestmark = pytest.mark.unit

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
    # A Grace Hopper superchip: its own datasheet, not an H200's nor an H100's figure.
    "NVIDIA GH200 480GB": None,
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
