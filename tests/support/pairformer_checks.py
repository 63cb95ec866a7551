"""The Pairformer's one-rank-versus-CP checks one rank runs (`Checks`): every op, a block and a stack,
forward and backward, against the one-rank module on the whole input, and the byte ledger against the
formulas of docs/pairformer.md (`expected_bytes`), at the tests' sizes (`N`, `PAD`, `CFG`). The one-rank
results are the same on every rank and in every case (the same seeds): `one_rank_references` computes
them once, for the ranks to read instead of each computing them again."""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.core import RankContext, Shape
from cpbench.distributed.comm import LEDGER, all_reduce_sum, op_label
from cpbench.distributed.grid import Grid
from cpbench.models.pairformer import PairformerBlock, PairformerConfig, PairformerStack, PairLayout

N = 12  # tiles 2, 4, 2x2, 1x2 and 2x1; the last PAD tokens are padding
PAD = 3
CFG = dict(
    c_s=8,
    c_z=8,
    n_blocks=2,
    tri_mul_hidden=6,
    tri_heads=2,
    tri_head_width=4,
    single_heads=2,
    transition_factor=2,
)

# The pairformer workload at the tests' small sizes, and a shape of 11 tokens that the grids pad.
SMALL = dict(c_s=8, c_z=8, n_blocks=1, tri_mul_hidden=8, tri_heads=2, tri_head_width=4, single_heads=2)
SHAPE = Shape(n_tokens=11, n_atoms=0, msa_depth=2)  # padded to 12 on the tests' grids


def _inputs(seed: int = 5):
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(N, CFG["c_s"], generator=gen)
    z = torch.randn(N, N, CFG["c_z"], generator=gen)
    # Cotangents: the loss is <s_out, ws> + <z_out, wz>, the pair term scaled like a per-row mean so
    # that gradients are O(1) and assert_close's absolute tolerance means the same for every output.
    ws = torch.randn(N, CFG["c_s"], generator=gen)
    wz = torch.randn(N, N, CFG["c_z"], generator=gen) / N
    mask = torch.ones(N)
    mask[N - PAD :] = 0
    return s, z, ws, wz, mask


# op name -> (module attribute of a block or None for the whole block, returns s, returns z)
OPS = {
    "tri_mul_out": ("tri_mul_out", False, True),
    "tri_mul_in": ("tri_mul_in", False, True),
    "tri_att_start": ("tri_att_start", False, True),
    "tri_att_end": ("tri_att_end", False, True),
    "pair_transition": ("pair_transition", False, True),
    "single_attention": ("single_attention", True, False),
    "single_transition": ("single_transition", True, False),
}


def _call(module, name: str, s, z, mask, layout):
    """Run one op (under its ledger label, as a block does) or a whole block or stack."""
    if name in OPS:
        with op_label(f"pairformer.{name}"):
            return _call_op(module, name, s, z, mask, layout)
    return module(s, z, mask, layout)


def _call_op(module, name: str, s, z, mask, layout):
    if name in ("tri_mul_out", "tri_mul_in", "tri_att_start", "tri_att_end"):
        return None, module(z, mask, layout)
    if name == "pair_transition":
        return None, module(z)
    if name == "single_attention":
        return module(s, z, mask, layout), None
    return module(s), None  # single_transition


def one_rank_references(extras: list[str]) -> dict[str, tuple]:
    """The one-rank results (outputs and gradients) of every comparison `Checks.run(extras)` makes,
    by name, computed once on one thread (as on the ranks): `Checks(ctx, references=...)` reads them."""
    from cpbench.core import Topology

    one = RankContext(0, 1, torch.device("cpu"), None, Topology("1d", 1, (1, 1)), torch.float32, 0, (0, 0),
                      None, None)  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        checks = Checks(one, record=True)
        checks.run(extras)
    finally:
        torch.set_num_threads(threads)
    return checks.references


class Checks:
    """`references`: the one-rank results by comparison (`one_rank_references`), else computed here;
    `record`: compute the one-rank results alone, into `references` (no CP side, nothing checked)."""

    def __init__(self, ctx: RankContext, references: dict[str, tuple] | None = None, record: bool = False):
        self.ctx = ctx
        self.layout = PairLayout(Grid.from_context(ctx))
        self.rows, self.cols = ctx.block(N)
        self.failures: list[str] = []
        self.references = {} if references is None else references
        self.record = record

    def run(self, extras: list[str]) -> list[str]:
        cfg = PairformerConfig(**CFG)
        torch.manual_seed(1)
        block = PairformerBlock(cfg)
        for name, (attr, _, _) in OPS.items():
            self.compare(f"op {name}", getattr(block, attr), name, ledger=name)
        self.compare("block", block, "block")
        torch.manual_seed(2)
        self.compare("stack", PairformerStack(cfg), "stack")
        if not self.record:
            self.padding_invariance(PairformerStack(cfg))
        if "chunk" in extras:
            torch.manual_seed(3)
            stack = PairformerStack(PairformerConfig(**CFG, chunk_size=2))
            self.compare("stack chunk_size=2 (inference)", stack, "stack", train=False)
        if "checkpoint" in extras:
            torch.manual_seed(4)
            self.compare(
                "stack checkpoint", PairformerStack(PairformerConfig(**CFG, checkpoint=True)), "stack"
            )
        if "bf16" in extras:
            torch.manual_seed(5)
            self.compare("stack bf16", PairformerStack(PairformerConfig(**CFG, dtype="bf16")), "stack",
                         autocast=True, tol={"rtol": 0.05, "atol": 0.05})  # fmt: skip
        if "compile" in extras:
            torch.manual_seed(6)
            eager = PairformerStack(PairformerConfig(**CFG))
            compiled = None
            if not self.record:  # the one-rank side is the eager stack's
                compiled = PairformerStack(
                    PairformerConfig(**CFG, compile="default", fullgraph=True, compile_backend="aot_eager")
                )
                compiled.load_state_dict(eager.state_dict())
            self.compare("stack compile fullgraph", eager, "stack", cp_module=compiled)
        return self.failures

    def check(self, what: str, actual, expected, **tol) -> None:
        try:
            torch.testing.assert_close(actual, expected, **tol)
        except AssertionError as err:
            self.failures.append(f"rank {self.ctx.rank} {self.ctx.coords}: {what}: {err}")

    def shard(self, s, z):
        return s[self.rows].clone(), z[self.rows, self.cols].clone()

    def compare(self, what: str, module, name: str, train: bool = True, ledger: str | None = None,
                cp_module=None, autocast: bool = False, tol: dict | None = None) -> None:  # fmt: skip
        """One-rank vs CP on this rank's shard: outputs, input gradients, summed parameter gradients."""
        tol = tol or {}
        s, z, ws, wz, mask = _inputs()
        params = list(module.parameters())
        cp_module = cp_module or module
        cp_params = list(cp_module.parameters())
        amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
        # One rank, the whole input (computed once for every rank and case where `references` has it).
        if what not in self.references:
            s1, z1 = s.clone().requires_grad_(train), z.clone().requires_grad_(train)
            with torch.set_grad_enabled(train), amp:
                out_s, out_z = _call(module, name, s1, z1, mask, PairLayout())
            ref = None
            if train:
                loss = _dot(out_s, ws) + _dot(out_z, wz)
                ref = _zeros_for_none(
                    [s1, z1, *params], torch.autograd.grad(loss, [s1, z1, *params], allow_unused=True)
                )
            self.references[what] = tuple(None if t is None else t.detach() for t in (out_s, out_z)) + (ref,)
        if self.record:
            return
        out_s, out_z, ref = self.references[what]
        # This rank's shard; replicated s rows count once per row group (1/cols of the loss each).
        sb, zb = self.shard(s, z)
        sb.requires_grad_(train)
        zb.requires_grad_(train)
        if ledger:
            LEDGER.reset()
        with torch.set_grad_enabled(train), amp:
            cp_s, cp_z = _call(cp_module, name, sb, zb, mask, self.layout)
        if train:
            cols = self.ctx.topology.grid[1]
            share = _dot(cp_s, ws[self.rows]) / cols + _dot(cp_z, wz[self.rows, self.cols])
            inputs = [sb, zb, *cp_params]
            grads = _zeros_for_none(inputs, torch.autograd.grad(share, inputs, allow_unused=True))
        if ledger:
            self.check_ledger(ledger)
        if out_s is not None:
            self.check(f"{what}: s", cp_s, out_s[self.rows], **tol)
        if out_z is not None:
            self.check(f"{what}: z", cp_z, out_z[self.rows, self.cols], **tol)
        if not train:
            return
        # s is replicated over the row group: each replica's gradient is a share of the whole.
        s_grad = all_reduce_sum(grads[0], self.ctx.row_peers)
        self.check(f"{what}: grad s", s_grad, ref[0][self.rows], **tol)
        self.check(f"{what}: grad z", grads[1], ref[1][self.rows, self.cols], **tol)
        world = dist.group.WORLD if self.ctx.world_size > 1 else None
        for (pname, _), g, r in zip(cp_module.named_parameters(), grads[2:], ref[2:], strict=True):
            self.check(f"{what}: grad {pname}", all_reduce_sum(g, world), r, **tol)

    def check_ledger(self, name: str) -> None:
        label = f"pairformer.{name}"
        expected = expected_bytes(name, N, PairformerConfig(**CFG), self.ctx.topology.grid, self.ctx.coords)
        actual = (LEDGER.bytes_sent.get(label, 0), LEDGER.bytes_sent.get(label + ".bwd", 0))
        others = {k: v for k, v in LEDGER.bytes_sent.items() if k not in (label, label + ".bwd") and v}
        if actual != expected or others:
            self.failures.append(
                f"rank {self.ctx.rank} {self.ctx.coords}: ledger {name}: (fwd, bwd) bytes {actual}, "
                f"formula {expected}, other labels {others}"
            )

    def padding_invariance(self, stack) -> None:
        """Changing padded tokens' inputs changes no valid output, on the shard too."""
        s, z, _, _, mask = _inputs()
        s2, z2 = s.clone(), z.clone()
        gen = torch.Generator().manual_seed(9)
        pad = mask == 0
        s2[pad] = 100 * torch.randn(s2[pad].shape, generator=gen)
        z2[pad] = 100 * torch.randn(z2[pad].shape, generator=gen)
        z2[:, pad] = 100 * torch.randn(z2[:, pad].shape, generator=gen)
        with torch.no_grad():
            outs = [stack(*self.shard(a, b), mask, self.layout) for a, b in ((s, z), (s2, z2))]
        keep_r, keep_c = mask[self.rows] == 1, mask[self.cols] == 1
        self.check("padding: s", outs[1][0][keep_r], outs[0][0][keep_r])
        self.check("padding: z", outs[1][1][keep_r][:, keep_c], outs[0][1][keep_r][:, keep_c])


def _zeros_for_none(tensors, grads) -> list[torch.Tensor]:
    """Unused inputs (None gradients) as zero gradients."""
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads, strict=True)]


def _dot(out, weight) -> torch.Tensor:
    return torch.zeros(()) if out is None else (out.float() * weight).sum()


# --- the formulas of docs/pairformer.md: bytes one rank sends per op, (forward, backward) ----------------


def expected_bytes(op: str, n: int, cfg: PairformerConfig, grid: tuple[int, int], coords: tuple[int, int],
                   elem: int = 4) -> tuple[int, int]:  # fmt: skip
    rows, cols = grid
    r, c = coords
    nr, nc = n // rows, n // cols
    block = nr * nc
    # Transposes keep |R_r ∩ C_c|^2 pairs at home and send the rest of the block.
    diag = max(0, min((r + 1) * nr, (c + 1) * nc) - max(r * nr, c * nc))
    moved = 0 if rows * cols == 1 else block - diag * diag
    h = cfg.tri_heads

    def attention_start(ring_peers: int, fetch_peers: int) -> int:
        return ring_peers * block * cfg.c_z + moved * h + fetch_peers * block * h

    if op in ("tri_mul_out", "tri_mul_in"):
        # Broadcasts over the column group (rows - 1 blocks at the root), the accumulator ring over
        # the row group (cols - 1); the backward also fetches the rows again. Incoming runs on the
        # transposed grid, where rows and cols swap.
        fetchers, ring = (rows, cols) if op == "tri_mul_out" else (cols, rows)
        fwd = (fetchers - 1 + ring - 1) * block * cfg.tri_mul_hidden
        bwd = (2 * (fetchers - 1) + ring - 1) * block * cfg.tri_mul_hidden
        return fwd * elem, bwd * elem
    if op == "tri_att_start":
        fwd = attention_start(cols - 1, rows - 1)
        return fwd * elem, fwd * elem
    if op == "tri_att_end":
        if cols == 1 and rows > 1:  # transpose z and the output by all-to-all, attend on the same grid
            fwd = 2 * moved * cfg.c_z + attention_start(0, rows - 1)
        else:  # the starting-node scheme on the transposed grid
            fwd = attention_start(rows - 1, cols - 1)
        return fwd * elem, fwd * elem
    if op == "single_attention":
        hs = cfg.single_heads
        gather = (rows - 1) * nr * cfg.c_s
        merge = 2 * (cols - 1) / cols * nr * (cfg.c_s + hs)
        peak = 2 * (cols - 1) / cols * nr * hs
        return int(elem * (gather + merge + peak)), int(elem * (gather + merge))
    return 0, 0  # transitions are local
