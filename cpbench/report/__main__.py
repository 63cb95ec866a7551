"""`python -m cpbench.report <dirs...> [--out DIR] [--publish [DOCS_DIR]]`: merge runs on demand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from cpbench.report.merge import DOCS_DIR, collect, default_out, publish, write


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cpbench.report",
        description="Merge cpbench runs (sweep folders or run folders) into one results.csv and "
        "cp_benchmark.md with plots; list the runs that failed.",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep folders (their job folders) or run folders")
    parser.add_argument(
        "--out", type=Path, help="where the merge goes (default: the sweep folder, when one is given)"
    )
    parser.add_argument(
        "--publish",
        nargs="?",
        const=DOCS_DIR,
        type=Path,
        metavar="DOCS_DIR",
        help=f"also write cp_benchmark.md, cp_benchmark.csv and the plots there (default: {DOCS_DIR})",
    )
    args = parser.parse_args(argv)
    for folder in args.dirs:
        if not folder.is_dir():
            parser.error(f"{folder}: no such folder")
    out = args.out or default_out(args.dirs)
    if out is None and args.publish is None:
        parser.error("several folders, or a run folder, were given: name where the merge goes (--out)")
    try:
        merged = collect(args.dirs)
        written = [write(merged, out)] if out is not None else []
        if args.publish is not None:
            written.append(publish(args.dirs, args.publish).report)
    except ValueError as err:
        parser.error(str(err))
    print(f"merged {len(merged.frame)} row(s) from {len(merged.runs)} run(s)", file=sys.stderr)
    for run in merged.failed:
        print(f"  {run.name}: {run.error}", file=sys.stderr)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
