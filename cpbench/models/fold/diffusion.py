"""The diffusion module (AlphaFold3 Algorithms 18-22): conditioning on the trunk, the denoiser
(atom encoder, token transformer, atom decoder) and the sampler, sharded like the trunk.

Token activations live with their token rows (replicated over the row group), atoms with their
tokens (split over the ranks of a mesh row), the pair conditioning in the pair block. Every random
draw (initial noise, the noise of each step, a training noise level) is made over all real atoms
from a generator seeded by the run's seed and step, then cut to this rank's atoms: the same
numbers land on the same atoms on every grid.

As AlphaFold3 does, one trunk pass feeds a batch of diffusion samples (5 in its inference, 48 noised
copies in its training): the trunk's outputs and every conditioning that does not depend on the noise
are shared, and the denoiser runs on the batch at once, so its activations (the token attention's
logits above all) grow with the samples. A sample's activations sit beside their token or atom,
[tokens or atoms, samples, ...], so that what moves tokens and atoms between ranks moves every sample
at once; attention runs with the samples in front.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from cpbench.core.phases import SAMPLING_STEP, phase
from cpbench.distributed.comm import op_label
from cpbench.models.fold.atoms import AtomConditioning, AtomDecoder, AtomEncoder, AtomWindows
from cpbench.models.fold.conditioned import TokenTransformer
from cpbench.models.pairformer import PairLayout, chunking
from cpbench.models.pairformer.modules import LinearNoBias, Transition

SIGMA_DATA = 16.0
# Each sample of a batch draws from its own generator, `SAMPLE_STRIDE` seeds from the last: sample 0's
# draws are those of a batch of one, whatever the batch (one batched draw would not keep them: torch
# fills a normal tensor in blocks whose last depends on the tensor's size).
SAMPLE_STRIDE = 7_919_003
S_MAX, S_MIN, RHO = 160.0, 4e-4, 7.0  # the noise schedule of AF3 sampling
GAMMA_0, GAMMA_MIN, NOISE_SCALE, STEP_SCALE = 0.8, 1.0, 1.003, 1.5


@dataclass(frozen=True)
class DiffusionSizes:
    c_atom: int = 128
    c_atom_pair: int = 16
    c_token: int = 768
    atom_blocks: int = 3
    atom_heads: int = 4
    token_blocks: int = 24
    token_heads: int = 16
    fourier: int = 256


@dataclass
class AtomContext:
    """What the diffusion module needs of a rank's atoms, built once per batch."""

    atoms: dict[str, torch.Tensor]  # my atoms' features [block, ...]
    windows: AtomWindows
    rows: range  # my token rows
    seed: int

    def noise(self, step: int, device: torch.device, samples: int) -> torch.Tensor:
        """Standard normal noise [block, samples, 3] for my atoms (zero on padding), each sample its
        own draw, the same on every grid (sample 0's is the draw of a batch of one)."""
        full = torch.stack([
            torch.randn(self.windows.total, 3, generator=_generator(self.seed * 1_000_003 + step, k))
            for k in range(samples)
        ])  # fmt: skip
        mine = full[:, self.windows.start : self.windows.stop].movedim(0, 1)
        out = torch.zeros(self.windows.block, samples, 3)
        out[: len(mine)] = mine
        return out.to(device)


def _generator(seed: int, sample: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed + sample * SAMPLE_STRIDE)


def noise_schedule(steps: int) -> list[float]:
    """Noise levels c_0 > ... > c_steps (Algorithm 18's schedule, times sigma_data)."""
    levels = []
    for i in range(steps + 1):
        t = i / steps
        levels.append(
            SIGMA_DATA * (S_MAX ** (1 / RHO) + t * (S_MIN ** (1 / RHO) - S_MAX ** (1 / RHO))) ** RHO
        )
    return levels


class FourierEmbedding(nn.Module):
    """Algorithm 22: cos(2 pi (t w + b)) with w, b fixed at initialisation (from the model seed)."""

    def __init__(self, c: int):
        super().__init__()
        self.register_buffer("w", torch.randn(c))
        self.register_buffer("b", torch.randn(c))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cos(2 * math.pi * (t * self.w + self.b))


class DiffusionConditioning(nn.Module):
    """Algorithm 21: pair conditioning from z_trunk and the relative position; single conditioning
    from s_trunk, s_inputs and the noise level."""

    def __init__(
        self, c_s: int, c_z: int, c_s_inputs: int, fourier: int, chunk_size: int | str | None = None
    ):
        super().__init__()
        self.chunk_size = chunk_size
        self.pair_in = nn.Sequential(nn.LayerNorm(2 * c_z), LinearNoBias(2 * c_z, c_z))
        self.pair_transitions = nn.ModuleList(Transition(c_z, 2, chunk_size) for _ in range(2))
        self.single_in = nn.Sequential(nn.LayerNorm(c_s + c_s_inputs), LinearNoBias(c_s + c_s_inputs, c_s))
        self.fourier = FourierEmbedding(fourier)
        self.noise_in = nn.Sequential(nn.LayerNorm(fourier), LinearNoBias(fourier, c_s))
        self.single_transitions = nn.ModuleList(Transition(c_s, 2) for _ in range(2))

    def pair(self, z_trunk: torch.Tensor, relpos: Callable[[slice], torch.Tensor]) -> torch.Tensor:
        """Independent of the noise level: computed once per sampling run. `relpos(rows)` is the
        relative position encoding of those rows of my block. With chunking on and autograd off, the
        result is written over z_trunk, chunk by chunk of rows."""
        if not chunking.in_place(self.chunk_size):
            z = self.pair_in(torch.cat([z_trunk, relpos(slice(None))], dim=-1))
            for transition in self.pair_transitions:
                z = z + transition(z)
            return z
        h, w, c_z = z_trunk.shape
        for i in chunking.row_slices(h, self.chunk_size, 4 * w * c_z):
            z_trunk[i] = self.pair_in(torch.cat([z_trunk[i], relpos(i)], dim=-1))
        for transition in self.pair_transitions:
            z_trunk = transition.update_(z_trunk)
        return z_trunk

    def single(self, s_trunk: torch.Tensor, s_inputs: torch.Tensor, t_hat: torch.Tensor) -> torch.Tensor:
        """[h, c_s] token inputs and the noise levels t_hat [S] (S: 1, shared by every sample, or one
        per sample) -> [h, S, c_s]."""
        s = self.single_in(torch.cat([s_trunk, s_inputs], dim=-1))
        level = (0.25 * torch.log(t_hat / SIGMA_DATA)).to(torch.float32)[:, None]  # [S, 1]
        s = s[:, None] + self.noise_in(self.fourier(level))
        for transition in self.single_transitions:
            s = s + transition(s)
        return s


class DiffusionModule(nn.Module):
    """Algorithm 20: the denoiser D(x_noisy, t_hat) on my atoms, conditioned on the trunk."""

    def __init__(
        self, sizes: DiffusionSizes, c_s: int, c_z: int, c_s_inputs: int, chunk_size: int | str | None = None
    ):
        super().__init__()
        self.conditioning = DiffusionConditioning(c_s, c_z, c_s_inputs, sizes.fourier, chunk_size)
        args = (sizes.c_atom, sizes.c_atom_pair, sizes.c_token, sizes.atom_blocks, sizes.atom_heads)
        self.encoder = AtomEncoder(*args, c_s=c_s, c_z=c_z)
        self.single_to_token = nn.Sequential(nn.LayerNorm(c_s), LinearNoBias(c_s, sizes.c_token))
        self.transformer = TokenTransformer(
            sizes.c_token, c_s, c_z, sizes.token_blocks, sizes.token_heads, chunk_size
        )
        self.norm = nn.LayerNorm(sizes.c_token)
        self.decoder = AtomDecoder(*args)

    def forward(
        self,
        x_noisy: torch.Tensor,
        t_hat: torch.Tensor,
        trunk: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        layout: PairLayout,
        atoms: AtomContext,
        atom_cond: AtomConditioning,
    ) -> torch.Tensor:
        """x_noisy [block, samples, 3]; t_hat [1] (every sample's) or [samples], float64; trunk:
        (s_inputs, s_trunk, z_cond); atom_cond from `atom_conditioning`. Returns x_denoised."""
        s_inputs, s_trunk, z_cond = trunk
        with op_label("diffusion.conditioning"):
            s = self.conditioning.single(s_trunk, s_inputs, t_hat)
        t = t_hat[:, None]  # [S, 1]: over a sample's positions
        r_noisy = x_noisy * (1 / torch.sqrt(t**2 + SIGMA_DATA**2)).to(x_noisy.dtype)
        with op_label("diffusion.atom_encoder"):
            a, skip = self.encoder(atoms.atoms, atoms.windows, atoms.rows, atom_cond, noisy_pos=r_noisy)
        a = a + self.single_to_token(s)
        a = self.norm(self.transformer(a, s, z_cond, mask, layout))
        r_update = self.decoder(a, skip, atoms.atoms, atoms.windows, atoms.rows)
        scale = SIGMA_DATA**2 + t**2
        keep, update = SIGMA_DATA**2 / scale, SIGMA_DATA * t / torch.sqrt(scale)
        return keep.to(x_noisy.dtype) * x_noisy + update.to(x_noisy.dtype) * r_update

    def atom_conditioning(
        self, trunk: tuple[torch.Tensor, torch.Tensor, torch.Tensor], layout: PairLayout, atoms: AtomContext
    ) -> AtomConditioning:
        """The encoder's atom conditioning on s_trunk and the pair conditioning z_cond (Algorithm 20
        passes the conditioned pair representation): independent of the noise level."""
        _, s_trunk, z_cond = trunk
        with op_label("diffusion.atom_encoder"):
            trunk_cond = (s_trunk, z_cond, layout)
            return self.encoder.condition(atoms.atoms, atoms.windows, atoms.rows, trunk=trunk_cond)

    def sample(
        self,
        steps: int,
        samples: int,
        trunk: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        layout: PairLayout,
        atoms: AtomContext,
    ) -> torch.Tensor:
        """Algorithm 18 without the random rigid augmentation: `steps` denoising steps from noise, for
        a batch of `samples` structures. Returns their positions [block, samples, 3]."""
        levels = noise_schedule(steps)
        real = atoms.atoms["atom_pad_mask"][:, None, None].to(trunk[1].dtype)
        device = real.device
        x = levels[0] * atoms.noise(0, device, samples) * real
        atom_cond = self.atom_conditioning(trunk, layout, atoms)
        for step, (c_prev, c) in enumerate(zip(levels[:-1], levels[1:], strict=True), start=1):
            with phase(SAMPLING_STEP):
                gamma = GAMMA_0 if c > GAMMA_MIN else 0.0
                t_hat = c_prev * (gamma + 1)
                noise = atoms.noise(step, device, samples)
                x_noisy = x + NOISE_SCALE * math.sqrt(t_hat**2 - c_prev**2) * noise * real
                level = torch.tensor([t_hat], dtype=torch.float64, device=device)  # every sample's
                x_denoised = self(x_noisy, level, trunk, mask, layout, atoms, atom_cond)
                delta = (x_noisy - x_denoised) / t_hat
                x = (x_noisy + STEP_SCALE * (c - t_hat) * delta) * real
                del noise, x_noisy, level, x_denoised, delta  # each step then repeats the first's peak
        return x

    def denoising_loss(
        self,
        samples: int,
        trunk: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        layout: PairLayout,
        atoms: AtomContext,
    ) -> torch.Tensor:
        """One training denoising step of `samples` noised copies of the reference positions (the
        ground truth), each at its own noise level drawn from the seed: AF3's weighted MSE, averaged
        over the copies. This rank's share: the error of its own atoms."""
        with unset_fake_temporarily():  # a real draw even while a step is traced (probe.predict)
            # not a noise() stream
            draws = [
                torch.randn(1, generator=_generator(atoms.seed * 1_000_003 - 2, k)).item()
                for k in range(samples)
            ]
        sigmas = [SIGMA_DATA * math.exp(-1.2 + 1.5 * draw) for draw in draws]
        real = atoms.atoms["atom_pad_mask"][:, None, None].float()
        x_true = atoms.atoms["ref_pos"][:, None] * real  # [block, 1, 3]: every copy's ground truth
        sigma = torch.tensor(sigmas, dtype=torch.float64, device=real.device)  # [samples]
        atom_cond = self.atom_conditioning(trunk, layout, atoms)  # once per trunk, as in sampling
        with phase(SAMPLING_STEP):  # the one denoising step's forward: the noising and the denoiser
            noise = atoms.noise(-1, real.device, samples)
            x_noisy = x_true + sigma[:, None].to(torch.float32) * noise * real
            x_denoised = self(x_noisy, sigma, trunk, mask, layout, atoms, atom_cond)
        weight = ((sigma**2 + SIGMA_DATA**2) / (sigma * SIGMA_DATA) ** 2).to(torch.float32)
        squared = ((x_denoised.float() - x_true).square() * real).sum(dim=(0, 2))  # [samples]
        return (weight * squared).mean() / (3 * max(atoms.windows.total, 1))
