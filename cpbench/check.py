"""`python -m cpbench.check DIR...`: one line per rule, exit 0 only if none fails (2: nothing to check)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cpbench.checks.compliance import check, passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cpbench.check",
        description="Check run folders, sweep folders or a published report (a .md) against cpbench's rules.",
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    try:
        verdicts = check(args.paths)
    except (FileNotFoundError, ValueError) as err:
        print(f"cpbench.check: error: {err}", file=sys.stderr)
        return 2
    for verdict in verdicts:
        print(verdict.line())
    ok = passed(verdicts)
    print("all rules pass" if ok else f"{sum(v.status == 'fail' for v in verdicts)} rule(s) fail")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
