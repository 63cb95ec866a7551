"""Write an input's features once, as a feature file, for reuse and inspection:

    python -m cpbench.inputs.convert examples/inputs/msa_ligand.json msa_ligand.npz [--seed 0]

IN is anything `data.path` takes (AlphaFold3 .json, Boltz .yaml, .npz, torch file); `--seed` draws the
ligand conformers as a run with that `seed` would. The written file is read back and must give the
same features; the command prints the input's name, N_tokens, N_atoms, S and chain count.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from cpbench.inputs.contract import FeatureError
from cpbench.inputs.files import load_features, save_features


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cpbench.inputs.convert", description=__doc__.split("\n")[0]
    )
    parser.add_argument("input", help="an AlphaFold3 .json, a Boltz .yaml, or a feature file")
    parser.add_argument("out", help="the .npz file to write")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed: ligand conformers (default 0)")
    args = parser.parse_args(argv)
    if not args.out.endswith(".npz"):
        parser.error(f"OUT={args.out}: must end in .npz")
    try:
        features = load_features(args.input, seed=args.seed)
        save_features(features.arrays, args.out, name=features.name)
        back = load_features(args.out)
    except (FeatureError, OSError) as err:
        print(f"cpbench.inputs.convert: error: {err}", file=sys.stderr)
        return 2
    for key, values in features.arrays.items():
        if not np.array_equal(values, back.arrays[key]):
            print(
                f"cpbench.inputs.convert: error: {args.out}: feature '{key}' reads back changed",
                file=sys.stderr,
            )
            return 1
    shape = features.shape
    print(
        f"{args.out}: {features.name}: N_tokens={shape.n_tokens} N_atoms={shape.n_atoms} S={shape.msa_depth} "
        f"chains={features.n_chains}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
