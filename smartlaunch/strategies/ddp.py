"""DDP with torchrun's semantics: one rank per GPU on the best-linked group, for every group
size of decision.world_sizes the caps and the policy's link classes allow (an explicit
--strategy ddp --nproc-per-node N runs N whatever the list says)."""
from __future__ import annotations

from smartlaunch.decide import groups as G
from smartlaunch.decide.api import Role, Variants
from smartlaunch.decide.decide import short_of
from smartlaunch.decide.explain import placement, rank_binding
from smartlaunch.decide.plan import Candidate, Plan, Reason
from smartlaunch.decide.describe import group_note
from smartlaunch.decide.select import Choice
from smartlaunch.decide.words import gpu_list, ms, pct, rate, times
from smartlaunch.errors import PlanError, PolicyError
from smartlaunch.vocab import Strategy

NAME = Strategy.DDP
COLLECTIVE = True
ROLE = Role.SCALED
VARIANTS = Variants.FORBIDDEN      # auto may still run variants one after another with DDP
TORCHRUN = True
TRIAL = True
WORD = "DDP"


def forced(ctx) -> Choice:
    request, usable, policy = ctx.request, ctx.usable, ctx.policy
    n = ctx.cap if request.max_gpus is not None else min(ctx.cap, len(usable))
    if request.max_gpus is None and n >= 2:
        sized = policy.decision.largest_world_size(n)
        if sized is None:
            raise PlanError(f"--strategy ddp: no world size of 2 to {n} GPUs is in the policy "
                            f"({policy.rule('decision.world_sizes')}); give --nproc-per-node N "
                            f"or add a size to decision.world_sizes")
        if sized != n:
            ctx.reasons.append(Reason(
                f"DDP on {sized} of the {n} usable GPUs: the largest of the policy's world "
                f"sizes (the global batch is the world size × the per-rank batch); "
                f"--nproc-per-node {n} uses them all", policy.rule("decision.world_sizes")))
        n = sized
    if n < (1 if request.max_gpus == 1 else 2):     # --nproc-per-node 1: one rank, as torchrun
        raise PlanError(f"--strategy ddp needs at least 2 usable GPUs; this job may use {n} "
                        f"({G.gpu_list_short(usable)} usable): use --strategy single, "
                        f"or free a GPU")
    if len(usable) < n:
        short_of(ctx.topology, usable, ctx.excluded, n, "--strategy ddp")
    group = G.best_group(ctx.topology, usable, n, policy.decision.ddp_link_classes)
    if group is None:
        raise PolicyError(f"no {n} usable GPUs are linked by a class the policy allows for DDP "
                          f"({policy.rule('decision.ddp_link_classes')}); use --strategy "
                          f"single or fewer GPUs")
    return Choice(NAME, group)


def candidates(ctx, forced) -> dict:
    out: dict = {}
    d = ctx.policy.decision
    top = min(ctx.cap, len(ctx.usable))
    ddp_ok = NAME in d.allowed_strategies or (forced and forced.strategy == NAME)
    if top >= 2 and not ddp_ok:
        ctx.reasons.append(Reason("DDP is not considered: the policy does not allow it",
                                  ctx.policy.rule("decision.allowed_strategies")))
    groups = []
    for n in range(2, top + 1) if ddp_ok else ():
        mine = forced and forced.strategy == NAME and len(forced.gpus) == n
        if not mine and n not in d.world_sizes:
            continue       # decision.world_sizes: decide says so (_note_world_sizes)
        if mine:
            group = forced.gpus
        else:
            group = G.best_group(ctx.topology, ctx.usable, n, d.ddp_link_classes)
        if group is None:
            any_group = G.best_group(ctx.topology, ctx.usable, n, G.ALL_FAMILIES)
            ctx.reasons.append(Reason(
                f"DDP×{n} is not considered: every group of {n} usable GPUs has a link the "
                f"policy forbids for DDP (best is {G.family_link(ctx.topology, any_group)} "
                f"on {G.gpu_list_short(any_group)})",
                ctx.policy.rule("decision.ddp_link_classes")))
            continue
        groups.append(group)
    preds = ctx.predict(groups)         # all at once: one measured curve gives its kind's
    for group in groups:
        out[(NAME, group)] = (Candidate(NAME, group), preds[group])
    return out


def cpu_plan(request, policy, why: str, reasons: list, base: dict) -> Plan:
    n, given = request.cpu_ranks()
    reasons.append(Reason(f"{why}: DDP with {n} CPU rank(s) over gloo, as asked",
                          f"user: --strategy ddp; {given}"))
    return Plan(NAME, "cpu", (), n, n, reasons=tuple(reasons), **base)


def plan_fields(ctx, choice) -> dict:
    return dict(nproc_per_node=len(choice.gpus),
                link_class=G.family_link(ctx.topology, choice.gpus))


def sentence(ctx, c: Candidate, pred, error) -> str:
    n = len(c.gpus)
    head = f"DDP×{n} on {gpu_list(c.gpus)} ({group_note(ctx, c.gpus)})"
    if c.speedup is None:
        return head + ": no prediction"
    if c.measured:
        return (head + f" measured {times(c.speedup)} "
                f"({pct(c.efficiency)} efficiency, {rate(c.predicted_samples_per_s)})")
    return (head + f" predicted {times(c.speedup)} ({error[1]} ±{pct(error[0])}; "
            f"{pct(c.efficiency)} efficiency, all-reduce {ms(c.allreduce_s)} costing "
            f"{ms(pred.comm_cost_s)} of {ms(c.predicted_step_s)} per step)")


def short_name(c: Candidate) -> str:
    return f"DDP×{len(c.gpus)}"


table_name = short_name


def named(c: Candidate) -> str:
    return f"DDP×{len(c.gpus)} on {gpu_list(c.gpus)}"


def _what(plan: Plan) -> str:
    return f"DDP×{plan.nproc_per_node} on {gpu_list(plan.gpus) if plan.gpus else 'the CPU'}"


def headline(plan: Plan) -> str:
    return _what(plan) + (f" (worst link {plan.link_class})" if plan.link_class else "")


def line(plan: Plan) -> str:
    what = _what(plan)
    if plan.link_class:
        what += f" ({plan.link_class})"
    if plan.multi_node:
        what += f" per node, nnodes {plan.nnodes}"
    return what


placement_lines = placement
binding_label = rank_binding


def launcher(plan, ctx):
    from smartlaunch.launch.ddp import DDPLauncher
    return DDPLauncher(plan, ctx)
