"""`python -m cpbench.forecast`: predicted step and job times at any N and CP size, and the planning
table, from a machine's figures (`forecast.hardware`: a preset, or a calibration file that
`python -m cpbench.calibrate` wrote), without starting a rank (docs/predict.md)."""

from __future__ import annotations

import sys

from cpbench.__main__ import main

if __name__ == "__main__":
    sys.argv.append("command=forecast")
    main()
