"""`python -m cpbench.calibrate`: a run at small N (cp=2 and its cp=1 baseline by default), then the
time model's figures for this machine fitted to it, in output_dir/calibration.yaml (docs/predict.md).
The run's own overrides come after these defaults and win."""

from __future__ import annotations

import sys

from cpbench.__main__ import main

# A CPU cap that keeps fold_small's chunk loops whole at these N, as the count's forms run them
# (docs/predict.md): under the default 0.03 GiB the steps run many small chunks, whose per-run costs the
# count leaves out, and the calibration's own points came out 16-31 % under their measured steps.
DEFAULTS = ["sweep.n_tokens=[32,64,96,128]", "probe.enabled=false", "memory.cpu_budget_gib=4"]

if __name__ == "__main__":
    sys.argv[1:1] = DEFAULTS
    sys.argv.append("command=calibrate")
    main()
