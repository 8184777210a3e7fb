"""The decision's output: a frozen `Plan` (JSON schema: docs/plan-schema.md)."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from smartlaunch import wire
from smartlaunch.errors import WireError
from smartlaunch.profile.api import ModelProfile
from smartlaunch.vocab import STRATEGIES, Strategy

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    source: str        # "policy launch.nccl.PHB (built-in)", "kept from environment", ...


@dataclass(frozen=True)
class NumaBinding:
    local_rank: int
    gpu: int                     # CUDA ordinal the rank uses
    numa_node: int               # -1: single node, nothing to bind
    cpus: tuple[int, ...]
    mode: str                    # one of vocab.NUMA_MODES
    mechanism: str               # "numactl" | "sched_setaffinity" | "none"
    note: str = ""


@dataclass(frozen=True)
class Candidate:
    strategy: Strategy
    gpus: tuple[int, ...]
    predicted_step_s: float | None = None
    predicted_samples_per_s: float | None = None
    speedup: float | None = None          # samples/s over single GPU
    efficiency: float | None = None       # speedup / len(gpus)
    allreduce_s: float | None = None      # exposed + hidden all-reduce time per step
    comm_cost_s: float | None = None      # what communication adds to the step (cost model)
    measured: bool = False                # from a trial, not the model
    model_speedup: float | None = None    # the model's, where a measurement replaced it
    corrected: bool = False               # untried; predicted, corrected by other trials
    per_variant: int | None = None        # independent jobs: GPUs per variant
    draws: int = 1                        # trials behind a measured figure
    chosen: bool = False
    reason: str = ""


@dataclass(frozen=True)
class Reason:
    text: str
    rule: str | None = None     # policy key (with its source) or "user: --strategy", ...


@dataclass(frozen=True)
class CommSummary:
    """The all-reduce curve a DDP candidate was predicted with; a figure is None where it
    would be extrapolated or is not plausible."""
    world_size: int
    backend: str
    gpus: tuple[int, ...]
    busbw_256MiB_GBps: float | None
    busbw_at_grad_GBps: float | None
    grad_bytes: int | None
    latency_us: float | None
    cached: bool
    env: dict[str, str]
    points: tuple[tuple[int, float], ...]
    bandwidth_Bps: float
    derived_from: tuple[int, ...] = ()            # the measured group it was derived from
    busbw_largest_GBps: float | None = None       # at points[-1]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gpus"] = list(self.gpus)
        d["derived_from"] = list(self.derived_from)
        d["points"] = [[int(b), float(t)] for b, t in self.points]
        return d


@dataclass(frozen=True)
class VariantGroup:
    """One variant's DDP group when --each packs the variants into groups (pack.py)."""
    variant: int                       # index into Plan.variants
    strategy: Strategy                 # how the group runs: the SCALED unit (ddp)
    gpus: tuple[int, ...]
    link_class: str | None             # worst link inside the group
    speedup: float | None              # the group's samples/s over one GPU
    basis: str                         # measured | corrected | predicted | launch
    env: tuple[EnvVar, ...] = ()       # the whole plan's, plus the group's NCCL table
    numa: tuple[NumaBinding, ...] = ()  # one per local rank of the group


@dataclass(frozen=True)
class Plan:
    strategy: Strategy
    device: str                                  # "cuda" or "cpu"
    gpus: tuple[int, ...]                        # CUDA ordinals as smartlaunch sees them
    nproc_per_node: int
    requested_max: int                           # the most the job was allowed
    env: tuple[EnvVar, ...] = ()                 # added to every worker's environment
    numa: tuple[NumaBinding, ...] = ()           # the worker uses the one of its GPU
    candidates: tuple[Candidate, ...] = ()
    reasons: tuple[Reason, ...] = ()
    left_free: tuple[int, ...] = ()              # allowed GPUs the plan does not hold
    fallback_gpus: tuple[int, ...] = ()          # single: where it may move if its GPU is taken
    jobs_per_gpu: dict[int, int] = field(default_factory=dict)   # independent; absent GPU: 1
    wait_for_lease: bool = True                  # False (--no-wait): fail naming the holders
    wait_timeout_s: float = 3600.0               # how long a launch waits for its leases
    wait_reason: str = ""                        # why the plan expects to wait; "": GPUs free
    link_class: str | None = None                # worst link inside the DDP group
    variants: tuple[tuple[str, ...], ...] = ()   # independent jobs: script args per job
    groups: tuple[VariantGroup, ...] = ()        # one per variant, where packed
    profile: ModelProfile | None = None          # the dry run's, None without one
    comm: CommSummary | None = None              # None when no curve was measured
    topology: dict[str, Any] = field(default_factory=dict)    # fingerprint, source, note
    nnodes: str = "1"
    forced: bool = False                         # --strategy given (not auto)
    timings: dict[str, float] = field(default_factory=dict)   # seconds per pipeline stage
    uncertainty_band: float | None = None        # select.uncertainty; None: no GPUs
    command: tuple[str, ...] = ()                # [--module | --no-python] TARGET ARGS
    node_variants: tuple[tuple[int, ...], ...] = ()   # --each across nodes: shares by node
    node_index: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["schema_version"] = SCHEMA_VERSION
        d["strategy"] = strategy_name(self.strategy)
        d["profile"] = self.profile.to_dict() if self.profile is not None else {}
        d["comm"] = self.comm.to_dict() if self.comm is not None else {}
        d["jobs_per_gpu"] = {str(g): n for g, n in sorted(self.jobs_per_gpu.items())}
        for c in d["candidates"]:
            c["strategy"] = strategy_name(c["strategy"])
        for g in d["groups"]:
            g["strategy"] = strategy_name(g["strategy"])
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, d: Any, *, strategies: Collection[str] = STRATEGIES) -> "Plan":
        """to_dict's inverse for a plan read from the network: every field typed and
        bounded, strategies among `strategies`. Raises WireError only."""
        return cls(**_plan_fields(d, tuple(strategies)))

    @property
    def multi_node(self) -> bool:
        return self.nnodes not in ("1", "1:1")

    def env_dict(self) -> dict[str, str]:
        return {e.name: e.value for e in self.env}

    def binding(self, gpu: int | None) -> NumaBinding | None:
        """The NUMA binding of the one process that runs on `gpu`."""
        return next((b for b in self.numa if b.gpu == gpu), None) if gpu is not None else None

    def group_plan(self, i: int) -> "Plan":
        """Variant i's group as the plan of one job on this node."""
        g = self.groups[i]
        return dataclasses.replace(
            self, strategy=g.strategy, gpus=g.gpus, nproc_per_node=len(g.gpus),
            requested_max=len(g.gpus), link_class=g.link_class, env=g.env, numa=g.numa,
            variants=(), groups=(), fallback_gpus=(), jobs_per_gpu={}, left_free=(),
            command=self.command + self.variants[g.variant], nnodes="1", node_variants=(),
            node_index=0)

    def share(self) -> tuple[int, ...]:
        """The indices of the variants this node runs."""
        if self.node_variants:
            return self.node_variants[self.node_index]
        return tuple(range(len(self.variants)))

    def for_node(self, k: int) -> "Plan":
        """A sweep across nodes as node k runs it."""
        share = self.node_variants[k]
        groups = tuple(dataclasses.replace(g, variant=v) for g, v in zip(self.groups, share))
        return dataclasses.replace(self, node_index=k, groups=groups)

    def jobs_on(self, gpu: int) -> int:
        """Independent jobs that may run at once on `gpu`."""
        return self.jobs_per_gpu.get(gpu, 1)


MAX_GPUS = 1024                  # GPU indices 0..MAX_GPUS-1, lists of at most MAX_GPUS
MAX_RANKS = 1 << 16              # nproc_per_node, requested_max
MAX_ARGS = 1 << 20               # a command's or variant's arguments: --each-file's 1 MiB
MAX_VARIANTS = 1 << 20
MAX_NODES = 1 << 16


def _gpus(v: Any, where: str) -> tuple[int, ...]:
    return tuple(wire.integer(g, f"{where}[{i}]", 0, MAX_GPUS - 1)
                 for i, g in enumerate(wire.items(v, where, MAX_GPUS)))


def _args(v: Any, where: str) -> tuple[str, ...]:
    return tuple(wire.text(a, f"{where}[{i}]", MAX_ARGS, lines=True)
                 for i, a in enumerate(wire.items(v, where, MAX_ARGS)))


def _indices(v: Any, where: str) -> tuple[int, ...]:
    return tuple(wire.integer(k, f"{where}[{i}]", 0, MAX_VARIANTS - 1)
                 for i, k in enumerate(wire.items(v, where, MAX_VARIANTS)))


def _plan_fields(d: Any, strategies: tuple[str, ...]) -> dict[str, Any]:
    """Plan.from_dict's keyword arguments, read and checked."""
    d = wire.obj(d, "plan")
    if "schema_version" not in d:
        raise WireError("plan.schema_version", "missing")
    wire.integer(d["schema_version"], "plan.schema_version", SCHEMA_VERSION, SCHEMA_VERSION)
    readers = {Strategy: lambda v, w: _strategy(wire.choice(v, w, strategies))}

    def one(tp):
        return lambda v, w: None if v == {} else tp(**wire.record(tp, v, w, readers=readers))

    def jobs(v: Any, where: str) -> dict[int, int]:
        out = {}
        for k, n in wire.obj(v, where, MAX_GPUS).items():
            if not (k.isascii() and k.isdigit() and len(k) <= 4 and int(k) < MAX_GPUS):
                raise WireError(f"{where} key", "not a GPU index")
            out[int(k)] = wire.integer(n, f"{where}.{k}", 1, MAX_GPUS)
        return out

    def topology(v: Any, where: str) -> dict[str, str | None]:
        return {wire.text(k, f"{where} key", wire.MAX_KEY_TEXT):
                None if x is None else wire.text(x, f"{where}.{wire.line(k, 40)}")
                for k, x in wire.obj(v, where, 32).items()}
    fields = {
        "gpus": _gpus, "left_free": _gpus, "fallback_gpus": _gpus,
        "nproc_per_node": lambda v, w: wire.integer(v, w, 1, MAX_RANKS),
        "requested_max": lambda v, w: wire.integer(v, w, 0, MAX_RANKS),
        "device": lambda v, w: wire.choice(v, w, ("cuda", "cpu")),
        "jobs_per_gpu": jobs, "topology": topology,
        "profile": one(ModelProfile), "comm": one(CommSummary),
        "nnodes": lambda v, w: wire.text(v, w, 32),
        "wait_timeout_s": lambda v, w: wire.number(v, w, 0.0),
        "command": _args,
        "variants": lambda v, w: tuple(_args(a, f"{w}[{i}]") for i, a in
                                       enumerate(wire.items(v, w, MAX_VARIANTS))),
        "node_variants": lambda v, w: tuple(_indices(a, f"{w}[{i}]") for i, a in
                                            enumerate(wire.items(v, w, MAX_NODES))),
        "node_index": lambda v, w: wire.integer(v, w, 0, MAX_NODES - 1),
    }
    out = wire.record(Plan, {k: v for k, v in d.items() if k != "schema_version"}, "plan",
                      fields=fields, readers=readers)
    variants, split = out.get("variants", ()), out.get("node_variants", ())
    for i, g in enumerate(out.get("groups", ())):
        if not 0 <= g.variant < len(variants):
            raise WireError(f"plan.groups[{i}].variant", f"{g.variant}, not the index of one "
                            f"of the plan's {len(variants)} variants")
    for k, share in enumerate(split):
        if any(v >= len(variants) for v in share):
            raise WireError(f"plan.node_variants[{k}]", f"names a variant past the plan's "
                            f"{len(variants)}")
    if sum(map(len, split)) != len(set().union(*split)):
        raise WireError("plan.node_variants", "names a variant twice")
    if out.get("node_index", 0) >= max(1, len(split)):
        raise WireError("plan.node_index", f"{out['node_index']}, but the plan has "
                        f"{len(split)} node shares")
    return out


def _strategy(name: str):
    """A Strategy member for its name; a plain str where vocab has none."""
    try:
        return Strategy(name)
    except ValueError:
        return name


def strategy_name(strategy) -> str:
    """A Strategy member's name, or the plain str itself."""
    return strategy.value if isinstance(strategy, Strategy) else str(strategy)
