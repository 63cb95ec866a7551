"""Sequence-local atom attention (AlphaFold3 Algorithms 5, 6 and 7) with atoms sharded by token rows.

Windows are defined on the global index of the real atoms, never on a rank's padded block: query
block b holds atoms [32b, 32b + 32) and attends to keys [32b - 48, 32b + 80), so a layout cannot
change which atoms see each other and every grid computes what one rank computes.

Atoms live with their tokens: the atoms of row block r's tokens are split evenly over the cols
ranks of mesh row r, so every rank of the grid holds its own contiguous run of real atoms [start,
stop) (then padding up to its block size), in row-major rank order. A rank works on the query
blocks that overlap its atoms, [A, B) with A and B rounded out to 32; the keys of those blocks reach
48 atoms further each way. Those extra atoms (the halo) come from the ranks that own them, through
one uneven all-to-all; the plan is a pure function of the per-row-block atom counts in the shard, so
it costs no collective. Query positions in [A, B) that belong to a neighbour are computed and
dropped. A token's atoms may span ranks of its mesh row, so the atom-to-token mean sums over the
row group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cpbench.distributed.comm import all_reduce_sum, all_to_all_v, op_label
from cpbench.distributed.grid import Grid
from cpbench.inputs.contract import ATOM_NAME_LEN, NUM_ELEMENTS, NUM_NAME_CHARS
from cpbench.models.fold.conditioned import ConditionedAttention, ConditionedTransition
from cpbench.models.pairformer import PairLayout, kernels, ops
from cpbench.models.pairformer.modules import LinearNoBias

QUERIES, KEYS = 32, 128  # AF3's atom attention window: 32 queries, 128 keys centred on them
HALO = (KEYS - QUERIES) // 2  # 48 atoms each side
ATOM_FEATURES = 3 + 1 + 1 + NUM_ELEMENTS + ATOM_NAME_LEN * NUM_NAME_CHARS  # ref_pos, charge, mask, ...


class AtomWindows:
    """Where this rank's atoms sit among all real atoms, and the halo exchange that gives it the
    keys of its windows. The atoms are cut into shards, one per rank, in order: `bounds` holds the
    real atoms before each shard and in all, `owners` each shard's rank in `group` (None: one rank).
    `block` is the slots a rank holds (its real atoms, then padding); `row_group` the ranks that
    share its token rows, which together hold all atoms of those tokens."""

    def __init__(
        self,
        bounds: Sequence[int],
        index: int,
        block: int,
        owners: Sequence[int] | None = None,
        group: dist.ProcessGroup | None = None,
        row_group: dist.ProcessGroup | None = None,
    ):
        self.bounds, self.block, self.total = tuple(bounds), block, bounds[-1]
        self.index, self.start, self.stop = index, bounds[index], bounds[index + 1]
        self.lo, self.hi = self._span(index)
        self.n_windows = (self.hi - self.lo - 2 * HALO) // QUERIES
        self.group, self.row_group = group, row_group
        self._key_mask: torch.Tensor | None = None
        self.owners = list(owners or [])
        # What moves between me and each shard's owner, by group rank: the slice of my atoms its
        # halo needs (local index), and how many of its atoms mine needs.
        self.sends: list[range] = [range(0)] * len(self.owners)
        self.recvs: list[int] = [0] * len(self.owners)
        for k, owner in enumerate(self.owners):
            if k == index:
                continue
            lo, hi = self._span(k)
            give = range(max(lo, self.start), min(hi, self.stop))
            self.sends[owner] = range(give.start - self.start, max(give.start, give.stop) - self.start)
            self.recvs[owner] = max(0, min(self.hi, bounds[k + 1]) - max(self.lo, bounds[k]))

    @staticmethod
    def of_grid(row_bounds: Sequence[int], grid: Grid, block: int) -> tuple[AtomWindows, slice]:
        """The windows of rank (r, c), given the real atoms before each row block and the slots per
        row block: mesh row r's atoms are split evenly over its cols ranks (the block is a multiple
        of cols), shards in row-major rank order. Also returns my slots of the row block's atoms."""
        if len(row_bounds) - 1 != grid.rows:
            raise ValueError(f"atom bounds for {len(row_bounds) - 1} row blocks, a grid of {grid.rows} rows")
        if block % grid.cols:
            raise ValueError(f"atom block {block} does not split over {grid.cols} mesh columns")
        sub = block // grid.cols
        bounds = [
            row_bounds[r] + min(c * sub, row_bounds[r + 1] - row_bounds[r])
            for r in range(grid.rows)
            for c in range(grid.cols)
        ] + [row_bounds[-1]]
        slots = slice(grid.c * sub, (grid.c + 1) * sub)
        index = grid.r * grid.cols + grid.c
        if grid.size == 1:
            return AtomWindows(bounds, index, sub), slots
        owners = [dist.get_group_rank(grid.world, rank) for row in grid.ranks for rank in row]
        return AtomWindows(bounds, index, sub, owners, grid.world, grid.row_group), slots

    def _span(self, k: int) -> tuple[int, int]:
        """The global atom range [lo, hi) that shard k's windows touch (queries and keys)."""
        start, stop = self.bounds[k], self.bounds[k + 1]
        a = QUERIES * (start // QUERIES)
        # At least one window, even for a block without atoms: every rank then runs the same ops,
        # so the backward passes issue their collectives in the same order.
        b = max(a + QUERIES, QUERIES * math.ceil(stop / QUERIES))
        return a - HALO, b + HALO

    @property
    def real(self) -> torch.Tensor:
        """[hi - lo] bool: which extended positions are real atoms."""
        g = torch.arange(self.lo, self.hi)
        return (g >= 0) & (g < self.total)

    def extend(self, x: torch.Tensor) -> torch.Tensor:
        """[block or more, ...] features of my atoms -> [hi - lo, ...] over the extended range: my
        atoms, the halo from their owners, zeros outside [0, total)."""
        mine = x[: self.stop - self.start]
        tail = tuple(x.shape[1:])
        pieces = [mine]
        if self.group is not None:
            sends = [mine[r.start : r.stop] for r in self.sends]
            received = all_to_all_v(sends, [(n, *tail) for n in self.recvs], self.group)
            # Empty pieces stay in: every rank must use what the exchange returned, or autograd
            # would skip the exchange's backward on the ranks that received nothing.
            # Shards are in atom order: those before mine, then mine, then those after.
            received = [received[owner] for owner in self.owners]
            pieces = [*received[: self.index], mine, *received[self.index + 1 :]]
        left = max(0, min(self.hi, 0) - self.lo)
        right = max(0, self.hi - max(self.lo, self.total))
        return torch.cat([x.new_zeros(left, *tail), *pieces, x.new_zeros(right, *tail)])

    def queries(self, ext: torch.Tensor) -> torch.Tensor:
        """[hi - lo, ...] -> [W, 32, ...]: the query blocks."""
        return ext[HALO : HALO + self.n_windows * QUERIES].unflatten(0, (self.n_windows, QUERIES))

    def keys(self, ext: torch.Tensor) -> torch.Tensor:
        """[hi - lo, ...] -> [W, 128, ...]: each query block's keys."""
        return ext.unfold(0, KEYS, QUERIES).movedim(-1, 1)

    def mine(self, windows: torch.Tensor) -> torch.Tensor:
        """[W, 32, ...] per query -> [block, ...] for my atoms (padding rows zero)."""
        flat = windows.flatten(0, 1)
        first = self.start - self.lo - HALO
        mine = flat[first : first + self.stop - self.start]
        return F.pad(mine, (0, 0) * (mine.dim() - 1) + (0, self.block - mine.shape[0]))

    def key_mask(self, device: torch.device) -> torch.Tensor:
        """[W, 1, 1, 128] additive mask: keys outside the real atoms are masked out. Made once per
        batch and device: every atom transformer block of every sampling step uses it."""
        if self._key_mask is None or self._key_mask.device != device:
            self._key_mask = (ops.MASK_BIAS * (self.keys(self.real.float()) - 1))[:, None, None, :].to(device)
        return self._key_mask


class AtomConditioning(NamedTuple):
    """What the atom transformer is conditioned on; none of it depends on the noise level, so a
    sampler computes it once for all its steps."""

    c: torch.Tensor  # [block, c_atom] atom single conditioning of my atoms
    c_ext: torch.Tensor  # [hi - lo, c_atom] the same over the extended range
    p: torch.Tensor  # [W, 32, 128, c_pair] atom pair conditioning of the windows


class AtomTransformer(nn.Module):
    """Algorithm 7: conditioned attention blocks over the 32 x 128 windows, with a bias from the atom
    pair representation of the windows, each followed by a conditioned transition."""

    def __init__(self, c_atom: int, c_pair: int, n_blocks: int, heads: int):
        super().__init__()
        self.attention = nn.ModuleList(
            ConditionedAttention(c_atom, c_atom, c_pair, heads) for _ in range(n_blocks)
        )
        self.transition = nn.ModuleList(ConditionedTransition(c_atom, c_atom) for _ in range(n_blocks))

    def forward(
        self, q: torch.Tensor, c_ext: torch.Tensor, p: torch.Tensor, windows: AtomWindows
    ) -> torch.Tensor:
        """q [block, c] my atoms, or [block, samples, c] a batch of diffusion samples; c_ext
        [hi - lo, c] the conditioning of the extended range; p [W, 32, 128, c_pair], both shared by
        the samples. Returns my atoms' q."""
        key_mask = windows.key_mask(q.device)
        c_q = windows.queries(c_ext)
        batched = q.dim() == 3
        if batched:  # the samples in front of each window's atoms: [W, S, 32 or 128, ...]
            c_ext, c_q, key_mask = c_ext[:, None], c_q[:, None], key_mask[:, None]
        front = _samples_in_front if batched else _as_is
        for attention, transition in zip(self.attention, self.transition, strict=True):
            q_ext = windows.extend(q)
            x = attention.adaln(q_ext, c_ext)
            query, g = attention.queries(front(windows.queries(x)))
            k, v = attention.keys_values(front(windows.keys(x)))
            bias = attention.pair_bias(p)
            bias = bias[:, None] if batched else bias
            part = kernels.attend_partial(attention.kernels, query, k, v, bias, key_mask)
            a = front(windows.queries(q_ext)) + attention.output(part, g, c_q)
            a = a + transition(a, c_q)
            q = windows.mine(a.movedim(1, 2) if batched else a)
            # What the block made but q, freed before the next block makes its own: each block then
            # repeats the first's peak (the estimate traces one, `FoldWorkload.peak_form`).
            del q_ext, x, query, g, k, v, bias, part, a
        return q


class AtomEncoder(nn.Module):
    """Algorithm 5: per-atom features and atom-pair features of the windows (`condition`), the atom
    transformer, then the mean over each token's atoms. With trunk outputs (the diffusion module's
    encoder) the atoms are also conditioned on s and z of their tokens and on their noisy positions."""

    def __init__(self, c_atom: int, c_pair: int, c_token: int, n_blocks: int, heads: int,
                 c_s: int | None = None, c_z: int | None = None):  # fmt: skip
        super().__init__()
        self.features = LinearNoBias(ATOM_FEATURES, c_atom)
        self.offsets = LinearNoBias(3, c_pair)
        self.inverse_distance = LinearNoBias(1, c_pair)
        self.same_space = LinearNoBias(1, c_pair)
        if c_s is not None and c_z is not None:
            self.trunk_s = nn.Sequential(nn.LayerNorm(c_s), LinearNoBias(c_s, c_atom))
            self.trunk_z = nn.Sequential(nn.LayerNorm(c_z), LinearNoBias(c_z, c_pair))
            self.noisy_pos = LinearNoBias(3, c_atom)
        self.query_single, self.key_single = LinearNoBias(c_atom, c_pair), LinearNoBias(c_atom, c_pair)
        self.pair_mlp = nn.Sequential(
            nn.ReLU(), LinearNoBias(c_pair, c_pair), nn.ReLU(), LinearNoBias(c_pair, c_pair),
            nn.ReLU(), LinearNoBias(c_pair, c_pair),
        )  # fmt: skip
        self.transformer = AtomTransformer(c_atom, c_pair, n_blocks, heads)
        self.to_token = LinearNoBias(c_atom, c_token)

    @staticmethod
    def atom_inputs(atoms: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat(
            [
                atoms["ref_pos"],
                atoms["ref_charge"][:, None],
                atoms["atom_pad_mask"][:, None].float(),
                F.one_hot(atoms["ref_element"], NUM_ELEMENTS).float(),
                F.one_hot(atoms["ref_atom_name_chars"], NUM_NAME_CHARS).flatten(1).float(),
            ],
            dim=-1,
        )

    def condition(
        self,
        atoms: dict[str, torch.Tensor],
        windows: AtomWindows,
        rows: range,
        trunk: tuple[torch.Tensor, torch.Tensor, PairLayout] | None = None,
    ) -> AtomConditioning:
        """The atom single and pair conditioning. atoms: my atoms' features ([block, ...]); rows: my
        token rows; trunk: (s [h, c_s], z [h, w, c_z], layout) for the diffusion module's encoder."""
        token = atoms["atom_to_token"]
        c = self.features(self.atom_inputs(atoms))
        if trunk is not None:
            s_trunk, z_trunk, layout = trunk
            c = c + self.trunk_s(s_trunk)[token - rows.start]
        # The halo's conditioning, positions and ids (each in its own dtype: ids stay exact).
        c_ext = windows.extend(c)
        pos_ext = windows.extend(atoms["ref_pos"])
        ids_ext = windows.extend(torch.stack([atoms["ref_space_uid"], token], dim=-1))

        # Atom-pair features of each window: [W, 32, 128, c_pair].
        pos_q, pos_k = windows.queries(pos_ext)[:, :, None], windows.keys(pos_ext)[:, None]
        uid_q, uid_k = windows.queries(ids_ext[:, 0])[:, :, None], windows.keys(ids_ext[:, 0])[:, None]
        same = (uid_q == uid_k)[..., None].to(c.dtype)
        d = pos_q - pos_k
        p = self.offsets(d) * same
        p = p + self.inverse_distance(1 / (1 + d.square().sum(-1, keepdim=True))) * same
        p = p + self.same_space(same) * same
        if trunk is not None:
            p = p + self._trunk_pair(z_trunk, layout, ids_ext[:, 1], windows, rows)
        c_q, c_k = windows.queries(c_ext), windows.keys(c_ext)
        p = p + self.query_single(F.relu(c_q))[:, :, None] + self.key_single(F.relu(c_k))[:, None]
        return AtomConditioning(c, c_ext, p + self.pair_mlp(p))

    def forward(
        self,
        atoms: dict[str, torch.Tensor],
        windows: AtomWindows,
        rows: range,
        cond: AtomConditioning,
        noisy_pos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The atom transformer on the conditioning (plus the noisy positions [block, samples, 3] of a
        batch of diffusion samples), then the mean over each token's atoms. Returns the token
        activations [h, (samples,) c_token] and the skip tensors (q [block, (samples,) c], c_ext, p)
        for the decoder."""
        q = cond.c if noisy_pos is None else cond.c[:, None] + self.noisy_pos(noisy_pos)
        q = self.transformer(q, cond.c_ext, cond.p, windows)
        a = F.relu(self.to_token(q))
        token = atoms["atom_to_token"] - rows.start
        return _token_mean(a, token, atoms["atom_pad_mask"], len(rows), windows), (q, cond.c_ext, cond.p)

    def _trunk_pair(
        self, z: torch.Tensor, layout: PairLayout, token_ext: torch.Tensor, windows: AtomWindows, rows: range
    ) -> torch.Tensor:
        """LinearNoBias(LayerNorm(z[token(l), token(m)])) for every (query, key) atom pair of the
        windows. Query atoms that are mine have their token in my rows. A key is at most 79 atoms
        from its query, and every token has an atom, so key tokens lie within 79 tokens of my rows:
        that band's columns are spread over my row group's column blocks. Each rank projects its
        block, keeps the band's columns it holds, and a sum over the row group completes the band."""
        n = z.shape[1] * layout.grid.cols
        cols = layout.cols(n)
        reach = HALO + QUERIES - 1
        band = range(max(0, rows.start - reach), min(n, rows.stop + reach))
        tok_q = windows.queries(token_ext)  # [W, 32]
        tok_k = windows.keys(token_ext).clamp(band.start, band.stop - 1)  # [W, 128]; others are masked
        lo = max(band.start, cols.start)
        held = range(lo, max(lo, min(band.stop, cols.stop)))  # the band's columns in my block
        projected = self.trunk_z(z[:, held.start - cols.start : held.stop - cols.start])  # [h, |held|, c]
        pad = (held.start - band.start, band.stop - held.stop)
        piece = all_reduce_sum(F.pad(projected, (0, 0, *pad)), layout.grid.row_group)  # [h, |band|, c]
        # Queries that are not mine may have tokens outside my rows: clamp, they are dropped later.
        row = (tok_q - rows.start).clamp(0, len(rows) - 1)[:, :, None]
        return piece[row, (tok_k - band.start)[:, None, :]]


def _samples_in_front(x: torch.Tensor) -> torch.Tensor:
    """[W, Q, samples, ...] -> [W, samples, Q, ...]: attention's batch dims in front of its queries."""
    return x.movedim(2, 1)


def _as_is(x: torch.Tensor) -> torch.Tensor:
    return x


def _token_mean(
    x: torch.Tensor, token: torch.Tensor, real: torch.Tensor, n_rows: int, windows: AtomWindows
) -> torch.Tensor:
    """Mean over each token's real atoms: [block, (samples,) c] -> [n_rows, (samples,) c] (tokens
    without atoms get 0). A token's atoms may lie on several ranks of my row group: sums and counts add
    up over it."""
    weight = real.float().reshape(-1, *[1] * (x.dim() - 1))  # float32 sums: the ranks add in any order
    total = x.new_zeros(n_rows, *x.shape[1:], dtype=torch.float32).index_add(0, token, x.float() * weight)
    count = weight.new_zeros(n_rows, *weight.shape[1:]).index_add(0, token, weight)
    both = all_reduce_sum(torch.cat([total, count.expand(*total.shape[:-1], 1)], dim=-1), windows.row_group)
    return (both[..., :-1] / both[..., -1:].clamp(min=1)).to(x.dtype)


class AtomDecoder(nn.Module):
    """Algorithm 6: token activations broadcast to their atoms, the atom transformer, then a
    position update per atom."""

    def __init__(self, c_atom: int, c_pair: int, c_token: int, n_blocks: int, heads: int):
        super().__init__()
        self.from_token = LinearNoBias(c_token, c_atom)
        self.transformer = AtomTransformer(c_atom, c_pair, n_blocks, heads)
        self.norm = nn.LayerNorm(c_atom)
        self.to_pos = LinearNoBias(c_atom, 3)

    def forward(
        self,
        a: torch.Tensor,
        skip: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        atoms: dict[str, torch.Tensor],
        windows: AtomWindows,
        rows: range,
    ) -> torch.Tensor:
        q_skip, c_ext, p = skip
        q = self.from_token(a)[atoms["atom_to_token"] - rows.start] + q_skip
        with op_label("diffusion.atom_decoder"):
            q = self.transformer(q, c_ext, p, windows)
        return self.to_pos(self.norm(q))
