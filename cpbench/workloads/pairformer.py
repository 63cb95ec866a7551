"""Built-in workload: the AlphaFold3 Pairformer stack with 1d or 2d context parallelism.

s and z come from the synthesized fold inputs (`cpbench.inputs.synthesize`) through a small input
embedder in the spirit of AF3's (Algorithms 1-3: residue type, profile and deletion mean per
token; an outer sum, the relative position encoding and the bond feature per pair), computed on
each rank for its own token rows and pair block. The token mask comes from the padding.
Training: forward, a mean-square loss over valid outputs, and (by the driver) backward, the sum of
replicated parameters' gradients and an AdamW step. Inference: forward; the output is z's block.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn

from cpbench.core import ConfigError, RankContext, Shape
from cpbench.distributed.grid import Grid
from cpbench.inputs import fold_inputs
from cpbench.models.embeddings import TOKEN_FEATURES, RelativePosition, token_features
from cpbench.models.pairformer import PairformerConfig, PairformerStack, PairLayout, kernels
from cpbench.models.pairformer.batch import PairformerBatch
from cpbench.models.pairformer.modules import LinearNoBias
from cpbench.models.precision import MixedPrecision
from cpbench.workloads.base import RealSetting

# AlphaFold3's Pairformer (configs/workload/pairformer.yaml): pairformer_small reduces it.
AF3_PAIRFORMER = dict(c_s=384, c_z=128, n_blocks=48, tri_mul_hidden=128, tri_heads=4, tri_head_width=32,
                      single_heads=16)  # fmt: skip
SIZES_WHY = "a CPU-sized model: at AF3's sizes the compute per byte moved differs, and the bottleneck moves"
# The attention kernels real AF3-class models run: fused, never writing the logits (AF3's Pallas and
# Tokamax kernels, Boltz's cuEquivariance and SDPA); sdpa is torch's own (models/pairformer/kernels.py).
FUSED_KERNELS = RealSetting(
    {"kernels": "sdpa"}, "attention kernels",
    "real models run fused attention that never writes the logits; the reference writes them (N^3 H / P "
    "per triangle attention), so its memory and time describe no real model",
)  # fmt: skip
# Rows per chunk that make every chunk loop one chunk of all its rows (chunking.row_slices).
ONE_CHUNK = 2**62


class InputEmbedder(nn.Module):
    """s_i from token i's features; z_ij = outer sum of token projections + relative position."""

    def __init__(self, c_s: int, c_z: int):
        super().__init__()
        self.single = LinearNoBias(TOKEN_FEATURES, c_s)
        self.left, self.right = LinearNoBias(TOKEN_FEATURES, c_z), LinearNoBias(TOKEN_FEATURES, c_z)
        self.relpos = RelativePosition(c_z)
        self.bond = LinearNoBias(1, c_z)

    def forward(
        self, rows: dict[str, torch.Tensor], cols: dict[str, torch.Tensor], bonds: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fr, fc = token_features(rows), token_features(cols)
        z = self.left(fr)[:, None] + self.right(fc)[None, :] + self.relpos(rows, cols)
        z = z + self.bond(bonds[..., None].float())
        return self.single(fr), z


class PairformerModel(MixedPrecision, nn.Module):
    def __init__(self, cfg: PairformerConfig, layout: PairLayout):
        super().__init__()
        self.cfg, self.precision = cfg, cfg.dtype
        self.embed = InputEmbedder(cfg.c_s, cfg.c_z)
        self.stack = PairformerStack(cfg)
        self.layout = layout

    def forward(self, batch: PairformerBatch) -> tuple[torch.Tensor, torch.Tensor]:
        s, z = self.embed(batch.rows, batch.cols, batch.bonds)
        return self.stack(s, z, batch.mask, self.layout)


class PairformerWorkload:
    """Sizes default to AlphaFold3's; `dtype` null follows the run's `dtype` key (float32: fp32,
    bfloat16: fp32 weights under bf16 autocast). Ignores MSA depth (the Pairformer has no MSA
    track); atoms are synthesized with the inputs but unused."""

    name = "pairformer"
    real_job = (
        RealSetting(AF3_PAIRFORMER, "model sizes", SIZES_WHY, setting="workload=pairformer (AF3's sizes)"),
        FUSED_KERNELS,
    )
    counts_comm = True  # every collective goes through cpbench.distributed.comm
    takes_inputs = True  # its batch is the input's features (fold_inputs): data.path is read

    def __init__(
        self,
        c_s: int = 384,
        c_z: int = 128,
        n_blocks: int = 48,
        tri_mul_hidden: int = 128,
        tri_heads: int = 4,
        tri_head_width: int = 32,
        single_heads: int = 16,
        transition_factor: int = 4,
        dtype: str | None = None,
        chunk_size: int | None = None,
        kernels: str = "sdpa",
        checkpoint: bool = False,
        compile: str | bool = "off",
        fullgraph: bool = False,
        compile_backend: str = "inductor",
    ):
        self.knobs = dict(
            c_s=c_s, c_z=c_z, n_blocks=n_blocks, tri_mul_hidden=tri_mul_hidden, tri_heads=tri_heads,
            tri_head_width=tri_head_width, single_heads=single_heads, transition_factor=transition_factor,
            chunk_size=chunk_size, kernels=kernels, checkpoint=checkpoint,
            compile="off" if compile is False else compile,  # YAML 1.1 reads a bare `off` as false
            fullgraph=fullgraph, compile_backend=compile_backend,
        )  # fmt: skip
        self.dtype = dtype
        self.cfg = PairformerConfig(**self.knobs, dtype=dtype or "fp32")  # fails early, by knob name

    def peak_form(self, train: bool) -> PairformerWorkload:
        """This workload with its repeated passes cut to those that set its peak, for a memory
        trace: in inference one block (a block frees what it made but its output, so every later one
        repeats the first's peak); in training every block (each keeps its activations for the
        backward)."""
        if train:
            return self
        form = copy.copy(self)
        form.knobs = {**self.knobs, "n_blocks": 1}
        form.cfg = replace(self.cfg, n_blocks=form.knobs["n_blocks"])
        return form

    def flop_loops(self, train: bool) -> tuple[dict[str, int], ...]:
        """The loops of a step whose every pass costs the same FLOPs, with their pass counts, in
        groups whose cost does not depend on another group's counts (measure/flops.py `corners`
        counts them at 1 and 2 passes)."""
        return ({"n_blocks": self.knobs["n_blocks"]},)

    def flop_form(self, passes: dict[str, int]) -> PairformerWorkload:
        """This workload with the `flop_loops` named in `passes` cut to those counts, and every chunk loop
        one chunk: a chunk's FLOPs are linear in its rows (its products are over rows), so one chunk
        of all rows counts what the chunks sum to, in one pass instead of N/chunk."""
        form = copy.copy(self)
        chunks = None if self.knobs["chunk_size"] is None else ONE_CHUNK
        cut = {k: v for k, v in passes.items() if k in self.knobs}
        form.knobs = {**self.knobs, **cut, "chunk_size": chunks}
        form.cfg = replace(self.cfg, n_blocks=form.knobs["n_blocks"], chunk_size=chunks)
        return form

    def _config(self, ctx: RankContext) -> PairformerConfig:
        if self.dtype is not None:
            return self.cfg
        by_run = {torch.float32: "fp32", torch.bfloat16: "bf16"}
        if ctx.dtype not in by_run:
            raise ValueError(
                f"dtype={ctx.dtype}: the {self.name} workload runs float32 or bfloat16 (autocast)"
            )
        return PairformerConfig(**self.knobs, dtype=by_run[ctx.dtype])

    def build_model(self, ctx: RankContext) -> nn.Module:
        torch.manual_seed(ctx.seed)  # identical replicated weights on every rank
        model = self._model(self._config(ctx), PairLayout(Grid.from_context(ctx)))
        return model.to(ctx.device)  # weights stay float32; bf16 is autocast

    def _model(self, cfg: PairformerConfig, layout: PairLayout) -> nn.Module:
        return PairformerModel(cfg, layout)

    def check_device(self, device_type: str) -> None:
        """Refuse kernels its ranks' device or its model cannot run (cueq off CUDA, not installed, or a
        triangle multiplication of a width it does not take), in one line."""
        hidden = self.knobs["tri_mul_hidden"]
        why = kernels.cueq_refusal(device_type, hidden) if self.knobs["kernels"] == "cueq" else None
        if why is not None:
            raise ConfigError(why)

    def columns(self, train: bool) -> dict[str, str]:
        """Recorded in results.csv: the attention kernels, and the package (with its version) that
        runs them; rows of other kernels are another experiment (report/analysis.py)."""
        name = self.knobs["kernels"]
        return {"kernels": name, "kernels_version": kernels.version_of(name)}

    def build_batch(self, shape: Shape, ctx: RankContext) -> PairformerBatch:
        return PairformerBatch.of(fold_inputs(shape, ctx).to(ctx.device))

    def run_step(self, model: PairformerModel, batch: PairformerBatch, train: bool) -> torch.Tensor:
        with torch.set_grad_enabled(train), model.autocast():
            s, z = model(batch)
        if not train:
            return z
        return share_of_loss(s, z, batch, model.layout)


def share_of_loss(
    s: torch.Tensor, z: torch.Tensor, batch: PairformerBatch, layout: PairLayout
) -> torch.Tensor:
    """This rank's share of mean(z^2 over valid pairs) + mean(s^2 over valid tokens): z blocks
    partition the pairs; s rows are replicated over the row group, so each replica counts 1/cols."""
    n = batch.mask.shape[0]
    rows, cols = layout.rows(n), layout.cols(n)
    pair = batch.mask[rows.start : rows.stop, None] * batch.mask[None, cols.start : cols.stop]
    token = batch.mask[rows.start : rows.stop]
    z_part = (z.float().square().mean(-1) * pair).sum() / batch.n_valid**2
    s_part = (s.float().square().mean(-1) * token).sum() / (batch.n_valid * layout.grid.cols)
    return z_part + s_part
