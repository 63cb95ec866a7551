"""Write a feature file from a description of chains and their lengths:

    python -m cpbench.inputs.make_example --chains A:protein:180,B:rna:60,L:ligand:12 \\
        --msa-depth 32 --out examples/complex_252.npz

The file follows the inventory contract (docs/inputs.md) and runs with `data.path=<file>`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from cpbench.core import Shape, Topology
from cpbench.inputs.chains import parse_chains
from cpbench.inputs.contract import MOL_TYPES
from cpbench.inputs.files import load_features, save_features
from cpbench.inputs.shard import FoldShard
from cpbench.inputs.synth import synthesize

ONE_RANK = Topology(kind="1d", cp=1, grid=(1, 1))


def whole_features(shard: FoldShard) -> dict[str, np.ndarray]:
    """The features of a one-rank shard, padding stripped, as arrays for a feature file."""
    if shard.topology.grid != (1, 1):
        raise ValueError(f"whole_features needs a one-rank shard, got grid {shard.topology.grid}")
    n, m = shard.n_tokens, shard.n_atoms
    arrays = {name: t[:n].numpy() for name, t in shard.row_tokens.items()}
    arrays |= {name: t[:m].numpy() for name, t in shard.atoms.items()}
    arrays |= {name: t[:, :n].numpy() for name, t in shard.msa.items()}
    arrays["token_bonds"] = shard.pair["token_bonds"][:n, :n].numpy()
    return arrays


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cpbench.inputs.make_example", description=__doc__.split("\n")[0]
    )
    kinds = ", ".join(MOL_TYPES)
    parser.add_argument(
        "--chains", required=True, help=f"NAME:TYPE:LENGTH[xCOPIES],... with TYPE one of {kinds}"
    )
    parser.add_argument("--out", required=True, help="the .npz file to write")
    parser.add_argument("--msa-depth", type=int, default=32, help="MSA rows, the query first (default 32)")
    parser.add_argument("--atoms-per-token", type=int, default=9, help="mean atoms per token (default 9)")
    parser.add_argument("--atom-spread", type=int, default=None, help="atoms per token vary by +- this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.out.endswith(".npz"):
        parser.error("--out must end in .npz")
    try:
        chains = parse_chains(args.chains)
    except ValueError as err:
        parser.error(str(err))
    shape = Shape(
        n_tokens=chains.n_tokens, n_atoms=args.atoms_per_token * chains.n_tokens, msa_depth=args.msa_depth
    )
    shard = synthesize(shape, ONE_RANK, (0, 0), args.seed, atom_spread=args.atom_spread, chains=chains)
    save_features(whole_features(shard), args.out)
    features = load_features(args.out)  # the file must pass the contract it is an example of
    sizes = f"N_tokens={features.n_tokens} N_atoms={features.n_atoms} S={features.msa_depth}"
    print(f"{args.out}: {len(chains.names)} chains, {sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
