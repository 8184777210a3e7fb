"""Data types of the policy layer: the effective, merged policy.

Layers, lowest first: built-in defaults (these dataclass defaults, mirrored and documented in
policy/shipped/default.yaml) < admin file (/etc/smartlaunch/policy.yaml) < user file. The admin's
`enforce:` section then wins over everything, CLI and environment included. `sources` records
which layer set each dotted key, so --explain and `policy show` can name the rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from smartlaunch.vocab import LINK_FAMILIES, STRATEGIES


@dataclass(frozen=True)
class DecisionPolicy:
    min_efficiency: float = 0.70          # DDP speedup / GPUs needed to pick DDP (seeds: 70%+)
    # Relative error of the predicted speedup inside which a measured trial decides; None: the
    # cost model's own measured error (decide/cost.py MODEL_ERROR, its 90th percentile).
    uncertainty_band: float | None = None
    trials: bool = True                   # run measured trials inside the band
    trial_steps: int = 20                 # at least this many measured steps per trial
    trial_seconds: float = 1.0            # and at least this long a measured window
    # Start the all-reduce benchmark's ranks and the first DDP trial's with the dry run, on
    # spare cores, the benchmark measuring before the dry run's first forward and the trial
    # waiting, set up, until decide asks (profile/early.py). false: start each when needed.
    prestart: bool = True
    allowed_strategies: tuple[str, ...] = STRATEGIES
    max_gpus: int | None = None           # per job; None = all visible
    # Numbers of processes (world sizes) an automatic choice may give one DDP job: the global
    # batch is world size x per-rank batch, and most scripts, samplers and LR schedules assume
    # a power of two. --strategy ddp with an explicit --nproc-per-node runs what it says.
    world_sizes: tuple[int, ...] = (1, 2, 4, 8)
    ddp_link_classes: tuple[str, ...] = LINK_FAMILIES
    prefer_independent_for_sweeps: bool = True
    memory_headroom: float = 0.80         # use at most this share of a GPU's free memory
    avoid_busy_gpus: bool = True
    avoid_unhealthy_gpus: bool = True
    fallback_strategy: str = "single"     # when no profile can be had

    def early_group(self, usable: int, nproc: int | None, explicit_ddp: bool = False) -> int:
        """The GPU count of the largest DDP candidate decide will weigh, from what is known
        before it runs: `usable` GPUs, the `nproc` cap (--nproc-per-node) and this policy.
        Decide and the early start (pipeline._start_early) both use it, so the trial started
        early is the one decide will ask for. 1: no DDP candidate."""
        n = min(x for x in (usable, nproc, self.max_gpus) if x is not None)
        if explicit_ddp and nproc is not None:
            return n                      # --strategy ddp --nproc-per-node N runs N as asked
        return self.largest_world_size(n) or 1

    def largest_world_size(self, n: int) -> int | None:
        """The largest DDP world size (2 or more) of world_sizes up to n, or None."""
        return max((k for k in self.world_sizes if 2 <= k <= n), default=None)


@dataclass(frozen=True)
class LaunchPolicy:
    # NCCL variables per link family; never one that disables a working P2P path.
    nccl: dict[str, dict[str, str]] = field(default_factory=lambda: {
        "NV": {},
        "PIX": {},
        "PXB": {},
        "PHB": {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "33554432",
                "NCCL_NTHREADS": "16", "NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "8"},
        "NODE": {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "33554432",
                 "NCCL_NTHREADS": "16", "NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "8"},
        "SYS": {},
    })
    numa_binding: str = "node"            # one of vocab.NUMA_MODES
    rank_failure_timeout_s: float = 10.0
    hang_timeout_s: float = 300.0         # floor; the watchdog also scales with step time
    hang_step_multiple: float = 20.0      # stall when no step for max(floor, this x median step)
    startup_grace_s: float = 600.0        # no hang verdict before the first step (data loading)
    signal_grace_s: float = 10.0          # SIGTERM -> SIGKILL
    straggler_threshold: float = 0.15
    straggler_window_s: float = 30.0      # window over which work per step is compared
    gpu_sample_s: float = 5.0             # NVML sample of each rank's GPU (drift, straggler cause)
    clock_drift_threshold: float = 0.10   # warn when a GPU's clock under load falls this far
    log_dir: str = ""                     # "": logs/ under paths.cache_dir (store.log_root)
    quiet: bool = False                   # no decision line before the job's output (--quiet)
    # torch's NCCL Flight Recorder in every rank (a ring of recent collectives, read on a hang
    # to name the collective a rank did not enter); off, as under torchrun, unless asked.
    flight_recorder: bool = False
    # Variables for every worker whatever the link. From an admin `enforce:` section they are
    # mandatory (applied over the user's environment, see policy.enforced_env); from any other
    # layer they are defaults the user's own environment overrides.
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DryRunPolicy:
    time_limit_s: float = 120.0
    warmup_steps: int = 5
    measure_steps: int = 20
    measure_seconds: float = 0.5          # and keep measuring until the window is this long
    precision: float = 0.02               # stop once the mean step is known this well (0: off)
    isolation: str = "require"            # require | best-effort | off (smartlaunch.sandbox)


@dataclass(frozen=True)
class JobsPolicy:
    fail_fast: bool = False               # independent jobs: stop the others on first failure
    jobs_per_gpu: int = 1                 # 2 allows packing when both peaks fit
    wait_timeout_s: float = 3600.0        # waiting for a free GPU; --no-wait fails at once
    share_gpus: bool = False              # leases: allow two launches on one GPU


@dataclass(frozen=True)
class PathsPolicy:
    cache_dir: str = "~/.cache/smartlaunch"
    lease_dir: str = "/tmp/smartlaunch-leases"
    comm_cache_max_age_s: float = 7 * 24 * 3600.0
    # One JSON line per launch (launch/decision_log.py). The built-in path is used where its
    # directory exists and this user may write there, else <cache_dir>/decisions.jsonl; any
    # other value is used as given.
    decision_log: str = "/var/log/smartlaunch/decisions.jsonl"
    # The node's own measurements, written by the Slurm prolog as root (all-reduce curves under
    # comm/): launches read them when their own cache has none, never write them.
    node_cache: str = "/run/smartlaunch"


@dataclass(frozen=True)
class SlurmPolicy:
    # Shrink a Slurm job to the nodes its plan uses before launching (`scontrol update
    # JobId=... NumNodes=N`, from the batch script only); GPUs of a running job cannot be
    # released (docs/slurm-admin.md).
    release_unused: bool = False


@dataclass(frozen=True)
class Policy:
    decision: DecisionPolicy = field(default_factory=DecisionPolicy)
    launch: LaunchPolicy = field(default_factory=LaunchPolicy)
    dryrun: DryRunPolicy = field(default_factory=DryRunPolicy)
    jobs: JobsPolicy = field(default_factory=JobsPolicy)
    paths: PathsPolicy = field(default_factory=PathsPolicy)
    slurm: SlurmPolicy = field(default_factory=SlurmPolicy)
    # dotted key -> "built-in" | "admin:/etc/smartlaunch/policy.yaml" | "user:<path>" |
    #   "env:SMARTLAUNCH_LOG_DIR" | "cli:--nproc-per-node" | "enforced:/etc/..." ; filled by
    #   the loader. Keys: "section.field", plus "launch.nccl.<FAMILY>", "launch.env.<NAME>".
    sources: dict[str, str] = field(default_factory=dict)
    enforced: dict[str, object] = field(default_factory=dict)   # dotted key -> admin value
    # dotted key -> why the value is not what a lower layer asked ("user:... set 8; the
    # admin cap 4 wins"), for `policy show` and --explain.
    notes: dict[str, str] = field(default_factory=dict)
    admin_path: str | None = None          # the admin file that was read, if any
    layers: tuple[str, ...] = ()           # sources that were read, lowest first

    def source_of(self, dotted_key: str) -> str:
        return self.sources.get(dotted_key, "built-in")

    def rule(self, dotted_key: str) -> str:
        """'decision.min_efficiency=0.7 (admin:/etc/smartlaunch/policy.yaml)' for explain."""
        obj = self
        for part in dotted_key.split("."):
            # launch.nccl.PHB and launch.env.NAME index into dicts.
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
        if isinstance(obj, tuple):
            obj = "[" + ", ".join(map(str, obj)) + "]"
        elif obj is None:
            obj = "null"            # as a policy file writes it, never Python's None
        return f"{dotted_key}={obj} ({self.source_of(dotted_key)})"
