"""One process on one GPU (or the CPU): the baseline every other candidate is measured against."""
from __future__ import annotations

from smartlaunch.decide.api import Role, Variants
from smartlaunch.decide.cost import predict_single
from smartlaunch.decide.explain import placement, rank_binding
from smartlaunch.decide.plan import Candidate, Plan, Reason
from smartlaunch.decide.select import Choice
from smartlaunch.decide.words import gpu_list, ms, rate
from smartlaunch.vocab import Strategy

NAME = Strategy.SINGLE
COLLECTIVE = False
ROLE = Role.BASELINE
VARIANTS = Variants.FORBIDDEN
TORCHRUN = False
TRIAL = True
WORD = "single GPU"


def forced(ctx) -> Choice:
    return Choice(NAME, (ctx.usable[0],))


def candidates(ctx, forced) -> dict:
    gpus = (ctx.usable[0],)
    pred = predict_single(ctx.profile, ctx.model) if ctx.predictable else None
    return {(NAME, gpus): (Candidate(NAME, gpus), pred)}


def cpu_plan(request, policy, why: str, reasons: list, base: dict) -> Plan:
    text = f"{why}: one CPU process"
    if request.max_gpus and request.max_gpus > 1:
        text += (f"; --nproc-per-node {request.max_gpus} is not used without --strategy ddp "
                 f"(which runs {request.max_gpus} gloo ranks)")
    source = (policy.rule("decision.fallback_strategy") if request.strategy == "auto"
              else f"user: --strategy {request.strategy}")
    reasons.append(Reason(text, source))
    return Plan(NAME, "cpu", (), 1, request.max_gpus or 1, reasons=tuple(reasons), **base)


def plan_fields(ctx, choice) -> dict:
    # A single job may move to any GPU left free if its own is taken before its lease.
    return dict(nproc_per_node=1, fallback_gpus=ctx.left)


def sentence(ctx, c: Candidate, pred, error) -> str:
    how = "measured" if c.measured else "predicted"
    head = f"single {gpu_list(c.gpus)}"
    head += f": {how} {rate(c.predicted_samples_per_s)}" if c.speedup is not None else \
        ": no prediction (no usable profile)"
    if c.predicted_step_s is not None:
        head += f", {ms(c.predicted_step_s)} per step"
    return head


def short_name(c: Candidate) -> str:
    return "single GPU"


def named(c: Candidate) -> str:
    return f"single GPU{c.gpus[0]}"


def table_name(c: Candidate) -> str:
    return "single"


def headline(plan: Plan) -> str:
    return f"single process on {gpu_list(plan.gpus) if plan.gpus else 'the CPU'}"


line = headline


def placement_lines(plan: Plan) -> list[str]:
    return placement(plan, moves=True)


binding_label = rank_binding


# torchrun options only torch's agent carries out, with their defaults (an option this torch
# lacks reads as its default). Not --numa-binding: the process is bound to its GPU's NUMA node
# anyway (decide/prepare.py), and torch's binding fails on a machine without CUDA.
AGENT_OPTIONS = {"log_dir": None, "redirects": "0", "tee": "0", "max_restarts": 0,
                 "logs_specs": None, "duplicate_stdout_filters": [],
                 "duplicate_stderr_filters": [], "local_ranks_filter": "", "role": "default",
                 "event_log_handler": "null"}


def launcher(plan, ctx):
    """One process without torch's agent; through the agent (as torchrun --nproc-per-node 1)
    where the command line asks for what only the agent does (AGENT_OPTIONS: --log-dir,
    --redirects, --tee, --max-restarts, ...)."""
    args = ctx.torchrun_args
    if args is not None and any(getattr(args, k, v) not in (v, None) for k, v in
                                AGENT_OPTIONS.items()):
        from smartlaunch.launch.ddp import DDPLauncher
        return DDPLauncher(plan, ctx)
    from smartlaunch.launch.single import SingleLauncher
    return SingleLauncher(plan, ctx)
