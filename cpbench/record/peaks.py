"""The peak an MFU divides by: a device's dense datasheet figure for the run's precision, a measured
GEMM rate on CPU, or `measure.peak_tflops`. An unknown device gets no peak (a blank MFU and one line
saying so), never another device's figure: a name is matched whole, so a GH200 is not an H200, and a
MIG slice is not its card.

Datasheet figures are dense (no 2:4 sparsity): NVIDIA prints the sparse figure with an asterisk, and
the dense one is half of it.

A MIG slice gets no datasheet peak. NVIDIA publishes none, and none follows from the profile's name:
its "g" counts compute slices, not SMs. On an H100 80GB, `nvidia-smi mig -lgip` lists MIG 1g.10gb with
16 SMs and MIG 1g.20gb with 26, both "1g", and MIG 3g.40gb with 60 of the card's 132 (0.45, not
3/7 = 0.43; jbarrow.ai/field_notes/nvidia-mig); on an A100-SXM4-40GB, MIG 7g.40gb has 98 of the card's
108 SMs (NVIDIA developer forum, "Why MIG instances can only sum up to 98 SMs instead of the 108 SMs
available?"; the MIG user guide's "Supported MIG Profiles" gives fractions of the SMs MIG can use, not
of the card's). A slice's share of
the card's figure is its SMs (torch.cuda.get_device_properties(d).multi_processor_count) over the card's:
the user who knows both can set `measure.peak_tflops` to it.
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
    # NVIDIA GH200 Grace Hopper Superchip datasheet (resources.nvidia.com/en-us-grace-cpu/
    # grace-hopper-superchip), its Hopper GPU: FP32 67; TF32 989, BF16 1,979, FP16 1,979 with sparsity.
    "GH200": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.0, "fp16": 989.0},
    # Both Blackwell rows from one table, NVIDIA's Blackwell platform specifications, "Individual
    # Blackwell GPU Specifications" (per GPU; Tensor Core figures with sparsity), as reproduced at
    # zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html and, dense, at
    # verda.com/blog/gb300-nvl72-architecture. HGX B200 column: FP32 75 TFLOPS; TF32 2.2, FP16/BF16 4.5
    # PFLOPS. (The HGX B200 8-GPU totals, TF32 18 PFLOPS, give 1,125 per GPU, and NVIDIA's Blackwell
    # technical brief FP32 80: other sources, not mixed in.)
    "B200": {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0},
    # The same table, GB200 NVL72 column: FP32 80 TFLOPS; TF32 2.5, FP16/BF16 5 PFLOPS.
    "GB200": {"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0},
}
# torch.cuda.get_device_name -> the table's device, matched whole word by whole word: the first match
# wins, so the specific names come before the general ones. The names the driver gives, as recorded
# in public runs: "NVIDIA H100 80GB HBM3" (the SXM card), "NVIDIA H100 SXM5 80GB" (some clouds),
# "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB",
# "NVIDIA A100 80GB PCIe", "NVIDIA B200", "NVIDIA GB200", "NVIDIA GH200 480GB" (a Hopper with its own
# datasheet); a bare "NVIDIA H100" (which card?) matches nothing. CUDA names a MIG slice after its card
# and profile (condor_gpu_discovery lists "NVIDIA A100-SXM4-40GB MIG 3g.20gb" and "... MIG 1g.5gb"):
# `is_mig_slice` finds it first.
_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bGH200\b", "GH200"),
    (r"\bGB200\b", "GB200"),
    (r"\bB200\b", "B200"),
    (r"\bH200 NVL\b", "H200 NVL"),
    (r"\bH200\b", "H200"),
    (r"\bH100 NVL\b", "H100 NVL"),
    (r"\bH100 PCIe\b", "H100 PCIe"),
    (r"\bH100 (SXM\d*|80GB HBM3)\b", "H100 SXM"),
    (r"\bA100\b", "A100"),
)


def is_mig_slice(name: str) -> bool:
    """The device is a MIG slice of a card: its name carries the profile ("... MIG 3g.40gb")."""
    return re.search(r"\bMIG\b", name) is not None


def datasheet_device(name: str) -> str | None:
    """The table's entry for a device name, None when it has none (a MIG slice has none)."""
    if is_mig_slice(name):
        return None
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
    if is_mig_slice(device_name):
        return Peak(
            None, kind, f"MIG slice {device_name!r}: no datasheet peak, NVIDIA publishes none for a slice "
            "(set measure.peak_tflops, e.g. the card's figure x the slice's SMs / the card's SMs)"
        )  # fmt: skip
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
