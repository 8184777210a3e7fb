"""The decide half of a strategy unit (smartlaunch/strategies/): what decide() and --explain
ask of a strategy. decide/ names no strategy where a unit can answer; the caller passes the
units (pipeline: strategies.REGISTRY), keyed by their NAME."""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from smartlaunch.allocation import JobAllocation
from smartlaunch.decide.cost import CostModel, Prediction
from smartlaunch.decide.plan import Candidate, NumaBinding, Plan, Reason
from smartlaunch.policy.api import Policy
from smartlaunch.profile.feedback import MeasuredRate
from smartlaunch.request import Request
from smartlaunch.topology.api import Topology


class Role(str, enum.Enum):
    """What a unit's candidates are to the automatic choice (select.choose_auto)."""
    BASELINE = "baseline"  # one process on one GPU: every speedup is relative to it (single)
    SCALED = "scaled"      # one job on N GPUs: wins by samples/s when speedup / N meets the
    #                        policy's decision.min_efficiency (ddp)
    SWEEP = "sweep"        # the request's variants side by side, weighed against the best
    #                        SCALED candidate by its own prefer() (independent)


class Variants(str, enum.Enum):
    """What a unit needs of the request's variants (--each) when --strategy names it."""
    REQUIRED = "required"
    FORBIDDEN = "forbidden"
    OPTIONAL = "optional"


class Trial(Protocol):
    """Measures one candidate by a few real steps (profile.trial; pipeline numbers them)."""

    def __call__(self, strategy: str, gpus: tuple[int, ...], attempt: int = 1) -> float | None:
        """samples/s of `strategy` on `gpus`, or None when the trial could not measure;
        attempt > 1: measured again (another draw)."""

    def planned(self, n: int) -> None:
        """A round of n trials starts (the status line says "trial 2 of n"); a later round
        (a trial the first one's corrections add, select._trials) continues the count."""


class StrategyUnit(Protocol):
    NAME: str          # a vocab.Strategy member; the Plan's and the candidates' `strategy`
    # Ranks that torch's agent starts and that talk through NCCL: they get the NCCL table of
    # their group's link class, and torchrun's own --numa-binding replaces smartlaunch's.
    COLLECTIVE: bool
    ROLE: Role
    VARIANTS: Variants
    # What torchrun itself would launch: the choice for a profile that cannot be measured,
    # and for a multi-node launch (largest group).
    TORCHRUN: bool
    TRIAL: bool        # a Trial can measure its candidates (profile.trial runs it)
    WORD: str          # its family in sentences: "DDP", "independent jobs"

    def forced(self, ctx) -> Any:
        """The Choice (select.Choice) when --strategy names this unit, or None to let the
        candidates decide. ctx: decide.Ctx (request, topology, policy, usable GPUs...)."""

    def candidates(self, ctx, forced) -> dict[tuple, tuple[Candidate, Prediction | None]]:
        """(NAME, gpus) -> (candidate, prediction or None); reasons for those not considered
        go to ctx.reasons. forced: the forced Choice or None."""

    def cpu_plan(self, request, policy, why: str, reasons: list, base: dict) -> Plan:
        """The plan on a machine without GPUs (why: what NVML said); reasons: those so far,
        base: the Plan fields every plan shares."""

    def plan_fields(self, ctx, choice) -> dict[str, Any]:
        """The chosen plan's fields this strategy fills: nproc_per_node, and any of
        link_class, fallback_gpus, jobs_per_gpu."""

    def sentence(self, ctx, c: Candidate, pred: Prediction | None, error: tuple[float, str]) -> str:
        """The head of the candidate's why-it-won-or-lost sentence: what it is and its numbers."""

    def short_name(self, c: Candidate) -> str:
        """How other candidates' sentences name it: "DDP×2", "single GPU"."""

    def named(self, c: Candidate) -> str:
        """It with its GPUs, where a reason names the winner: "DDP×2 on GPUs 0,1", "single
        GPU0"."""

    def prefer(self, ctx, key: tuple, pred: Prediction | None,
               rival: tuple[str, float] | None) -> bool:
        """SWEEP units only: whether the variants run this way rather than one after another
        with the best SCALED candidate (rival: its WORD and predicted speedup, or None); adds
        the reason to ctx.reasons."""

    def table_name(self, c: Candidate) -> str:
        """Its row name in --explain's candidate table."""

    def headline(self, plan: Plan) -> str:
        """What runs, for --explain's first line: "DDP×2 on GPUs 0,1 (worst link NV18)"."""

    def line(self, plan: Plan) -> str:
        """What runs, for the line every launch prints before the job's output."""

    def placement_lines(self, plan: Plan) -> list[str]:
        """--explain's lines on where the processes go (explain.placement builds the common
        part: GPUs left free, fallback GPUs, leases)."""

    def binding_label(self, b: NumaBinding) -> str:
        """Whose NUMA binding this is, in --explain: "local rank 0 → GPU1"."""


Units = Mapping[str, StrategyUnit]


def by_role(units: Units, role: Role) -> StrategyUnit:
    """The registered unit with this role (the first, in candidate order)."""
    for unit in units.values():
        if unit.ROLE == role:
            return unit
    from smartlaunch.errors import PlanError
    raise PlanError(f"no strategy unit has the role {role.value}; register one (strategies/)")


# ---- the decision as a step: what it is given, what has been measured, what it needs next ----

@dataclass(frozen=True)
class Inputs:
    """What the decision is given before anything is measured (decide.decide's first argument).
    model, model_note: the cost model with this node's calibrated constants and the reason
    that says which values predict DDP (used where a prediction can be made); launched: the
    measured rates of earlier launches of this job (profile.feedback); notes: reasons the
    caller adds to the plan (a Slurm allocation's); numactl: its path ("" absent, None: looked
    up); torchrun_numa: the user's own torchrun --numa-binding; allocation: the batch job's
    (scheduler/slurm.SlurmContext), whose GPUs or nodes the plan leaves idle are said in its
    reasons (allocation.idle_line); nodes: the fixed node count of a job this node decides
    for (it hosts the rendezvous store), whose use of fewer nodes is a choice (0: none)."""
    request: Request
    topology: Topology
    policy: Policy
    units: Units
    environ: Mapping[str, str] = field(default_factory=dict)
    model: CostModel = field(default_factory=CostModel)
    model_note: Reason | None = None
    launched: Mapping[str, MeasuredRate] = field(default_factory=dict)
    notes: tuple[Reason, ...] = ()
    numactl: str | None = None
    torchrun_numa: str | None = None
    allocation: JobAllocation | None = None
    nodes: int = 0


@dataclass(frozen=True)
class NeedLeases:
    """The GPUs other launches lease now (launch.leases): read once the request is known
    possible, since it touches the lease directory."""


@dataclass(frozen=True)
class NeedProfile:
    """A dry run of the script on `gpu` (profile.cache.profile_entrypoint). usable: the GPUs
    the decision may use, for measurements started beside it (profile/early.py)."""
    gpu: int
    usable: tuple[int, ...]


@dataclass(frozen=True)
class NeedCurve:
    """The all-reduce curve of `gpus` (profile.comm), up to max_bytes (None: every size);
    None when it cannot be measured."""
    gpus: tuple[int, ...]
    max_bytes: int | None = None


@dataclass(frozen=True)
class NeedTrial:
    """A trial of `strategy` on `gpus` (profile.trial): the number-th of `of` this decision
    has asked for so far (for "trial 2 of 3"); attempt > 1: the same candidate measured again
    (a new draw, near the policy's floor). Answered by a TrialResult."""
    strategy: str
    gpus: tuple[int, ...]
    number: int = 1
    of: int = 1
    attempt: int = 1

    @property
    def key(self) -> tuple:
        base = (self.strategy, self.gpus)
        return base if self.attempt == 1 else (*base, self.attempt)


@dataclass(frozen=True)
class NeedNodes:
    """The all-reduce between the job's `nodes` nodes, one leader rank on each, over the
    rendezvous store (profile/internode.py), once all have come: what fewer nodes would cost
    (decide/nodes.py). cuda: the plan runs on GPUs (else gloo ranks emulate the link); env:
    the plan's NCCL variables. Answered by the leader curve (a CommCurve), or a few words on
    why none was measured."""
    nodes: int
    grad_bytes: int
    strategy: str
    gpus: tuple[int, ...]
    link_class: str | None
    cuda: bool
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TrialResult:
    samples_per_s: float | None        # None: the trial could not measure
    why: str = ""                      # why not, in a few words


Need = NeedLeases | NeedProfile | NeedCurve | NeedTrial | NeedNodes


@dataclass(frozen=True)
class Measured:
    """What has been measured so far, given back to decide with each call. leased: None until
    read; profile: the dry run's ModelProfile once `profiled` (None: it gave none); curves and
    trials: by group and by (strategy, gpus); between: NeedNodes' answer once asked;
    timings: seconds per stage, the plan's `timings`; notes: reasons the measurements add (an
    early trial that was stopped)."""
    leased: frozenset[int] | None = None
    profile: Any = None
    profiled: bool = False
    curves: Mapping[tuple[int, ...], Any] = field(default_factory=dict)
    trials: Mapping[tuple, TrialResult] = field(default_factory=dict)
    between: Any = None
    timings: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[Reason, ...] = ()

    def add(self, need: Need, answer: Any) -> "Measured":
        """This with `answer` to `need` added."""
        if isinstance(need, NeedLeases):
            return dataclasses.replace(self, leased=frozenset(answer))
        if isinstance(need, NeedProfile):
            return dataclasses.replace(self, profile=answer, profiled=True)
        if isinstance(need, NeedCurve):
            return dataclasses.replace(self, curves={**self.curves, need.gpus: answer})
        if isinstance(need, NeedNodes):
            return dataclasses.replace(self, between=answer)
        return dataclasses.replace(self, trials={**self.trials, need.key: answer})
