"""Data types of the policy layer: the effective, merged policy. The defaults here are the
built-in layer (documented in policy/shipped/default.yaml)."""
from __future__ import annotations

from dataclasses import dataclass, field

from smartlaunch.vocab import LINK_FAMILIES, STRATEGIES


@dataclass(frozen=True)
class DecisionPolicy:
    min_efficiency: float = 0.70          # DDP speedup / GPUs needed to pick DDP
    uncertainty_band: float | None = None  # where a trial decides; None: the model's error
    trials: bool = True                   # run measured trials inside the band
    trial_steps: int = 20                 # at least this many measured steps per trial
    trial_seconds: float = 1.0            # and at least this long a measured window
    prestart: bool = True                 # start the sweep and first trial beside the dry run
    allowed_strategies: tuple[str, ...] = STRATEGIES
    max_gpus: int | None = None           # per job; None = all visible
    world_sizes: tuple[int, ...] = (1, 2, 4, 8)  # an automatic choice's DDP world sizes
    ddp_link_classes: tuple[str, ...] = LINK_FAMILIES
    prefer_independent_for_sweeps: bool = True
    memory_headroom: float = 0.80         # use at most this share of a GPU's free memory
    avoid_busy_gpus: bool = True
    avoid_unhealthy_gpus: bool = True
    fallback_strategy: str = "single"     # when no profile can be had

    def early_group(self, usable: int, nproc: int | None, explicit_ddp: bool = False) -> int:
        """The GPU count of the largest DDP candidate decide will weigh (1: none)."""
        n = min(x for x in (usable, nproc, self.max_gpus) if x is not None)
        if explicit_ddp and nproc is not None:
            return n                      # --strategy ddp --nproc-per-node N runs N as asked
        return self.largest_world_size(n) or 1

    def largest_world_size(self, n: int) -> int | None:
        """The largest DDP world size (2 or more) of world_sizes up to n, or None."""
        return max((k for k in self.world_sizes if 2 <= k <= n), default=None)


# The built-in NCCL settings of PHB and NODE links (through a PCIe host bridge).
_HOST_BRIDGE_NCCL = {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "33554432",
                     "NCCL_NTHREADS": "16", "NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "8"}


@dataclass(frozen=True)
class LaunchPolicy:
    nccl: dict[str, dict[str, str]] = field(default_factory=lambda: {
        "NV": {}, "PIX": {}, "PXB": {}, "PHB": dict(_HOST_BRIDGE_NCCL),
        "NODE": dict(_HOST_BRIDGE_NCCL), "SYS": {},
    })
    numa_binding: str = "node"            # one of vocab.NUMA_MODES
    rank_failure_timeout_s: float = 10.0
    hang_timeout_s: float = 300.0         # floor; the watchdog also scales with step time
    hang_step_multiple: float = 20.0      # stall when no step for max(floor, this x median step)
    startup_grace_s: float = 600.0        # no hang verdict before the first step (data loading)
    signal_grace_s: float = 30.0          # SIGTERM -> SIGKILL (torchrun's 30 s)
    straggler_threshold: float = 0.15
    straggler_window_s: float = 30.0      # window over which work per step is compared
    gpu_sample_s: float = 5.0             # NVML sample of each rank's GPU (drift, straggler cause)
    clock_drift_threshold: float = 0.10   # warn when a GPU's clock under load falls this far
    log_dir: str = ""                     # "": logs/ under paths.cache_dir (store.log_root)
    quiet: bool = False                   # no decision line before the job's output (--quiet)
    flight_recorder: bool = False         # torch's NCCL Flight Recorder in every rank
    env: dict[str, str] = field(default_factory=dict)   # for every worker, whatever the link


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
    decision_log: str = "/var/log/smartlaunch/decisions.jsonl"   # one JSON line per launch
    node_cache: str = "/run/smartlaunch"  # the node's own measurements (read-only to launches)


@dataclass(frozen=True)
class SlurmPolicy:
    release_unused: bool = False          # shrink the job to the nodes its plan uses


@dataclass(frozen=True)
class Policy:
    decision: DecisionPolicy = field(default_factory=DecisionPolicy)
    launch: LaunchPolicy = field(default_factory=LaunchPolicy)
    dryrun: DryRunPolicy = field(default_factory=DryRunPolicy)
    jobs: JobsPolicy = field(default_factory=JobsPolicy)
    paths: PathsPolicy = field(default_factory=PathsPolicy)
    slurm: SlurmPolicy = field(default_factory=SlurmPolicy)
    # dotted key -> the layer that set it: "built-in", "admin:PATH", "user:PATH", "env:VAR",
    # "cli:--OPTION", "enforced:PATH"
    sources: dict[str, str] = field(default_factory=dict)
    enforced: dict[str, object] = field(default_factory=dict)   # dotted key -> admin value
    notes: dict[str, str] = field(default_factory=dict)   # key -> why not what a layer asked
    admin_path: str | None = None          # the admin file that was read, if any
    layers: tuple[str, ...] = ()           # sources that were read, lowest first

    def source_of(self, dotted_key: str) -> str:
        return self.sources.get(dotted_key, "built-in")

    def rule(self, dotted_key: str) -> str:
        """'decision.min_efficiency=0.7 (admin:/etc/smartlaunch/policy.yaml)' for explain."""
        obj = self
        for part in dotted_key.split("."):
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
        return f"{dotted_key}={format_value(obj)} ({self.source_of(dotted_key)})"


def format_value(v: object) -> str:
    """A value as a policy file writes it: lists in brackets, None as null."""
    if isinstance(v, tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    return "null" if v is None else str(v)
