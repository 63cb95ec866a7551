"""What the tests share, imported by name (`from support.processes import cpbench, ok`): no test file
imports another, nor tests/conftest.py, which holds only pytest's hooks and fixtures. pyproject's
`pythonpath = ["tests"]` puts this package (and tests/adapters) on the import path.

- processes: cpbench through its real entry points (`cpbench`, `torchrun`, `run_cmd`; `refused`, main()
  in the test process; `rank_processes`, the forkserver the launches and ranks come from), the settings
  every launch starts from (`BASE`, `TIMING`, `FAST`), a run's results read back (`results`, `ok`,
  `one_line_exit_2`), `wait_for` a run's state, and `TESTS`, the tests' folder (every process a test
  starts has it on its PYTHONPATH, for tests/adapters).
- settings: a run's settings composed in-process as `python -m cpbench` composes them (`settings`,
  typed and checked; `composed`, the schema's objects alone).
- run_inputs: what the tests hand a run: the example feature file, the told adapter, the tests'
  experiment plans (tests/plans/), the loopback interface.
- cp_ranks: real gloo ranks on the project's mesh, spawned from a test (`spawn`, `rank_context`,
  `one_rank`, `loss_and_grads`, `report`).
- pairformer_checks: the Pairformer's one-rank-versus-CP checks a rank runs (`Checks`), its byte
  formulas (`expected_bytes`) and the tests' sizes.
- msa_inputs: the MSA module's test sizes and inputs.
- tiny_fold: the tests' tiny fold model (`TINY`; as overrides, `SIZES`) and its checks against one rank.
- rank_timings: fixed per-rank timings and the point's figures they reduce to.
- report_folders: run folders written with the store's writers, every figure of their readout known.
- probe_runs: the probe's settings in the tests and the checks of its records.
- slurm_cluster: the private SLURM cluster the SLURM tests start (tests/conftest.py's fixtures).
- slurm_jobs: a SLURM or submitit job as the tests read it, and the slow workloads a test interrupts.
- flops_expected: the FLOP counts the tests expect, written down by hand.
- path_matrix: the cells of the path matrix (workflow x layout x baseline x mode x probe).
"""
