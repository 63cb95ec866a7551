"""Built-in workload: the AlphaFold3 fold model (input embedder with atom attention, recycled MSA
module and Pairformer, diffusion) with 1d or 2d context parallelism; see docs/fold.md.

Inference: the trunk, then `sampling.steps` diffusion steps from noise for a batch of
`diffusion_samples.inference` structures; the output is my atoms' positions in each. Training: the
trunk and one denoising step of `diffusion_samples.training` noised copies of the reference
positions, with AF3's weighted MSE; the driver runs backward, sums replicated gradients and steps
AdamW. A point's `Shape.diffusion_samples` (sweep.diffusion_samples) overrides the count. All knobs
of the pairformer workload apply to the Pairformer stack; `n_blocks` is its depth.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from types import SimpleNamespace

import torch
from torch import nn

from cpbench.core import RankContext, Shape
from cpbench.distributed.grid import Grid
from cpbench.inputs import fold_inputs
from cpbench.models.embeddings import TOKEN_FEATURES
from cpbench.models.fold.atoms import AtomWindows
from cpbench.models.fold.batch import FoldBatch
from cpbench.models.fold.config import FoldConfig
from cpbench.models.fold.diffusion import AtomContext, DiffusionSizes
from cpbench.models.fold.model import FoldModel
from cpbench.models.fold.msa import MSAConfig
from cpbench.models.pairformer import PairformerConfig, PairLayout
from cpbench.models.pairformer.config import require_positive
from cpbench.workloads.base import Limitation, RealSetting
from cpbench.workloads.pairformer import AF3_PAIRFORMER, FUSED_KERNELS, SIZES_WHY, PairformerWorkload

# AlphaFold3's sizes (its paper's supplement; configs/workload/fold.yaml): fold_small reduces them.
AF3_SIZES = dict(
    **AF3_PAIRFORMER, msa_blocks=4, c_m=64, opm_hidden=32, pwa_heads=8, pwa_width=8, c_atom=128,
    c_atom_pair=16, input_atom_blocks=3, atom_blocks=3, atom_heads=4, c_token=768, token_blocks=24,
    token_heads=16, fourier=256,
)  # fmt: skip
# AlphaFold3's training (Abramson et al., Nature 2024, supplementary information, section 5: training
# set-up, recycling, the diffusion batch, crop sizes per stage, the losses).
AF3_TRAINING = (
    RealSetting(
        {"n_cycles": "1 to 4, sampled per step"}, "trunk passes (recycling)",
        "AF3 samples the number of trunk passes per training step, gradients through the last only; a "
        "fixed count measures one of them (the trunk's time grows with it, its memory does not)",
        workflow="training",
    ),
    RealSetting(
        {"n_tokens": [384, 640, 768]}, "crop size (N_tokens)",
        "AF3 trains on crops of 384 tokens, then fine-tunes at 640 and 768: N sets memory and the balance "
        "of compute and communication", section="sweep", workflow="training",
    ),
    RealSetting(
        {"diffusion_samples.training": 48}, "diffusion batch per trunk pass",
        "AF3 denoises 48 noised copies of the structure per trunk pass: the diffusion module's work and "
        "activations grow with it, the trunk's do not", workflow="training",
    ),
    Limitation(
        "loss terms", "the diffusion loss (weighted MSE)",
        "diffusion (MSE, smooth LDDT, bonds), distogram, confidence heads (pLDDT, PAE, PDE, resolved) "
        "on a 20-step mini-rollout",
        "the distogram head is small, but the confidence heads add a Pairformer stack of their own and a "
        "mini-rollout of the sampler: more compute and activation memory per step", workflow="training",
    ),
)  # fmt: skip
# The job a fold benchmark stands for: AlphaFold3's inference as its public code runs it (docs/budget.md
# cites the sources). Each differing key is a row of the what-changed table.
AF3_INFERENCE = (
    RealSetting(
        {"sampling.steps": 200}, "diffusion sampling steps",
        "each denoising step costs the same: measured with few, the sampling time grows in proportion",
        scales=True, workflow="inference",
    ),
    RealSetting(
        {"n_cycles": 11}, "trunk passes (recycling)",
        "AF3 runs num_recycles=10, i.e. 11 trunk passes; each costs the same, so the trunk's time grows "
        "in proportion", scales=True, workflow="inference",
    ),
    RealSetting(AF3_SIZES, "model sizes", SIZES_WHY, setting="workload=fold (AF3's sizes)"),
    FUSED_KERNELS,
    RealSetting(
        {"diffusion_samples.inference": 5}, "diffusion samples per trunk pass",
        "AF3 samples 5 structures per trunk pass, batched: the sampler's work and its activations (with "
        "the reference kernels the token attention's logits above all) grow with them, the trunk's do "
        "not", workflow="inference",
    ),
    *AF3_TRAINING,
)  # fmt: skip


class FoldWorkload(PairformerWorkload):
    """Sizes default to AlphaFold3's (configs/workload/fold.yaml); fold_small is the CPU preset."""

    name = "fold"
    real_job = AF3_INFERENCE

    def __init__(
        self,
        msa_blocks: int = 4,
        c_m: int = 64,
        opm_hidden: int = 32,
        pwa_heads: int = 8,
        pwa_width: int = 8,
        c_atom: int = 128,
        c_atom_pair: int = 16,
        c_token: int = 768,
        input_atom_blocks: int = 3,
        atom_blocks: int = 3,
        atom_heads: int = 4,
        token_blocks: int = 24,
        token_heads: int = 16,
        fourier: int = 256,
        n_cycles: int = 4,
        sampling: Mapping[str, int] | None = None,
        diffusion_samples: Mapping[str, int] | None = None,
        **pairformer,
    ):
        super().__init__(**pairformer)
        # the MSA module's own config calls it n_blocks: named here as the user sets it
        require_positive(SimpleNamespace(msa_blocks=msa_blocks), "msa_blocks")
        self.msa_knobs = dict(c_m=c_m, n_blocks=msa_blocks, opm_hidden=opm_hidden, pwa_heads=pwa_heads,
                              pwa_width=pwa_width)  # fmt: skip
        self.sizes = DiffusionSizes(c_atom=c_atom, c_atom_pair=c_atom_pair, c_token=c_token,
                                    atom_blocks=atom_blocks, atom_heads=atom_heads, token_blocks=token_blocks,
                                    token_heads=token_heads, fourier=fourier)  # fmt: skip
        sampling = {"steps": 200} if sampling is None else sampling
        if not isinstance(sampling, Mapping) or set(sampling) != {"steps"}:
            raise ValueError(f"sampling={sampling}: the sampler takes one setting, `steps`")
        steps = sampling["steps"]
        self.loop = dict(input_atom_blocks=input_atom_blocks, n_cycles=n_cycles, sampling_steps=steps)
        self.diffusion_samples = diffusion_sample_counts(diffusion_samples)
        self.fold = self._fold_config(self.cfg)  # fails early, by knob name

    def peak_form(self, train: bool) -> FoldWorkload:
        """This workload with its loops cut to the passes that set its peak, for a memory trace. In
        inference one recycling pass, one sampling step and one block of each stack (each frees what
        it made but its output, so every later one repeats the first's peak), except the MSA
        module's first and last block (the last leaves out the MSA updates) and the diffusion
        module's first two atom blocks (its encoder and decoder hold the first block's input while
        the blocks run: every block after the first repeats the second's peak, larger by that
        input, which grows with the diffusion samples). Training keeps every
        block (each keeps its activations for the backward) and two recycling passes (one without
        autograd, then the one with it). tests/e2e/test_fold_chunked.py checks that the traced peak is
        the full trace's to the byte."""
        form = copy.copy(super().peak_form(train))
        form.loop = {**self.loop, "n_cycles": min(2, self.loop["n_cycles"])}
        if not train:
            form.loop |= {"n_cycles": 1, "sampling_steps": 1, "input_atom_blocks": 1}
            form.sizes = replace(self.sizes, token_blocks=1, atom_blocks=min(2, self.sizes.atom_blocks))
            # the first MSA block and the last (which leaves out the MSA updates)
            form.msa_knobs = {**self.msa_knobs, "n_blocks": min(2, self.msa_knobs["n_blocks"])}
        form.fold = form._fold_config(form.cfg)
        return form

    def flop_loops(self, train: bool) -> tuple[dict[str, int], ...]:
        """The input embedder's atom blocks; the trunk's passes and the MSA and Pairformer blocks in
        each; the diffusion module's token and atom blocks, and in inference the sampling steps
        around them (a training step takes one denoising step). Each pass of one costs the same
        FLOPs: training's trunk passes but the last run without autograd, and the MSA module's last
        block leaves out the MSA updates, each once whatever the count, which keeps it affine."""
        trunk = {"n_cycles": self.loop["n_cycles"], "msa_blocks": self.msa_knobs["n_blocks"],
                 **super().flop_loops(train)[0]}  # fmt: skip
        sampler = {"token_blocks": self.sizes.token_blocks, "atom_blocks": self.sizes.atom_blocks}
        if not train:
            sampler["sampling_steps"] = self.loop["sampling_steps"]
        return {"input_atom_blocks": self.loop["input_atom_blocks"]}, trunk, sampler

    def flop_form(self, passes: dict[str, int]) -> FoldWorkload:
        form = copy.copy(super().flop_form(passes))
        form.loop = {**self.loop, **{k: v for k, v in passes.items() if k in self.loop}}
        form.msa_knobs = {**self.msa_knobs, "n_blocks": passes.get("msa_blocks", self.msa_knobs["n_blocks"])}
        blocks = {k: passes[k] for k in ("token_blocks", "atom_blocks") if k in passes}
        form.sizes = replace(self.sizes, **blocks)
        form.fold = form._fold_config(form.cfg)
        return form

    def _fold_config(self, pf: PairformerConfig) -> FoldConfig:
        msa = MSAConfig(
            **self.msa_knobs, c_z=pf.c_z, c_s_inputs=pf.c_s + TOKEN_FEATURES,
            tri_mul_hidden=pf.tri_mul_hidden, tri_heads=pf.tri_heads, tri_head_width=pf.tri_head_width,
            transition_factor=pf.transition_factor, chunk_size=pf.chunk_size,
        )  # fmt: skip
        return FoldConfig(pairformer=pf, msa=msa, diffusion=self.sizes, **self.loop)

    def _model(self, cfg: PairformerConfig, layout: PairLayout) -> nn.Module:
        return FoldModel(self._fold_config(cfg), layout)

    def build_batch(self, shape: Shape, ctx: RankContext) -> FoldBatch:
        shard = fold_inputs(shape, ctx).to(ctx.device)
        windows, slots = AtomWindows.of_grid(shard.atom_bounds, Grid.from_context(ctx), shard.atom_block)
        atoms = {name: values[slots].clone() for name, values in shard.atoms.items()}  # mine alone
        return FoldBatch(
            **FoldBatch.token_fields(shard),
            msa=shard.msa,
            atoms=AtomContext(atoms, windows, range(shard.rows.start, shard.rows.stop), ctx.seed),
            samples=shape.diffusion_samples,
        )

    def columns(self, train: bool) -> dict[str, int | str]:
        """Recorded in results.csv: a training step runs one denoising step instead of sampling; the
        kernels as the Pairformer's."""
        steps = {"sampling_steps": 0 if train else self.fold.sampling_steps, "n_cycles": self.fold.n_cycles}
        return {**steps, **super().columns(train)}

    def run_step(self, model: FoldModel, batch: FoldBatch, train: bool) -> torch.Tensor:
        samples = batch.samples or self.diffusion_samples["training" if train else "inference"]
        with torch.set_grad_enabled(train), model.autocast():
            if train:
                return model.loss(batch, samples)
            return model.sample(batch, samples)


def diffusion_sample_counts(counts: Mapping[str, int] | None) -> dict[str, int]:
    """The diffusion samples per trunk pass in each workflow: AF3's (5 in inference, 48 in training)
    where not given."""
    if counts is not None and not isinstance(counts, Mapping):
        raise ValueError(f"diffusion_samples={counts}: the samples are set per workflow, e.g. "
                         f"diffusion_samples.inference={counts} (or .training)")  # fmt: skip
    given = dict(counts) if counts is not None else {}
    if not set(given) <= {"inference", "training"}:
        raise ValueError(f"diffusion_samples={given}: the counts are `inference` and `training`")
    counts = {"inference": 5, "training": 48, **given}
    for workflow, n in counts.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"diffusion_samples.{workflow}={n}: must be an integer >= 1")
    return counts
