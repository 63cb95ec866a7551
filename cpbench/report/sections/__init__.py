"""The sections of cp_benchmark.md, one module each; each renders its lines from typed inputs (the
run record, the results rows, the analysis) and knows nothing of the others."""
