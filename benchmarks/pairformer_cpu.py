"""CPU/gloo benchmark of the pairformer workload: per-rank peak memory, bytes sent per rank per
block and step time, for one rank, 1d (cp 2, 4) and 2d (2x2), with reduced channels.

    python benchmarks/pairformer_cpu.py                       # N 128 and 256, training and inference
    python benchmarks/pairformer_cpu.py --n 64 --workflow inference --repeats 1

Each point spawns its ranks (gloo, a FileStore rendezvous), builds the workload as the driver does
and runs warm-up then timed steps through the driver's StepRunner (training: forward, loss,
backward, summed replicated gradients, AdamW). Memory, per rank, for one step:
- activation peak: the most bytes of tensor storage alive at once among those allocated during
  the step (a dispatch-mode tracker: weights, inputs and optimizer state made before the step
  are not counted, gradients and every transient are);
- RSS peak: VmHWM minus the resident set at the step's start (glibc told to return large blocks,
  so freed tensors leave the resident set).
Bytes: the comm ledger's pairformer op labels (backward included), divided by the blocks; the
gradient all-reduce is reported apart. Step time: median over repeats of the slowest rank, with
`--threads` torch threads per rank (default 1: on a small shared machine more threads thrash);
ranks share the machine's cores, so times across cp sizes are not a scaling measurement there.
Prints Markdown tables and checks the two targets of docs/pairformer.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import traceback
import weakref
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cpbench.core import RankContext, Shape, Topology
from cpbench.distributed.comm import LEDGER
from cpbench.measure.step import StepRunner
from cpbench.models.pairformer import OP_LABELS
from cpbench.runtime.mesh import build_mesh
from cpbench.workloads.pairformer import PairformerWorkload

REDUCED = dict(c_s=64, c_z=32, n_blocks=1, tri_mul_hidden=32, tri_heads=4, tri_head_width=8, single_heads=4)
TOPOLOGIES = [("1d", 1, (1, 1)), ("1d", 2, (2, 1)), ("1d", 4, (4, 1)), ("2d", 4, (2, 2))]


class LiveTensorPeak(TorchDispatchMode):
    """Peak bytes of tensor storage alive at once, counting storages created while active."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._track(t.untyped_storage())
        return out

    def _track(self, storage) -> None:
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in self.sizes:
            return
        self.sizes[key] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self.sizes.pop(key, 0)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _rank(rank: int, world: int, tmp: str, kind: str, grid, n: int, train: bool, warmup: int, repeats: int,
          threads: int, chunk_size: str | None):  # fmt: skip
    result: dict = {}
    try:
        torch.set_num_threads(threads)
        store = dist.FileStore(os.path.join(tmp, "store"), world)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=600)
        )
        topology = Topology(kind, world, grid)
        mesh, coords, (row_peers, col_peers) = build_mesh(topology, "cpu")
        ctx = RankContext(rank, world, torch.device("cpu"), mesh, topology, torch.float32, 0, coords,
                          row_peers, col_peers)  # fmt: skip
        workload = PairformerWorkload(**REDUCED, chunk_size=chunk_size)
        model = workload.build_model(ctx)
        batch = workload.build_batch(Shape(n_tokens=n, n_atoms=0, msa_depth=1), ctx)
        runner = StepRunner(workload, model, train, ctx, lr=1e-4, weight_decay=0.0)
        for _ in range(warmup):
            runner(batch)
        # One step under the trackers: memory and bytes.
        dist.barrier()
        Path("/proc/self/clear_refs").write_text("5")
        rss_start = _rss_kib("VmRSS")
        LEDGER.reset()
        with LiveTensorPeak() as tracker:
            runner(batch)
        rss_peak = _rss_kib("VmHWM") - rss_start
        ops = {k: v for k, v in LEDGER.bytes_sent.items() if k.startswith("pairformer.")}
        result.update(
            activation_mib=tracker.peak / 2**20,
            rss_mib=rss_peak / 1024,
            block_mib=sum(ops.values()) / REDUCED["n_blocks"] / 2**20,
            grad_sync_mib=(LEDGER.bytes_sent.get("grad_sync", 0)) / 2**20,
            per_op={k: v / REDUCED["n_blocks"] for k, v in ops.items()},
        )
        # Timed steps, without trackers: the slowest rank's time per repeat.
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            runner(batch)
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times.append(float(elapsed))
        result["step_ms"] = statistics.median(times) * 1e3
    except Exception:
        result["error"] = traceback.format_exc()
    finally:
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(result))
        if dist.is_initialized():
            dist.destroy_process_group()


def run_point(
    kind: str,
    cp: int,
    grid,
    n: int,
    train: bool,
    warmup: int,
    repeats: int,
    timeout: float,
    threads: int = 1,
    chunk_size: str | None = None,
) -> dict:
    """Spawn the ranks of one point (`chunk_size`: the workload's; null, the plain form); return the max
    over ranks of each measure."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")  # freed tensors leave the resident set
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        args = (cp, tmp, kind, grid, n, train, warmup, repeats, threads, chunk_size)
        procs = [context.Process(target=_rank, args=(rank, *args)) for rank in range(cp)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        ranks = []
        for rank in range(cp):
            path = Path(tmp, f"rank{rank}.json")
            ranks.append(
                json.loads(path.read_text()) if path.exists() else {"error": "no report (timed out?)"}
            )
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        raise RuntimeError(f"{kind} cp={cp} N={n}: {errors[0]}")
    point = {key: max(r[key] for r in ranks) for key in ("activation_mib", "rss_mib", "block_mib", "step_ms")}
    point["grad_sync_mib"] = max(r["grad_sync_mib"] for r in ranks)
    point["per_op"] = {op: max(r["per_op"].get(op, 0) for r in ranks) for op in ranks[0]["per_op"]}
    return point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[128, 256])
    parser.add_argument(
        "--workflow", nargs="+", default=["training", "inference"], choices=["training", "inference"]
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--json", type=Path, help="also write every point here")
    args = parser.parse_args()
    rows, per_op, targets = [], [], []
    for workflow in args.workflow:
        for n in args.n:
            base = None
            points = {}
            for kind, cp, grid in TOPOLOGIES:
                p = run_point(
                    kind, cp, grid, n, workflow == "training", args.warmup, args.repeats, args.timeout
                )
                points[(kind, cp)] = p
                base = base or p
                label = "1" if cp == 1 else (f"1d {cp}" if kind == "1d" else f"2d {grid[0]}x{grid[1]}")
                rows.append(
                    f"| {workflow} | {n} | {label} | {p['activation_mib']:.1f} | "
                    f"{p['activation_mib'] / base['activation_mib']:.3f} | {p['rss_mib']:.0f} | "
                    f"{p['block_mib']:.2f} | {p['grad_sync_mib']:.3f} | {p['step_ms']:.0f} |"
                )
                per_op.append((workflow, n, label, p["per_op"]))
                print(rows[-1], flush=True)
            two_d, one_d = points[("2d", 4)], points[("1d", 4)]
            ratio = two_d["activation_mib"] / base["activation_mib"]
            met = ratio <= 1.25 / 4
            targets.append(f"{workflow} N={n}: 2d 2x2 activation peak {ratio:.3f} of cp=1 "
                           f"(target <= {1.25 / 4:.4f}): {'met' if met else 'MISSED'}")  # fmt: skip
            met = two_d["block_mib"] < one_d["block_mib"]
            targets.append(f"{workflow} N={n}: MiB per block 2d 2x2 {two_d['block_mib']:.2f} vs 1d 4 "
                           f"{one_d['block_mib']:.2f}: {'met' if met else 'MISSED'}")  # fmt: skip
    print()
    print("| workflow | N | cp | activation peak MiB | / cp=1 | RSS peak MiB | MiB sent per block | "
          "grad all-reduce MiB | step ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    ops = [op for op in OP_LABELS if any(op in table or op + ".bwd" in table for *_, table in per_op)]
    print("MiB sent per rank per block, forward / backward:")
    print()
    print("| workflow | N | cp | " + " | ".join(op.removeprefix("pairformer.") for op in ops) + " |")
    print("|---|---|---|" + "---|" * len(ops))
    for workflow, n, label, table in per_op:
        cells = [f"{table.get(op, 0) / 2**20:.2f} / {table.get(op + '.bwd', 0) / 2**20:.2f}" for op in ops]
        print(f"| {workflow} | {n} | {label} | " + " | ".join(cells) + " |")
    print()
    print("\n".join(targets))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "per_op": per_op, "targets": targets}, indent=1))


if __name__ == "__main__":
    main()
