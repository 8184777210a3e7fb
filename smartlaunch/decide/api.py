"""What decide() and --explain ask of a strategy unit (strategies/), and the decision's
inputs, needs and measurements."""
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
    BASELINE = "baseline"  # one process on one GPU: every speedup is relative to it
    SCALED = "scaled"      # one job on N GPUs, judged by decision.min_efficiency
    SWEEP = "sweep"        # the variants side by side, weighed by its own prefer()


class Variants(str, enum.Enum):
    """What a unit needs of the request's variants (--each) when --strategy names it."""
    REQUIRED = "required"
    FORBIDDEN = "forbidden"
    OPTIONAL = "optional"


class Trial(Protocol):
    """Measures one candidate by a few real steps."""

    def __call__(self, strategy: str, gpus: tuple[int, ...], attempt: int = 1) -> float | None:
        """samples/s, or None when the trial could not measure; attempt > 1: another draw."""

    def planned(self, n: int) -> None:
        """A round of n more trials starts."""


class StrategyUnit(Protocol):
    NAME: str          # a vocab.Strategy member; the Plan's and the candidates' `strategy`
    COLLECTIVE: bool   # ranks talk through NCCL: they get their link class's NCCL table
    ROLE: Role
    VARIANTS: Variants
    TORCHRUN: bool     # what torchrun itself would launch
    TRIAL: bool        # a Trial can measure its candidates (profile.trial runs it)
    WORD: str          # its family in sentences: "DDP", "independent jobs"

    def forced(self, ctx) -> Any:
        """The select.Choice when --strategy names this unit, or None; ctx: decide.Ctx."""

    def candidates(self, ctx, forced) -> dict[tuple, tuple[Candidate, Prediction | None]]:
        """(NAME, gpus) -> (candidate, prediction or None); forced: the forced Choice."""

    def cpu_plan(self, request, policy, why: str, reasons: list, base: dict) -> Plan:
        """The plan without GPUs; base: the Plan fields every plan shares."""

    def plan_fields(self, ctx, choice) -> dict[str, Any]:
        """The chosen plan's fields this strategy fills (nproc_per_node, ...)."""

    def sentence(self, ctx, c: Candidate, pred: Prediction | None, error: tuple[float, str]) -> str:
        """The head of the candidate's why-it-won-or-lost sentence."""

    def short_name(self, c: Candidate) -> str:
        """How other candidates' sentences name it: "DDP×2", "single GPU"."""

    def named(self, c: Candidate) -> str:
        """It with its GPUs: "DDP×2 on GPUs 0,1", "single GPU0"."""

    def prefer(self, ctx, key: tuple, pred: Prediction | None,
               rival: tuple[str, float] | None) -> bool:
        """SWEEP units: whether to run this way rather than with the best SCALED candidate
        (rival: its WORD and speedup); adds the reason."""

    def table_name(self, c: Candidate) -> str:
        """Its row name in --explain's candidate table."""

    def headline(self, plan: Plan) -> str:
        """What runs, for --explain's first line: "DDP×2 on GPUs 0,1 (worst link NV18)"."""

    def line(self, plan: Plan) -> str:
        """What runs, for the line every launch prints before the job's output."""

    def placement_lines(self, plan: Plan) -> list[str]:
        """--explain's lines on where the processes go."""

    def binding_label(self, b: NumaBinding) -> str:
        """Whose NUMA binding this is, in --explain: "local rank 0 → GPU1"."""


Units = Mapping[str, StrategyUnit]


def by_role(units: Units, role: Role) -> StrategyUnit:
    for unit in units.values():
        if unit.ROLE == role:
            return unit
    from smartlaunch.errors import PlanError
    raise PlanError(f"no strategy unit has the role {role.value}; register one (strategies/)")


@dataclass(frozen=True)
class Inputs:
    """What the decision is given before anything is measured. launched: earlier launches'
    rates; notes: reasons the caller adds; numactl: its path ("" absent, None: looked up);
    nodes: the fixed node count of a job this node decides for (0: none)."""
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
    """The GPUs other launches lease now."""


@dataclass(frozen=True)
class NeedProfile:
    """A dry run of the script on `gpu`; usable: the GPUs the decision may use."""
    gpu: int
    usable: tuple[int, ...]


@dataclass(frozen=True)
class NeedCurve:
    """The all-reduce curve of `gpus` up to max_bytes (None: every size), or None."""
    gpus: tuple[int, ...]
    max_bytes: int | None = None


@dataclass(frozen=True)
class NeedTrial:
    """A trial of `strategy` on `gpus`, "trial number of `of`"; attempt > 1: a new draw.
    Answered by a TrialResult."""
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
    """The all-reduce between the job's `nodes` nodes, one leader rank on each. Answered by
    a CommCurve, or a few words on why none was measured."""
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
    """What has been measured so far, given back to decide with each call (leased: None
    until read; profile: valid once `profiled`)."""
    leased: frozenset[int] | None = None
    profile: Any = None
    profiled: bool = False
    curves: Mapping[tuple[int, ...], Any] = field(default_factory=dict)
    trials: Mapping[tuple, TrialResult] = field(default_factory=dict)
    between: Any = None
    timings: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[Reason, ...] = ()

    def add(self, need: Need, answer: Any) -> "Measured":
        if isinstance(need, NeedLeases):
            return dataclasses.replace(self, leased=frozenset(answer))
        if isinstance(need, NeedProfile):
            return dataclasses.replace(self, profile=answer, profiled=True)
        if isinstance(need, NeedCurve):
            return dataclasses.replace(self, curves={**self.curves, need.gpus: answer})
        if isinstance(need, NeedNodes):
            return dataclasses.replace(self, between=answer)
        return dataclasses.replace(self, trials={**self.trials, need.key: answer})
