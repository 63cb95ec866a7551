"""The peak an MFU divides by: a device's dense datasheet figure for the run's precision, a measured
GEMM rate on CPU, or `measure.peak_tflops`. An unknown device gets no peak (a blank MFU and one line
saying so), never another device's figure: a name is matched whole, so a GH200 is not an H200.

Datasheet figures are dense (no 2:4 sparsity): NVIDIA prints the sparse figure with an asterisk, and
the dense one is half of it.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from cpbench.settings.schema import BenchConfig

# Dense peak TFLOP/s per device and precision (fp32: the CUDA cores; tf32, bf16, fp16: tensor cores).
DENSE_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe, 40 and 80 GB alike): FP32 19.5, TF32 156,
    # BF16 312, FP16 312 (312 / 624 / 624 with sparsity).
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: FP32 67; TF32 989, BF16 1,979, FP16 1,979
    # with sparsity.
    "H100 SXM": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.0, "fp16": 989.0},
    # The same datasheet, H100 PCIe column: FP32 51; TF32 756, BF16 1,513, FP16 1,513 with sparsity.
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
    # The same datasheet, H100 NVL column: FP32 60; TF32 835, BF16 1,671, FP16 1,671 with sparsity.
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: FP32 67; TF32 989, BF16 1,979, FP16 1,979
    # with sparsity (the H100 SXM's compute, more and faster memory).
    "H200": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.0, "fp16": 989.0},
    # The same datasheet, H200 NVL column: FP32 60; TF32 835, BF16 1,671, FP16 1,671 with sparsity.
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    # NVIDIA HGX B200 specifications (8 GPUs): FP32 600 TFLOPS; TF32 18, BF16 36, FP16 36 PFLOPS with
    # sparsity; per GPU, dense.
    "B200": {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0},
    # NVIDIA GB200 NVL72 specifications (72 GPUs): FP32 5,760 TFLOPS; TF32 180, BF16 360, FP16 360
    # PFLOPS with sparsity; per GPU, dense.
    "GB200": {"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0},
}
# torch.cuda.get_device_name -> the table's device, matched whole word by whole word: the first match
# wins, so the specific names come before the general ones. The names the driver gives, as recorded
# in public runs: "NVIDIA H100 80GB HBM3" (the SXM card), "NVIDIA H100 SXM5 80GB" (some clouds),
# "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB",
# "NVIDIA A100 80GB PCIe", "NVIDIA B200", "NVIDIA GB200"; "NVIDIA GH200 480GB" (a Hopper with its
# own datasheet, not in the table) and a bare "NVIDIA H100" (which card?) match nothing.
_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bGB200\b", "GB200"),
    (r"\bB200\b", "B200"),
    (r"\bH200 NVL\b", "H200 NVL"),
    (r"\bH200\b", "H200"),
    (r"\bH100 NVL\b", "H100 NVL"),
    (r"\bH100 PCIe\b", "H100 PCIe"),
    (r"\bH100 (SXM\d*|80GB HBM3)\b", "H100 SXM"),
    (r"\bA100\b", "A100"),
)


def datasheet_device(name: str) -> str | None:
    """The table's entry for a device name, None when it has none."""
    return next((device for pattern, device in _NAMES if re.search(pattern, name)), None)


def precision(dtype: str, matmul_precision: str) -> str:
    """The precision a run's matmuls run at: float32 is TF32 on tensor cores under `high`, bf16 under
    `medium` (torch.set_float32_matmul_precision); bfloat16 and float16 are themselves."""
    if dtype == "bfloat16":
        return "bf16"
    if dtype == "float16":
        return "fp16"
    return {"high": "tf32", "medium": "bf16"}.get(matmul_precision, "fp32")


@dataclass(frozen=True)
class GemmRate:
    """A square GEMM's rate on this rank's threads: the fastest of `repeats` timed products. A peak is
    the best the core does; a slower product is the scheduler lending the core to another process
    (the other ranks, or other jobs on a shared machine), which the median would fold in."""

    n: int
    dtype: str
    threads: int
    repeats: int
    best_s: float

    @property
    def tflops(self) -> float:
        return 2 * self.n**3 / self.best_s / 1e12


def measure_gemm(n: int, dtype: torch.dtype, repeats: int = 10) -> GemmRate:
    """An n x n x n matmul timed with the wall clock after two untimed ones (the BLAS's first call
    allocates and picks its kernel), on the threads torch has (the rank's share of the cores)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=out)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        seconds.append(time.perf_counter() - start)
    return GemmRate(n, str(dtype).removeprefix("torch."), torch.get_num_threads(), repeats, min(seconds))


CPU_GEMM_N = 512  # 0.27 GFLOP a product: milliseconds on one core, long beside the clock's resolution


@dataclass(frozen=True)
class Peak:
    """The peak of one rank's device at the run's precision; `tflops` None when unknown. `source`
    says where it comes from, for the report."""

    tflops: float | None
    precision: str
    source: str
    gemm: GemmRate | None = None

    def as_json(self) -> dict[str, Any]:
        gemm = self.gemm and {**asdict(self.gemm), "tflops": self.gemm.tflops}
        return {"tflops": self.tflops, "precision": self.precision, "source": self.source, "gemm": gemm}


def peak_of(device_type: str, device_name: str, dtype: str, matmul_precision: str,
            override: float | None) -> Peak:  # fmt: skip
    """The run's peak per rank: the override, the datasheet's (CUDA), or a GEMM measured here (CPU)."""
    kind = precision(dtype, matmul_precision)
    if override is not None:
        return Peak(override, kind, "measure.peak_tflops")
    if device_type == "cpu":
        rate = measure_gemm(CPU_GEMM_N, getattr(torch, dtype))
        source = f"measured: a {rate.n}^3 {rate.dtype} GEMM on {rate.threads} thread(s), not a datasheet"
        return Peak(rate.tflops, kind, source, rate)
    entry = datasheet_device(device_name)
    if entry is None:
        return Peak(
            None, kind, f"unknown device {device_name!r}: no datasheet peak (set measure.peak_tflops)"
        )
    return Peak(DENSE_TFLOPS[entry][kind], kind, f"datasheet: NVIDIA {entry}, dense {kind}")


def run_peak(settings: BenchConfig, device: torch.device) -> Peak:
    """This rank's device peak at the run's settings (on CPU a GEMM measured now, before any point)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return peak_of(device.type, name, settings.dtype.value, settings.matmul_precision,
                   settings.measure.peak_tflops)  # fmt: skip
