"""Model FLOPs counted on fake tensors (cpbench/measure/flops.py), the device peaks MFU divides by
(cpbench/record/peaks.py) and the readout's efficiency section (cpbench/report/sections/efficiency.py), in
process. The counts through `python -m cpbench` are in tests/e2e/test_flops_runs.py."""

from __future__ import annotations

import functools
import statistics

import pandas as pd
import pytest
import torch
import torch.utils.benchmark as benchmark
from support.flops_expected import axial_mix_flops, builtin, count_in_process
from support.tiny_fold import SIZES, TINY

from cpbench.core import Shape
from cpbench.measure.flops import FlopCount, efficiency
from cpbench.models.pairformer import PairformerConfig, PairLayout
from cpbench.models.pairformer.block import PairformerBlock
from cpbench.record import peaks
from cpbench.record.run_record import RunMetadata
from cpbench.report.sections.efficiency import lines as section_lines
from cpbench.report.sections.efficiency import scaling
from cpbench.workloads.axial_mix import AxialMixWorkload


def pairformer_block_flops(n: int, cfg: PairformerConfig) -> int:
    """The analytic count of one Pairformer block's matmuls, forward, one rank (docs/pairformer.md)."""
    c_z, c_h, c_s, f = cfg.c_z, cfg.tri_mul_hidden, cfg.c_s, cfg.transition_factor
    hd, h_s = cfg.tri_heads * cfg.tri_head_width, cfg.single_heads
    tri_mul = 2 * n**2 * (5 * c_z * c_h + c_z**2) + 2 * n**3 * c_h
    tri_att = 2 * n**2 * c_z * (5 * hd + cfg.tri_heads) + 4 * n**3 * hd
    pair_transition = 6 * f * n**2 * c_z**2
    single_attention = 10 * n * c_s**2 + 2 * n**2 * c_z * h_s + 4 * n**2 * c_s
    single_transition = 6 * f * n * c_s**2
    return 2 * tri_mul + 2 * tri_att + pair_transition + single_attention + single_transition


def test_one_pairformer_block_at_n256_counts_its_matmuls():
    """AF3's sizes at N=256: the counter's total is the analytic count (the target: within 2%)."""
    cfg, n = PairformerConfig(n_blocks=1), 256
    block = PairformerBlock(cfg)
    with FlopCount() as count, torch.no_grad():
        block(torch.randn(n, cfg.c_s), torch.randn(n, n, cfg.c_z), torch.ones(n), PairLayout())
    counted, analytic = count.result().flops, pairformer_block_flops(n, cfg)
    assert analytic == 100_571_021_312  # the figure docs/pairformer.md gives
    assert abs(counted - analytic) / analytic < 0.02
    assert count.result().uncounted == ()


def _count(workload, train: bool, n: int = 32) -> int:
    return count_in_process(workload, Shape(n, 9 * n, 4), cp=1, train=train)


def test_axial_mix_counts_its_linears_and_training_three_times_them():
    """Forward: up and down on every pair, the row and column projections; a training step adds the
    backward's two products per linear (the input's and the weight's gradient)."""
    c, h, blocks, n = 32, 64, 2, 32
    workload = AxialMixWorkload(c, h, blocks)
    forward = blocks * (4 * n * n * c * h + 2 * 2 * n * c * c)
    assert forward == axial_mix_flops(n, "1x1")
    assert _count(workload, train=False) == forward
    assert _count(workload, train=True) == 3 * forward


@functools.cache
def _fold_count(steps: int, cycles: int) -> int:
    """The TINY fold's inference count at `steps` sampling steps and `cycles` trunk passes, counted once
    (TINY's own, 2 and 2, is a point of both series below)."""
    overrides = (f"workload.sampling.steps={steps}", f"workload.n_cycles={cycles}")
    return _count(builtin("fold", *SIZES, *overrides)[0], False)


def test_fold_sampling_steps_and_recycling_count_in_proportion():
    """Every sampling step and every trunk pass is traced whole: one more of either adds the same (the
    fold model at its test sizes, tests/support/tiny_fold.py)."""
    steps = [_fold_count(k, TINY["n_cycles"]) for k in (1, 2, 3)]
    assert steps[2] - steps[1] == steps[1] - steps[0] > 0
    cycles = [_fold_count(TINY["sampling"]["steps"], k) for k in (1, 2, 3)]
    assert cycles[2] - cycles[1] == cycles[1] - cycles[0] > 0


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),  # SXM: 1,979 with sparsity
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
        ("NVIDIA B200", "fp16", 2250.0),
        ("NVIDIA GB200", "bf16", 2500.0),
    ],
)
def test_datasheet_peaks(name, precision, tflops):
    device = peaks.datasheet_device(name)
    assert peaks.DENSE_TFLOPS[device][precision] == tflops


@pytest.mark.parametrize("name", ["NVIDIA H800 PCIe", "NVIDIA L40S", "NVIDIA H100"])
def test_an_unknown_device_gets_no_peak_and_one_line(name):
    """An H800 is not an H100, nor a bare "H100" an SXM: no other device's figure, ever."""
    peak = peaks.peak_of("cuda", name, "bfloat16", "highest", None)
    assert peak.tflops is None and name in peak.source and "measure.peak_tflops" in peak.source
    assert peaks.peak_of("cuda", name, "bfloat16", "highest", 123.0).tflops == 123.0


def test_the_precision_follows_dtype_and_matmul_precision():
    assert peaks.precision("float32", "highest") == "fp32"
    assert peaks.precision("float32", "high") == "tf32"
    assert peaks.precision("bfloat16", "highest") == "bf16"
    h100 = peaks.peak_of("cuda", "NVIDIA H100 80GB HBM3", "float32", "high", None)
    assert h100.tflops == 494.5 and "H100 SXM" in h100.source


def test_efficiency_divides_by_ranks_walltime_and_peak():
    figures = efficiency(flops=6 * 10**12, ranks=2, walltime_ms=1500.0, peak_tflops=4.0)
    assert figures.model_tflop == 6.0
    assert figures.tflops_per_rank == pytest.approx(2.0)
    assert figures.mfu == pytest.approx(0.5)
    assert efficiency(6 * 10**12, 2, 1500.0, None).mfu is None


def test_the_cpu_gemm_rate_agrees_with_torch_utils_benchmark():
    """The measured CPU peak within 10% of torch.utils.benchmark's for the same GEMM on the same thread
    (one, as each of two ranks gets on this machine). The suite's other workers share these cores, so
    the load moves within a second (two medians timed a second apart once differed by 2x; the medians
    of ten alternating samples once by 17 %, in CI): each round times both sides back to back, each
    its fastest of ten products, and the median of the rounds' ratios is compared."""
    n, threads = peaks.CPU_GEMM_N, torch.get_num_threads()
    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    timer = benchmark.Timer("torch.mm(a, b, out=out)", globals=dict(torch=torch, a=a, b=b, out=out),
                            num_threads=1)  # fmt: skip
    torch.set_num_threads(1)
    try:
        ratios = []
        for _ in range(15):
            ours = peaks.measure_gemm(n, torch.float32).tflops
            theirs = 2 * n**3 / min(timer.timeit(1).times[0] for _ in range(10)) / 1e12
            ratios.append(ours / theirs)
    finally:
        torch.set_num_threads(threads)
    assert abs(statistics.median(ratios) - 1) < 0.10, ratios


def _rows(mfu: float | None) -> pd.DataFrame:
    base = dict(workload="w", workflow="inference", dtype="float32", kind="point", status="ok", N_atoms=1,
                MSA_depth=1, topology="1d", comm_ms=None, model_tflop=1.0, flops_uncounted="")  # fmt: skip
    return pd.DataFrame(
        [
            {**base, "cp": 1, "N_tokens": 64, "walltime_ms": 100.0, "tflops_per_rank": 10.0, "mfu": mfu},
            {**base, "cp": 2, "N_tokens": 64, "walltime_ms": 60.0, "comm_ms": 6.0, "tflops_per_rank": 8.3,
             "mfu": mfu},
        ]
    )  # fmt: skip


def efficiency_lines(frame: pd.DataFrame, metas: dict[str, dict]) -> list[str]:
    """The section from run.json entries as a run writes them (read back typed, as the report does)."""
    return section_lines(frame, {name: RunMetadata.from_json(raw) for name, raw in metas.items()})


def test_scaling_is_named_by_whether_ranks_share_the_machine():
    assert scaling(_rows(0.5), shared=True)["scaling"].tolist() == pytest.approx([100 / 60])
    assert scaling(_rows(0.5), shared=False)["scaling"].tolist() == pytest.approx([100 / 120])
    cpu = {"backend": "gloo", "cuda": "none", "peak": {"tflops": 20.0, "source": "measured: a GEMM"}}
    text = "\n".join(efficiency_lines(_rows(0.5), {"run": cpu}))
    assert "speed-up vs cp=1 (shared cores)" in text and "| 1.67 | 10% |" in text and "50.0%" in text
    peak = {"tflops": 989.0, "source": "datasheet"}
    gpus = {"backend": "nccl", "cuda": "12.8", "devices_shared": "no", "peak": peak}
    assert "| 0.83 |" in "\n".join(efficiency_lines(_rows(0.5), {"run": gpus}))


def test_an_unknown_device_leaves_the_mfu_blank_with_one_line():
    unknown = peaks.peak_of("cuda", "NVIDIA L40S", "bfloat16", "highest", None).as_json()
    lines = efficiency_lines(_rows(None), {"run": {"backend": "nccl", "cuda": "12.8", "peak": unknown}})
    said = [line for line in lines if "unknown device" in line]
    assert said == [
        "MFU is blank: unknown device 'NVIDIA L40S': no datasheet peak (set measure.peak_tflops)."
    ]
    table = [line for line in lines if line.startswith("| 1d |")]
    assert table and all(line.split(" | ")[7] == "" for line in table)  # the MFU cell


@torch.library.custom_op("cpbench_test::scaled_mm", mutates_args=())
def _scaled_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 2 * a @ b


@_scaled_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


def test_an_op_outside_aten_is_named_and_not_invented():
    """A custom op's FLOPs are not seen (its kernel is opaque): it counts 0 and is named."""
    with FlopCount() as count:
        a, b = torch.randn(8, 16), torch.randn(16, 4)
        _scaled_mm(a, b)
        torch.mm(a, b)
    assert count.result().flops == 2 * 8 * 16 * 4  # the aten mm alone
    assert count.result().uncounted == ("cpbench_test.scaled_mm",)
    lines = efficiency_lines(_rows(0.5).assign(flops_uncounted="cpbench_test.scaled_mm"), {"run": {}})
    said = "Ops outside aten that the FLOP counter cannot see into (counted as 0): `cpbench_test.scaled_mm`."
    assert said in lines
