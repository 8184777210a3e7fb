"""The decide half of a strategy unit (smartlaunch/strategies/): what decide() and --explain
ask of a strategy. decide/ names no strategy where a unit can answer; the caller passes the
units (pipeline: strategies.REGISTRY), keyed by their NAME."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from smartlaunch.decide.cost import Prediction
from smartlaunch.decide.plan import Candidate, NumaBinding, Plan


class StrategyUnit(Protocol):
    NAME: str          # a vocab.Strategy member; the Plan's and the candidates' `strategy`
    # Ranks that torch's agent starts and that talk through NCCL: they get the NCCL table of
    # their group's link class, and torchrun's own --numa-binding replaces smartlaunch's.
    COLLECTIVE: bool

    def forced(self, ctx) -> Any:
        """The Choice (select.Choice) when --strategy names this unit, or None to let the
        candidates decide. ctx: decide's _Ctx (request, topology, policy, usable GPUs...)."""

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
