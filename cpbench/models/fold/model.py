"""The fold model (AlphaFold3 Algorithm 1 without templates and confidence heads): input
embedder, recycled trunk (MSA module, Pairformer), diffusion sampling or one denoising step.

Each rank holds its token rows (s, s_inputs), its pair block (z) and the atoms of its token rows;
see docs/fold.md for what each op communicates.
"""

from __future__ import annotations

import torch
from torch import nn

from cpbench.core.phases import TRUNK, phase
from cpbench.distributed.comm import op_label
from cpbench.models.embeddings import RelativePosition, token_features
from cpbench.models.fold.atoms import AtomEncoder
from cpbench.models.fold.batch import FoldBatch
from cpbench.models.fold.config import FoldConfig
from cpbench.models.fold.diffusion import DiffusionModule
from cpbench.models.fold.msa import MSAModule
from cpbench.models.pairformer import PairformerStack, PairLayout, chunking, kernels
from cpbench.models.pairformer.modules import LinearNoBias
from cpbench.models.precision import MixedPrecision


class FoldModel(MixedPrecision, nn.Module):
    def __init__(self, cfg: FoldConfig, layout: PairLayout):
        super().__init__()
        self.cfg, self.layout, self.precision = cfg, layout, cfg.pairformer.dtype
        c_s, c_z, c_in, d = cfg.pairformer.c_s, cfg.pairformer.c_z, cfg.c_s_inputs, cfg.diffusion
        self.input_encoder = AtomEncoder(d.c_atom, d.c_atom_pair, c_s, cfg.input_atom_blocks, d.atom_heads)
        self.s_init = LinearNoBias(c_in, c_s)
        self.z_left, self.z_right = LinearNoBias(c_in, c_z), LinearNoBias(c_in, c_z)
        self.relpos = RelativePosition(c_z)
        self.bond = LinearNoBias(1, c_z)
        self.recycle_s = nn.Sequential(nn.LayerNorm(c_s), LinearNoBias(c_s, c_s))
        self.recycle_z = nn.Sequential(nn.LayerNorm(c_z), LinearNoBias(c_z, c_z))
        self.msa = MSAModule(cfg.msa)
        self.pairformer = PairformerStack(cfg.pairformer)
        self.diffusion = DiffusionModule(d, c_s, c_z, c_in, cfg.pairformer.chunk_size)
        kernels.use(self, cfg.pairformer.kernels)

    def trunk(self, batch: FoldBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(s_inputs, s, z) after the last recycling pass. With chunking on, a pass without autograd
        updates z in place, chunk by chunk of rows: only z_init and z live whole between ops."""
        layout, n = self.layout, batch.mask.shape[0]
        rows = layout.rows(n)
        with op_label("input.atom_encoder"):
            atoms, windows = batch.atoms.atoms, batch.atoms.windows
            cond = self.input_encoder.condition(atoms, windows, rows)
            a, _ = self.input_encoder(atoms, windows, rows, cond)
        with op_label("input.embedding"):
            s_inputs = torch.cat([a, token_features(batch.rows).to(a.dtype)], dim=-1)
            z_init = self._pair_init(batch, s_inputs)
            s_init = self.s_init(s_inputs)
        s, z = torch.zeros_like(s_init), torch.zeros_like(z_init)
        grad = torch.is_grad_enabled()
        for cycle in range(self.cfg.n_cycles):
            with phase(TRUNK), torch.set_grad_enabled(grad and cycle == self.cfg.n_cycles - 1):
                with op_label("input.recycling"):
                    z = self._recycle(z, z_init)
                    s = s_init + self.recycle_s(s)
                z = self.msa(batch.msa, s_inputs, z, batch.mask, layout)
                s, z = self.pairformer(s, z, batch.mask, layout)
        return s_inputs, s, z

    def _slices(self, rows: int, cols: int) -> list[slice]:
        """Row chunks of a pair-init or recycling pass: all rows at once unless chunking is on."""
        chunk, c_z = self.cfg.pairformer.chunk_size, self.cfg.pairformer.c_z
        return chunking.row_slices(rows, chunk if chunking.in_place(chunk) else None, 4 * cols * c_z)

    def _pair_init(self, batch: FoldBatch, s_inputs: torch.Tensor) -> torch.Tensor:
        """z_init: outer sum of s_inputs projections, relative position and bonds (Algorithm 1)."""
        right = self.z_right(self.layout.col_tokens(s_inputs, batch.mask.shape[0]))[None]
        left = self.z_left(s_inputs)[:, None]
        slices = self._slices(left.shape[0], right.shape[1])
        if len(slices) == 1:
            return left + right + self.relative_position(batch, slices[0]) + self._bonds(batch, slices[0])
        z_init = (left + right).float()
        for i in slices:
            z_init[i] += self.relative_position(batch, i) + self._bonds(batch, i)
        return z_init

    def relative_position(self, batch: FoldBatch, rows: slice) -> torch.Tensor:
        """The relative position encoding of my pair block's rows `rows`."""
        return self.relpos({k: v[rows] for k, v in batch.rows.items()}, batch.cols)

    def _bonds(self, batch: FoldBatch, rows: slice) -> torch.Tensor:
        return self.bond(batch.bonds[rows, :, None].to(self.bond.weight.dtype))

    def _recycle(self, z: torch.Tensor, z_init: torch.Tensor) -> torch.Tensor:
        slices = self._slices(*z.shape[:2])
        if len(slices) == 1:
            return z_init + self.recycle_z(z)
        for i in slices:
            z[i] = z_init[i] + self.recycle_z(z[i])
        return z

    def conditioned_trunk(self, batch: FoldBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(s_inputs, s_trunk, z_cond): what the diffusion module reads of the trunk."""
        s_inputs, s, z = self.trunk(batch)
        with op_label("diffusion.conditioning"):
            z_cond = self.diffusion.conditioning.pair(z, lambda rows: self.relative_position(batch, rows))
        return s_inputs, s, z_cond

    def sample(self, batch: FoldBatch, samples: int) -> torch.Tensor:
        """Positions [atom block, samples, 3] of my atoms after `sampling_steps` denoising steps of a
        batch of `samples` structures on one trunk pass."""
        trunk = self.conditioned_trunk(batch)
        steps = self.cfg.sampling_steps
        return self.diffusion.sample(steps, samples, trunk, batch.mask, self.layout, batch.atoms)

    def loss(self, batch: FoldBatch, samples: int) -> torch.Tensor:
        """This rank's share of the denoising loss of one training step on `samples` noised copies."""
        trunk = self.conditioned_trunk(batch)
        return self.diffusion.denoising_loss(samples, trunk, batch.mask, self.layout, batch.atoms)
