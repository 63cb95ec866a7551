"""Model math for cpbench's built-in workloads, written once for one rank and reused by its CP layouts."""
