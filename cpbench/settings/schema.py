"""Typed structured configs: every config key, so a bad override is rejected by name. The comment beside
each field is its description in docs/settings.md (python -m cpbench.settings.reference)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from cpbench.settings.slurm import SlurmConfig


class Command(Enum):
    """What one call does (cpbench/app/commands.py): each `python -m cpbench.<command>` sets its own."""

    measure = "measure"  # the points and the probe (python -m cpbench)
    predict = "predict"  # the fake-tensor memory estimate alone: no rank starts
    forecast = "forecast"  # the time model's predicted steps: no rank starts
    calibrate = "calibrate"  # measure, then the time model's figures fitted to the run


class Workflow(Enum):
    inference = "inference"  # the forward (with sampling where the workload has it), no autograd
    training = "training"  # forward, backward and the optimizer step, each phase timed
    # K training steps on a fresh batch each, loss and gradient norm per step (docs/convergence.md).
    convergence = "convergence"


class Mode(Enum):
    speed = "speed"  # seeds fixed, deterministic algorithms off, warm-up until the step time settles
    accuracy = "accuracy"  # deterministic algorithms, fixed step counts, checked against a cp=1 run


class DType(Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass
class TopologyConfig:
    """How the CP ranks split the pair representation."""

    kind: str = "1d"  # "1d": CP ranks shard token rows; "2d": a rows x cols grid shards both pair axes
    cp: int = 1  # the number of CP ranks, one device each
    grid: list[int] | None = None  # [rows, cols] for 2d; null: the squarest factorisation of cp


@dataclass
class ShapeConfig:
    """One input size: what a null `sweep.*` entry takes, the probe's atoms and MSA, and the one shape
    of workflow=convergence."""

    n_tokens: int = 256  # N_tokens
    n_atoms: int | None = None  # null: atoms_per_token * n_tokens
    atoms_per_token: int = 9  # N_atoms per token where n_atoms is null (about 9 for protein crops)
    msa_depth: int = 16  # MSA rows


@dataclass
class SweepConfig:
    """The walltime points: the product of these lists (null entries take `shape.*`, or the workload's)."""

    n_tokens: list[int] = field(default_factory=lambda: [128, 256])  # N_tokens of the points
    n_atoms: list[Any] = field(default_factory=lambda: [None])  # N_atoms of the points
    msa_depth: list[Any] = field(default_factory=lambda: [None])  # MSA depths of the points
    # Diffusion samples per trunk pass (a workload with a diffusion batch, fold): null takes the
    # workload's `diffusion_samples` for the workflow, as the probe's and a convergence run's shape do.
    diffusion_samples: list[Any] = field(default_factory=lambda: [None])


@dataclass
class DataConfig:
    """A real input instead of synthesized ones (docs/inputs.md)."""

    # A feature file (.npz or torch) or a complex (AlphaFold3 .json, Boltz .yaml) following docs/inputs.md;
    # it replaces the sweep with its one shape.
    path: str | None = None
    msa_depth: int | None = None  # a cap on the input's MSA rows (null: all of them)


@dataclass
class ProbeConfig:
    """The search for the largest N_tokens that fits (docs/probe.md)."""

    enabled: bool = False  # run the probe after the walltime points
    start: int = 512  # the ramp's first N
    factor: float = 2.0  # the ramp multiplies N by this while steps fit (> 1)
    granularity: int = 64  # bisection stops once the largest fit and the first failure are this close
    max_tokens: int | None = None  # no N above this is tried; null: no cap
    measure_at_max: bool = True  # then the full walltime measurement at the largest N that fits
    guided: bool = True  # propose N from a fit of peak memory in N where it fits well
    # Estimate the per-rank peak on fake tensors first (docs/probe.md) and start the real steps at
    # the N it predicts fits the budget: one step there, one just above it, bisection only if it was off.
    predict: bool = False
    # Steps run at each N before its measured probe step, untimed, the peak reset after them: what a
    # compiled model pays once (compilation, autotuning) is not the step's time or memory.
    warmup: int = 0


@dataclass
class TimingConfig:
    """Floors and caps of the step counts. In speed mode the warm-up goes on past `warmup` until the
    step time stops falling (neither of the last 2 steps `settle_pct` % faster than the fastest before
    them; at most `warmup_max` steps), and the
    timed repeats past `repeats` while their IQR is over `iqr_pct` % of the median (at most
    `repeats_max`). A cap equal to its floor fixes the count; accuracy mode always fixes both."""

    warmup: int = 3  # discarded warm-up steps per point, at least (>= 1)
    repeats: int = 5  # timed steps per point, at least
    warmup_max: int = 10  # speed mode: warm-up steps at most
    repeats_max: int = 10  # speed mode: timed steps at most
    # speed mode: the warm-up goes on while one of the last 2 steps is over this % faster than the
    # fastest step before them
    settle_pct: float = 5.0
    iqr_pct: float = 10.0  # speed mode: more repeats while the IQR is over this % of the median


@dataclass
class AccuracyConfig:
    """mode=accuracy: each point's checked quantities against the cp=1 run of the same config."""

    # Relative tolerance across CP layouts (their reduction orders differ); null: by dtype, 1e-5 for
    # float32 and 1e-2 for bfloat16/float16 (cpbench/checks/accuracy.py). The same layout (a cp=1
    # run) must agree bit for bit.
    rtol: float | None = None


@dataclass
class BudgetConfig:
    """The time budget of a run (docs/budget.md): over it, only repeats, sweep points and the probe's
    granularity are trimmed; a plan that cannot fit without changing the job runs nothing."""

    minutes: float | None = 8.0  # on CPU, the whole command's: the cp=1 baseline plans for half; null: none
    # On CUDA devices instead of `minutes`: null (no budget), since a GPU-sized job is not refused or
    # trimmed by a default sized for the CPU preset (docs/budget.md).
    cuda_minutes: float | None = None
    min_repeats: int = 3  # the floor repeats are never trimmed below


@dataclass
class ForecastConfig:
    """The time model (docs/predict.md): `python -m cpbench.calibrate` fits a machine's figures to its
    own points, `python -m cpbench.forecast` predicts step and job times from them."""

    # The machine's figures: a file `python -m cpbench.calibrate` wrote, or a datasheet preset of
    # configs/hardware/ (h100_sxm, h200_sxm).
    hardware: str | None = None
    n_tokens: list[int] | None = None  # the N to predict at; null: sweep.n_tokens
    cp: list[int] | None = None  # the CP sizes to predict at, of topology.kind; null: topology.cp
    ranks_per_node: int | None = None  # the ranks a node; null: the machine's devices a node
    # The planning table's target N: for each, the smallest CP size that fits (the memory estimate)
    # in 1d and in 2d, with its predicted step; empty: no table.
    plan_n_tokens: list[int] = field(default_factory=list)
    plan_max_cp: int = 64  # the largest CP size the planning table tries (powers of two up to it)
    # A run folder, or a glob pattern of several runs (each point's median over them): each measured
    # row beside its prediction, and the error.
    against: str | None = None
    # python -m cpbench.calibrate: earlier runs of its configuration (a folder or a glob pattern) whose
    # points pool with its own, each point's step the median over the runs (docs/predict.md).
    pool: str | None = None


@dataclass
class ConvergenceConfig:
    """workflow=convergence: `steps` training steps at `shape.*`, a new batch per step from (seed, step)."""

    steps: int = 100  # training steps in the curve
    # Curves equal within these (float64 compare of fp32 runs): reductions run in another order at cp>1.
    rtol: float = 1e-4
    atol: float = 1e-6  # the absolute tolerance beside rtol
    # A convergence.csv to compare against; null: the reference curve of this configuration under
    # docs/reference/, when there is one.
    reference: str | None = None


@dataclass
class CheckpointConfig:
    """workflow=convergence: torch.distributed.checkpoint saves under output_dir/checkpoints/."""

    # Save model, optimizer, step and RNG state every this many convergence steps (0: never); a run
    # that finds a checkpoint in output_dir resumes from the last one.
    every: int = 0


@dataclass
class MeasureConfig:
    """What a point measures beside its walltime and peak memory (docs/measurement.md)."""

    # comm_ms from the torch profiler (any model's collectives, at the profiler's overhead): gloo's
    # spans on CPU, the NCCL kernels' device time on a GPU (blank where its trace cannot tell), instead
    # of cpbench's ledger, which sees only cpbench.distributed.comm.
    profile_comm: bool = False
    # Model FLOPs per step counted on fake tensors once per point's shape, outside the timed steps
    # (model_tflop, tflops_per_rank, mfu); false skips the count (the columns stay blank).
    count_flops: bool = True
    # The dense peak TFLOP/s of one rank's device that MFU divides by; null: the datasheet table's for
    # the device and precision (cpbench/record/peaks.py), or on CPU a GEMM measured before the points.
    peak_tflops: float | None = None


@dataclass
class MemoryConfig:
    """The per-rank memory cap a step must fit under (docs/probe.md, "Budgets")."""

    budget_gib: float | None = None  # per-rank cap; null: on a GPU the card less what a rank holds
    # On CPU with budget_gib null: the machine's RAM is no device memory worth probing to its end.
    cpu_budget_gib: float | None = 2.0
    # The CUDA caching allocator's settings for the ranks (PYTORCH_CUDA_ALLOC_CONF, e.g.
    # expandable_segments:True), set in each rank before CUDA starts; null: as the environment has it,
    # and on a GPU expandable_segments:True where it has neither variable. Every run records what its
    # ranks ran with.
    alloc_conf: str | None = None


@dataclass
class DistConfig:
    """The ranks' process group."""

    backend: str | None = None  # null: nccl with CUDA devices, gloo otherwise
    timeout_s: float = 300.0  # bounds every collective: a lone failing rank cannot hang its peers longer
    # After an out-of-memory error inside a step, how long a rank waits for its peers to agree before
    # it ends the job (they are stuck in a collective it will not join); the run restarts and resumes.
    agree_timeout_s: float = 10.0
    # CPU: intra-op threads per rank; null: the cores over the CP run's ranks on the machine. A cp=1
    # baseline takes its CP run's count, so that each rank is one equal "device" at every CP size.
    cpu_threads: int | None = None
    # The network interface(s) every rank's process groups bind to, comma-separated exact names (e.g.
    # eth0, or ib0,ib1): set in each rank, before its groups start, as GLOO_SOCKET_IFNAME and (with
    # NCCL's `=` for exact names) NCCL_SOCKET_IFNAME. For nodes whose host name resolves to an address
    # the others cannot reach (docs/cluster.md); null: as the environment has them.
    socket_ifname: str | None = None


@dataclass
class LaunchConfig:
    """Ranks launched by cpbench itself (`python -m cpbench topology.cp=N`)."""

    # Relaunches of local ranks after a crash (a killed rank, a collective timeout); the run resumes.
    # torchrun's is its --max-restarts, a SLURM job's slurm.max_requeues.
    max_restarts: int = 3


@dataclass
class FaultConfig:
    """Fault injection, for testing the never-hang guarantees; off unless `rank` is set."""

    rank: int | None = None  # the rank that fails; null: no fault
    at_n: int | None = None  # strike at N_tokens >= at_n
    where: str = "step"  # batch: before the step's first collective; step: between two collectives
    # oom: a real failing allocation; kill: SIGKILL; overrun (CPU): 1 GiB resident outside the cap,
    # a peak over the budget that no failing allocation reports; perturb: every module output on the
    # rank scaled by 1 + 1e-4 in every step (a wrong answer for mode=accuracy to catch); kernel: the
    # error torch raises after a kernel's illegal memory access, its class and words
    kind: str = "oom"
    # workflow=convergence: strike before this step (at_n is not used) in a run that did not resume
    # from a checkpoint, so a resumed run goes past it.
    at_step: int | None = None


@dataclass
class OptimConfig:
    """The AdamW step of native training (a foldcp module steps its own optimizer)."""

    lr: float = 1e-4  # learning rate
    weight_decay: float = 0.0  # AdamW's decoupled weight decay


@dataclass
class LogConfig:
    """What a run prints and logs (output_dir/logs/)."""

    all_ranks: bool = False  # ranks other than 0 stay quiet unless set
    progress: bool = True  # the progress bar on rank 0
    heartbeat_s: float | None = 30.0  # rank 0 says what it measures this often (null: never)


@dataclass
class BenchConfig:
    command: Command = Command.measure  # set by the entry point (python -m cpbench.predict, ...)
    # The model benchmarked: a config group (configs/workload/), or any class with the three hooks
    # (workload._target_=pkg.mod.Class, docs/adapters.md).
    workload: Any = MISSING
    # The label of the workload's rows (`preset`): empty takes the config-group choice (workload=...).
    workload_preset: str = ""
    workflow: Workflow = Workflow.inference  # what one step is
    mode: Mode = Mode.speed  # how a point is measured (docs/measurement.md, "Modes")
    # >= 2: the configuration's points run this many times in all (this run, then the rest as short
    # sub-runs without the probe), and the spread of each figure is recorded (run.json, the report).
    repeat_check: int = 0
    # The run's precision, given to the workload (ctx.dtype); fold and pairformer run bfloat16 as
    # autocast over float32 weights, and refuse float16.
    dtype: DType = DType.float32
    # torch.set_float32_matmul_precision for every rank: highest (torch's default), high (TF32 on
    # GPUs), medium (bf16 passes); float32 matmuls only, a knob of experiment plans.
    matmul_precision: str = "highest"
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    shape: ShapeConfig = field(default_factory=ShapeConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    data: DataConfig = field(default_factory=DataConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    accuracy: AccuracyConfig = field(default_factory=AccuracyConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    convergence: ConvergenceConfig = field(default_factory=ConvergenceConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # A plan of knob experiments (configs/experiment/, docs/experiments.md); null: one plain run.
    experiment: Any = None
    seed: int = 0  # every random choice (weights, inputs) derives from it
    # Measure the same workload at cp=1 under the same per-rank budget beside a CP run, cached by
    # config in output_dir/baseline/ (cpbench/app/baseline.py).
    baseline: bool = True
    # The real job the benchmark stands for: a YAML of cpbench settings, for the what-changed table.
    job: str | None = None
    # The one folder a run writes to (configs/config.yaml: cpbench_out, or $CPBENCH_OUTPUT_DIR).
    output_dir: str = MISSING


def register() -> None:
    ConfigStore.instance().store(name="cpbench_schema", node=BenchConfig)
