"""Sizes and knobs of the Pairformer stack, validated up front so a bad sweep value fails by name."""

from __future__ import annotations

from dataclasses import dataclass

from cpbench.models.pairformer.chunking import check_chunk_size
from cpbench.models.pairformer.kernels import check_kernels

COMPILE_MODES = ("off", "default", "max-autotune")
DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class PairformerConfig:
    """AlphaFold3 defaults: c_s 384, c_z 128, 4 triangle heads of width 32, 16 single heads, 48 blocks."""

    c_s: int = 384
    c_z: int = 128
    n_blocks: int = 48
    tri_mul_hidden: int = 128  # c of the triangle multiplicative update
    tri_heads: int = 4
    tri_head_width: int = 32
    single_heads: int = 16  # width c_s / single_heads (24 at the defaults)
    transition_factor: int = 4  # n of the SwiGLU transitions
    dtype: str = "fp32"  # fp32, or bf16: fp32 weights under bf16 autocast
    chunk_size: int | str | None = None  # inference: rows per chunk of every pair op, or auto (chunking.py)
    # every pair-biased attention's kernels: reference | sdpa | cueq (kernels.py); the workloads' default
    # is sdpa (configs/workload/pairformer.yaml), the plain model's the reference, as chunk_size's
    kernels: str = "reference"
    checkpoint: bool = False  # training: recompute each block in the backward
    compile: str = "off"  # torch.compile of the communication-free parts: off | default | max-autotune
    fullgraph: bool = False
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        sizes = ("c_s", "c_z", "n_blocks", "tri_mul_hidden", "tri_heads", "tri_head_width", "single_heads")
        require_positive(self, *sizes, "transition_factor")
        check_chunk_size(self.chunk_size)
        check_kernels(self.kernels)
        if self.c_s % self.single_heads:
            raise ValueError(f"single_heads={self.single_heads}: must divide c_s={self.c_s}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: allowed values are {', '.join(DTYPES)}")
        if not isinstance(self.checkpoint, bool):
            raise ValueError(f"checkpoint={self.checkpoint!r}: allowed values are true, false")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile={self.compile!r}: allowed values are {', '.join(COMPILE_MODES)}")
        if not isinstance(self.fullgraph, bool):
            raise ValueError(f"fullgraph={self.fullgraph!r}: allowed values are true, false")
        if self.compile == "max-autotune" and self.compile_backend != "inductor":
            raise ValueError(
                f"compile=max-autotune needs compile_backend=inductor, not {self.compile_backend!r}"
            )


def require_positive(config: object, *names: str, nullable: bool = False) -> None:
    """Fail by name unless each field is a positive integer (a bool is not one; with `nullable`,
    None passes too): the model configs check their sizes with this one rule."""
    for name in names:
        value = getattr(config, name)
        if nullable and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r}: must be {'null or ' if nullable else ''}a positive integer")
