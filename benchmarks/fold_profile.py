"""Where a fold step spends its time: one step of the fold workload under torch.profiler, on CPU.

    python benchmarks/fold_profile.py                           # fold_small, N 128, inference, one rank
    python benchmarks/fold_profile.py --grid 2 2 --workflow training

One rank runs in this process; a grid of ranks is spawned (gloo, a FileStore rendezvous), rank 0
profiled, every rank stepping in lockstep. One warm-up step, then one profiled step (training:
forward, loss and backward). Prints the top aten ops by self CPU time and the share of the step
each takes, and the top op labels (`cpbench.distributed.comm.CLOCK`: wall time inside each label;
autograd's backward runs outside the labels), so docs/fold.md can list the hot spots.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from hydra import compose, initialize_config_module
from hydra.utils import instantiate
from torch.profiler import ProfilerActivity, profile

from cpbench.core import RankContext, Shape, Topology
from cpbench.distributed.comm import CLOCK
from cpbench.runtime.mesh import build_mesh
from cpbench.settings.schema import register


def _context(rank: int, world: int, grid: tuple[int, int]) -> RankContext:
    if world == 1:
        one = Topology("1d", 1, (1, 1))
        return RankContext(0, 1, torch.device("cpu"), None, one, torch.float32, 0, (0, 0), None, None)
    topology = Topology("2d" if grid[1] > 1 else "1d", world, grid)
    mesh, coords, (row_peers, col_peers) = build_mesh(topology, "cpu")
    return RankContext(rank, world, torch.device("cpu"), mesh, topology, torch.float32, 0, coords,
                       row_peers, col_peers)  # fmt: skip


def profile_step(rank: int, world: int, args: argparse.Namespace, out: str) -> None:
    """One warm-up step, then one profiled step; rank 0 writes the table to `out`."""
    try:
        torch.set_num_threads(args.threads)
        if world > 1:
            store = dist.FileStore(os.path.join(os.path.dirname(out), "store"), world)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=600))  # fmt: skip
        register()
        with initialize_config_module("cpbench.configs", version_base=None):
            cfg = compose("config", [f"workload={args.workload}"])
        workload = instantiate(cfg.workload)
        ctx = _context(rank, world, tuple(args.grid))
        model = workload.build_model(ctx)
        batch = workload.build_batch(Shape(args.n, args.atoms_per_token * args.n, args.msa_depth), ctx)
        train = args.workflow == "training"

        def step() -> None:
            loss = workload.run_step(model, batch, train)
            if train:
                loss.backward()

        step()
        CLOCK.seconds.clear()
        CLOCK.enabled = True
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
        finally:
            CLOCK.enabled = False
        if rank == 0:
            events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
            total = sum(e.self_cpu_time_total for e in events)
            lines = ["| op | self CPU ms | share | calls |", "|---|---|---|---|"]
            for e in events[: args.top]:
                share = e.self_cpu_time_total / total
                lines.append(f"| `{e.key}` | {e.self_cpu_time_total / 1e3:.1f} | {share:.1%} | {e.count} |")
            lines.append(
                f"\nstep self CPU total {total / 1e3:.0f} ms (rank 0); by op label (wall, "
                "exclusive of nested labels, backward under .bwd where a label recomputes):\n"
            )
            lines += ["| op label | ms | share |", "|---|---|---|"]
            labels = sorted(CLOCK.seconds.items(), key=lambda kv: -kv[1])
            wall = sum(CLOCK.seconds.values())
            lines += [f"| {name} | {s * 1e3:.1f} | {s / wall:.1%} |" for name, s in labels[: args.top]]
            Path(out).write_text("\n".join(lines))
    except Exception:
        if rank == 0:
            Path(out).write_text("error\n" + traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="fold_small")
    parser.add_argument("--workflow", default="inference", choices=["inference", "training"])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--atoms-per-token", type=int, default=9)
    parser.add_argument("--msa-depth", type=int, default=16)
    parser.add_argument("--grid", type=int, nargs=2, default=[1, 1], metavar=("ROWS", "COLS"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    world = args.grid[0] * args.grid[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "table.md")
        if world == 1:
            profile_step(0, 1, args, out)
        else:
            context = mp.get_context("spawn")
            procs = [context.Process(target=profile_step, args=(r, world, args, out)) for r in range(world)]
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join()
        print(f"{args.workload} {args.workflow} N={args.n} grid {args.grid[0]}x{args.grid[1]}, "
              f"{args.threads} thread(s) per rank:\n")  # fmt: skip
        print(Path(out).read_text() if os.path.exists(out) else "no table (a rank failed)")


if __name__ == "__main__":
    main()
