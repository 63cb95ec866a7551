"""cpbench's one-rank Pairformer block against boltz 2.2.1's `PairformerLayer`, side by side.

    pip install --no-deps boltz==2.2.1 einops scipy   # its layer needs only these beside torch
    python benchmarks/vs_boltz.py                      # N 64, 128, 256
    python benchmarks/vs_boltz.py --n 128 --repeats 3
    python benchmarks/vs_boltz.py --grid-ab               # also the chunked/plain A/B on a 2d 2x2 grid

A CP benchmark of a slow reference model puts the bottleneck where no production model has it, so
the one-rank block is held to a public implementation's speed. Both sides get the same dims (c_s 64,
c_z 32, 4 single heads, 4 triangle heads of width 8, B=1, fp32, `--threads` torch threads) and the
same weights (cpbench's copied into boltz's layer; boltz's v2 single attention, as Boltz-2 uses);
outputs and gradients are checked equal to fp32 round-off before anything is timed. Forward also
runs cpbench's chunked inference form (`chunk_size=auto`, the default of workload=fold: every op
written over z in place), the A/B against cpbench's plain form; it writes over its input, so each
of its steps starts from its own copy of z (the copy is timed with it).

Per N: forward (no grad) and forward + backward (a fixed random cotangent on s and z), the two
systems interleaved step by step in one process (so the machine's load falls on both alike), the
median of `--repeats`. Activation memory per phase: VmHWM minus VmRSS at the phase's start, after
resetting the high-water mark through /proc/self/clear_refs, with glibc told (mallopt) to return
blocks of 128 KiB and up to the kernel on free, so a freed tensor leaves the resident set; weights
and inputs exist before the phase and are not counted. Prints the ratios cpbench / boltz.

`--grid-ab`: the same A/B on a 2d 2x2 grid of gloo ranks (pairformer_cpu.py's harness and sizes, the
same as here; one torch thread per rank), inference steps of the pairformer workload with
`chunk_size` null and auto, the two alternating point by point: the slowest rank's median step
and the per-rank activation peak.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from cpbench.models.pairformer import PairformerConfig, PairLayout, chunking
from cpbench.models.pairformer.block import PairformerBlock

C_S, C_Z, SINGLE_HEADS, TRI_HEADS, TRI_WIDTH = 64, 32, 4, 4, 8
INSTALL = "pip install --no-deps boltz==2.2.1 einops scipy"
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
CONFIG = PairformerConfig(c_s=C_S, c_z=C_Z, n_blocks=1, tri_mul_hidden=C_Z, tri_heads=TRI_HEADS,
                          tri_head_width=TRI_WIDTH, single_heads=SINGLE_HEADS)  # fmt: skip


def build_pair() -> tuple[PairformerBlock, torch.nn.Module]:
    """cpbench's block and boltz's layer with the same weights (boltz's from cpbench's)."""
    from boltz.model.layers.pairformer import PairformerLayer

    ours = PairformerBlock(CONFIG)
    theirs = PairformerLayer(C_S, C_Z, num_heads=SINGLE_HEADS, dropout=0.0, pairwise_head_width=TRI_WIDTH,
                             pairwise_num_heads=TRI_HEADS, v2=True)  # fmt: skip
    params = dict(theirs.named_parameters())
    copied = set()
    with torch.no_grad():
        for name, tensor in weight_map(ours).items():
            params[name].copy_(tensor)
            copied.add(name)
    missing = set(params) - copied
    if missing:
        raise RuntimeError(f"boltz parameters with no cpbench counterpart: {sorted(missing)}")
    return ours.eval(), theirs.eval()


def weight_map(block: PairformerBlock) -> dict[str, torch.Tensor]:
    """boltz parameter name -> the cpbench tensor it equals (boltz fuses a and b of the triangle
    updates into one projection: a's rows first)."""
    out: dict[str, torch.Tensor] = {}
    for name in ("tri_mul_out", "tri_mul_in"):
        m = getattr(block, name)
        out |= {f"{name}.norm_in.weight": m.norm_in.weight, f"{name}.norm_in.bias": m.norm_in.bias,
                f"{name}.p_in.weight": torch.cat([m.a_proj.weight, m.b_proj.weight]),
                f"{name}.g_in.weight": torch.cat([m.a_gate.weight, m.b_gate.weight]),
                f"{name}.norm_out.weight": m.norm_out.weight, f"{name}.norm_out.bias": m.norm_out.bias,
                f"{name}.p_out.weight": m.out.weight, f"{name}.g_out.weight": m.gate.weight}  # fmt: skip
    for name in ("tri_att_start", "tri_att_end"):
        m = getattr(block, name)
        out |= {f"{name}.layer_norm.weight": m.norm.weight, f"{name}.layer_norm.bias": m.norm.bias,
                f"{name}.linear.weight": m.bias.weight}  # fmt: skip
        for ours, theirs in (("q", "q"), ("k", "k"), ("v", "v"), ("gate", "g"), ("out", "o")):
            out[f"{name}.mha.linear_{theirs}.weight"] = getattr(m, ours).weight
    for ours, theirs in (("pair_transition", "transition_z"), ("single_transition", "transition_s")):
        m = getattr(block, ours)
        out |= {f"{theirs}.norm.weight": m.norm.weight, f"{theirs}.norm.bias": m.norm.bias,
                f"{theirs}.fc1.weight": m.a.weight, f"{theirs}.fc2.weight": m.b.weight,
                f"{theirs}.fc3.weight": m.out.weight}  # fmt: skip
    m = block.single_attention
    out |= {"pre_norm_s.weight": m.norm_s.weight, "pre_norm_s.bias": m.norm_s.bias,
            "attention.proj_q.weight": m.q.weight, "attention.proj_q.bias": m.q.bias,
            "attention.proj_k.weight": m.k.weight, "attention.proj_v.weight": m.v.weight,
            "attention.proj_g.weight": m.gate.weight, "attention.proj_o.weight": m.out.weight,
            "attention.proj_z.0.weight": m.norm_z.weight, "attention.proj_z.0.bias": m.norm_z.bias,
            "attention.proj_z.1.weight": m.bias.weight}  # fmt: skip
    return out


class Side:
    """One system's step functions on shared inputs s [N, c_s], z [N, N, c_z] (all tokens valid)."""

    def __init__(self, name: str, module: torch.nn.Module, s: torch.Tensor, z: torch.Tensor):
        self.name, self.module = name, module
        self.s, self.z = s.detach().clone().requires_grad_(), z.detach().clone().requires_grad_()
        self.mask = torch.ones(s.shape[0])
        self.layout = PairLayout()

    def call(self) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.module, PairformerBlock):
            return self.module(self.s, self.z, self.mask, self.layout)
        mask = self.mask[None]
        s, z = self.module(self.s[None], self.z[None], mask, mask[:, :, None] * mask[:, None, :])
        return s[0], z[0]

    def forward(self) -> None:
        with torch.no_grad():
            self.call()

    def forward_backward(self, ds: torch.Tensor, dz: torch.Tensor) -> None:
        self.s.grad = self.z.grad = None
        self.module.zero_grad(set_to_none=True)
        s, z = self.call()
        torch.autograd.backward([s, z], [ds, dz])


class InPlaceSide(Side):
    """cpbench's chunked inference form, which writes z's update over z: each step takes a copy."""

    def call(self) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.module(self.s, self.z.detach().clone(), self.mask, self.layout)


def chunked_twin(block: PairformerBlock) -> PairformerBlock:
    """The same block (same weights) with chunked inference on, as workload=fold runs it."""
    twin = PairformerBlock(replace(CONFIG, chunk_size=chunking.AUTO))
    twin.load_state_dict(block.state_dict())
    return twin.eval()


def deviation(plain: Side, chunked: Side) -> float:
    """Largest deviation of the chunked form's outputs from the plain form's, relative to each one's
    largest entry."""
    with torch.no_grad():
        pairs = zip(plain.call(), chunked.call(), strict=True)
        return max(float((a - b).abs().max() / a.abs().max()) for a, b in pairs)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def peak_mib(fn: Callable[[], None]) -> float:
    """Resident-set growth at the peak of fn(): VmHWM after it minus VmRSS before it."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    start = _rss_kib("VmRSS")
    fn()
    return (_rss_kib("VmHWM") - start) / 1024


def check_equal(ours: Side, theirs: Side, ds: torch.Tensor, dz: torch.Tensor) -> float:
    """Largest deviation over outputs, input and weight gradients, relative to each tensor's largest
    entry (absolute below 1e-3: a gradient that is zero in exact arithmetic, as that of the pair
    bias LayerNorm's shift, which softmax cancels, is round-off on both sides)."""
    with torch.no_grad():
        outs = [(a, b) for a, b in zip(ours.call(), theirs.call(), strict=True)]
    ours.forward_backward(ds, dz)
    theirs.forward_backward(ds, dz)
    pairs = outs + [(ours.s.grad, theirs.s.grad), (ours.z.grad, theirs.z.grad)]
    boltz_params = dict(theirs.module.named_parameters())
    grads = {name: p.grad for name, p in boltz_params.items()}
    with torch.no_grad():
        pairs += [(tensor, grads[name]) for name, tensor in weight_map(_grad_view(ours.module)).items()]
        return max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-3)) for a, b in pairs)


def _grad_view(block: PairformerBlock) -> PairformerBlock:
    """A copy of the block whose weights are its gradients, so `weight_map` maps gradients too."""
    view = PairformerBlock(CONFIG)
    with torch.no_grad():
        for p, q in zip(view.parameters(), block.parameters(), strict=True):
            p.copy_(q.grad)
    return view


def measure(n: int, repeats: int, warmup: int) -> dict[str, dict[str, float]]:
    torch.manual_seed(n)
    ours_module, theirs_module = build_pair()
    s, z = torch.randn(n, C_S), torch.randn(n, n, C_Z)
    ds, dz = torch.randn(n, C_S), torch.randn(n, n, C_Z)
    sides = [Side("cpbench", ours_module, s, z), Side("boltz", theirs_module, s, z)]
    err = check_equal(*sides, ds, dz)
    if err > 1e-3:
        raise RuntimeError(f"N={n}: cpbench and boltz disagree (max relative deviation {err:.2e})")
    chunked = InPlaceSide("chunked", chunked_twin(ours_module), s, z)
    err_chunked = deviation(sides[0], chunked)
    if err_chunked > 1e-5:
        raise RuntimeError(f"N={n}: chunked and plain disagree (max relative deviation {err_chunked:.2e})")
    phases = {"fwd": (lambda side: side.forward(), [*sides, chunked]),
              "fwd+bwd": (lambda side: side.forward_backward(ds, dz), sides)}  # fmt: skip
    result: dict[str, dict[str, float]] = {"check": {"max_rel_dev": err, "chunked_rel_dev": err_chunked}}
    for phase, (step, sides) in phases.items():
        for _ in range(warmup):
            for side in sides:
                step(side)
        times: dict[str, list[float]] = {side.name: [] for side in sides}
        for r in range(repeats):
            for side in sides if r % 2 == 0 else sides[::-1]:  # alternate who goes first
                start = time.perf_counter()
                step(side)
                times[side.name].append(time.perf_counter() - start)
        for side in sides:
            side.s.grad = side.z.grad = None
            side.module.zero_grad(set_to_none=True)
        mem = {side.name: peak_mib(lambda side=side, step=step: step(side)) for side in sides}
        for side in sides:
            result.setdefault(side.name, {})[f"{phase} ms"] = statistics.median(times[side.name]) * 1e3
            result[side.name][f"{phase} MiB"] = mem[side.name]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grid-ab", action="store_true", help="also the chunked/plain A/B on a 2x2 grid")
    args = parser.parse_args()
    try:
        import boltz.model.layers.pairformer  # noqa: F401
    except ImportError:
        print(f"vs_boltz: skipped, boltz is not installed ({INSTALL})")
        return
    torch.set_num_threads(args.threads)
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    print("| N | fwd ms cpbench / boltz | ratio | fwd+bwd ms cpbench / boltz | ratio | fwd MiB cpbench / "
          "boltz | ratio | fwd+bwd MiB cpbench / boltz | ratio | max rel dev |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for n in args.n:
        r = measure(n, args.repeats, args.warmup)
        ours, theirs = r["cpbench"], r["boltz"]
        cells = []
        for key in ("fwd ms", "fwd+bwd ms", "fwd MiB", "fwd+bwd MiB"):
            cells.append(f"{ours[key]:.1f} / {theirs[key]:.1f} | {ours[key] / theirs[key]:.2f}x")
        print(f"| {n} | " + " | ".join(cells) + f" | {r['check']['max_rel_dev']:.1e} |", flush=True)
        rows.append((n, r))
    print("\nThe A/B, cpbench's chunked inference form against its plain form (forward, no grad):\n")
    print("| N | fwd ms chunked / plain | ratio | fwd MiB chunked / plain | ratio | max rel dev |")
    print("|---|---|---|---|---|---|")
    for n, r in rows:
        chunked, plain = r["chunked"], r["cpbench"]
        cells = [
            f"{chunked[k]:.1f} / {plain[k]:.1f} | {chunked[k] / plain[k]:.2f}x" for k in ("fwd ms", "fwd MiB")
        ]
        print(f"| {n} | " + " | ".join(cells) + f" | {r['check']['chunked_rel_dev']:.1e} |")
    print(
        f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, fp32, B=1; "
        f"median of {args.repeats}; python {sys.version.split()[0]}"
    )
    if args.grid_ab:
        grid_ab(args.n, args.repeats, args.warmup)


def grid_ab(sizes: list[int], repeats: int, warmup: int) -> None:
    """The chunked/plain inference A/B on a 2d 2x2 grid: one spawn per point, plain and chunked in
    turn (the first alternating with N)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from pairformer_cpu import run_point

    print("\nThe A/B on a 2d 2x2 grid (inference, gloo, 1 thread per rank):\n")
    print("| N | step ms chunked / plain | ratio | activation MiB per rank chunked / plain | ratio |")
    print("|---|---|---|---|---|")
    for i, n in enumerate(sizes):
        forms = [None, chunking.AUTO] if i % 2 == 0 else [chunking.AUTO, None]
        p = {c: run_point("2d", 4, (2, 2), n, False, warmup, repeats, 900, chunk_size=c) for c in forms}
        chunked, plain = p[chunking.AUTO], p[None]
        cells = [
            f"{chunked[k]:.1f} / {plain[k]:.1f} | {chunked[k] / plain[k]:.2f}x"
            for k in ("step_ms", "activation_mib")
        ]
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
