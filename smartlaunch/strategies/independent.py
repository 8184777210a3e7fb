"""One job per variant (--each): a single GPU each, queued onto the free GPUs; or, with more
GPUs than variants, a DDP group each when that gives more samples/s (decide/pack.py)."""
from __future__ import annotations

from smartlaunch.decide import groups as G
from smartlaunch.decide import pack
from smartlaunch.decide.api import Role, Variants
from smartlaunch.decide.cost import Prediction, predict_single
from smartlaunch.decide.explain import placement
from smartlaunch.decide.plan import Candidate, Plan, Reason, VariantGroup
from smartlaunch.decide.words import gpu_list, rate, times
from smartlaunch.vocab import Strategy, format_ranges

NAME = Strategy.INDEPENDENT
COLLECTIVE = False
ROLE = Role.SWEEP
VARIANTS = Variants.REQUIRED
TORCHRUN = False
TRIAL = False      # a trial of one job is the single GPU's
WORD = "independent jobs"


def forced(ctx):
    return None        # the variants' candidate below; choose_auto weighs it


def candidates(ctx, forced) -> dict:
    if not ctx.request.variants:
        return {}
    k = min(len(ctx.request.variants), ctx.cap, len(ctx.usable))
    pool = tuple(ctx.usable[:k])   # more GPUs than jobs would sit idle
    pred = None
    if ctx.predictable:
        one = predict_single(ctx.profile, ctx.model)
        pred = Prediction(k, one.step_s, float(k), 1.0, 0.0, 0.0, 0, one.backward_share,
                          one.backward_share_known)
    out = {(NAME, pool): (Candidate(NAME, pool, per_variant=1), pred)}
    ctx.packings = pack.packings(ctx, NAME)
    for p in ctx.packings:
        out[p.key] = (Candidate(NAME, p.key[1], per_variant=p.k), pack.aggregate(p))
    return out


def prefer(ctx, key, pred, rival) -> bool:
    """The variants run side by side unless one job on the rival's GPUs is predicted faster
    (or the policy prefers independent jobs for sweeps)."""
    k, best = len(ctx.request.variants), rival[1]
    prefers = ctx.policy.decision.prefer_independent_for_sweeps
    rule = ctx.policy.rule("decision.prefer_independent_for_sweeps")
    if prefers or best is None or pred is None or pred.speedup >= best:
        why = ("the policy prefers independent jobs for sweeps" if prefers else
               f"{min(k, len(key[1]))} concurrent jobs give "
               f"{times(pred.speedup if pred else None)} one job's samples/s, {rival[0]} at best "
               f"{times(best)}")
        what = (f"{k} variants run side by side, one job each (a single GPU or a DDP group "
                f"below)" if ctx.packings else
                f"{k} variants → {k} independent single-GPU jobs on {gpu_list(key[1])}")
        ctx.reasons.append(Reason(f"{what}: {why}", rule))
        return True
    ctx.reasons.append(Reason(f"{k} variants run one after another with {rival[0]}: predicted "
                              f"{times(best)} beats {times(pred.speedup)} from independent jobs",
                              rule))
    return False


def cpu_plan(request, policy, why: str, reasons: list, base: dict) -> Plan:
    n = len(request.variants)
    reasons.append(Reason(f"{why}: {n} independent CPU job{'s' if n != 1 else ''}",
                          "user: --each" if request.strategy == "auto" else
                          "user: --strategy independent"))
    return Plan(NAME, "cpu", (), 1, 1, reasons=tuple(reasons), **base)


def plan_fields(ctx, choice) -> dict:
    packed = ctx.packed
    if packed is not None and len(choice.gpus) > len(ctx.request.variants):
        unit = pack.scaled_unit(ctx)
        groups = tuple(VariantGroup(i, unit.NAME, g, G.family_link(ctx.topology, g), s,
                                    packed.basis)
                       for i, (g, s) in enumerate(zip(packed.groups, packed.speedups)))
        return dict(nproc_per_node=packed.k, groups=groups)
    peak = ctx.profile.peak_gpu_mem_bytes if ctx.profile is not None else None
    per_gpu, note = G.jobs_per_gpu(ctx.topology, ctx.policy, choice.gpus, peak)
    if note:
        ctx.reasons.append(Reason(note, ctx.policy.rule("jobs.jobs_per_gpu")))
    return dict(nproc_per_node=1, jobs_per_gpu=per_gpu)


def sentence(ctx, c: Candidate, pred, error) -> str:
    how = "measured" if c.measured else "predicted"
    head = f"independent jobs on {gpu_list(c.gpus)}"
    if (c.per_variant or 1) > 1:
        head = f"{_groups_words(c)} ({c.per_variant} GPUs per variant)"
    if c.speedup is not None:
        one = "one GPU's" if (c.per_variant or 1) > 1 else "one job's"
        head += f": {how} {times(c.speedup)} {one} rate ({rate(c.predicted_samples_per_s)})"
    return head


def _groups_words(c) -> str:
    """"2 × DDP×2 on GPUs 0,1 | 2,3"."""
    k = c.per_variant
    groups = [c.gpus[i:i + k] for i in range(0, len(c.gpus), k)]
    return f"{len(groups)} × DDP×{k} on GPUs " + " | ".join(",".join(map(str, g)) for g in groups)


def _what(plan: Plan, on_cpu: str) -> str:
    n = len(plan.share())
    share = (f" (variant{'s' if n > 1 else ''} {format_ranges(plan.share())} of "
             f"{len(plan.variants)}: this node's share)" if plan.node_variants else "")
    if plan.groups:
        g = plan.groups[0]
        return (f"{n} variants, each as DDP×{len(g.gpus)} on its own group: GPUs "
                + " | ".join(",".join(map(str, x.gpus)) for x in plan.groups) + share)
    s = "s" if n != 1 else ""
    return (f"{n} independent single-GPU job{s} on {gpu_list(plan.gpus)}" if plan.gpus else
            f"{n} independent {on_cpu.format(s=s)}") + share


def headline(plan: Plan) -> str:
    return _what(plan, "CPU job{s}")


def line(plan: Plan) -> str:
    return _what(plan, "job{s} on the CPU")


def short_name(c: Candidate) -> str:
    if (c.per_variant or 1) > 1:
        return f"DDP×{c.per_variant} groups per variant"
    return "independent jobs"


def named(c: Candidate) -> str:
    if (c.per_variant or 1) > 1:
        return _groups_words(c)
    return f"independent jobs on {gpu_list(c.gpus)}"


def table_name(c: Candidate) -> str:
    if (c.per_variant or 1) > 1:
        return f"independent, DDP×{c.per_variant} each"
    return "independent"


def placement_lines(plan: Plan) -> list[str]:
    if plan.groups:
        return [*_group_lines(plan), *placement(plan)]
    at_once = (", ".join(f"GPU{g} {plan.jobs_on(g)}" for g in plan.gpus) if plan.gpus
               else f"{plan.nproc_per_node} on the CPU")
    return [f"jobs at once: {at_once}", *placement(plan)]


def _group_lines(plan: Plan) -> list[str]:
    """Each variant's group: its GPUs, link, rate, and each rank's NUMA binding."""
    from smartlaunch.decide.explain import cpu_ranges
    out = ["groups (one DDP job per variant, each with its own lease and rendezvous port):"]
    for g in plan.groups:
        args = " ".join(plan.variants[g.variant]) or "(no variant args)"
        speed = f"{g.basis} {times(g.speedup)} one GPU" if g.speedup is not None else "no rate"
        out.append(f"  variant {g.variant} ({args}): DDP×{len(g.gpus)} on {gpu_list(g.gpus)}"
                   f" (worst link {g.link_class}), {speed}")
        for b in g.numa:
            where = (f"NUMA node {b.numa_node}, CPUs {cpu_ranges(b.cpus)} via {b.mechanism}"
                     if b.mechanism != "none" else "not pinned")
            out.append(f"    local rank {b.local_rank} → GPU{b.gpu}: {where}")
        nccl = [e for e in g.env if e not in plan.env]
        if nccl:
            out.append("    NCCL: " + ", ".join(f"{e.name}={e.value}" for e in nccl))
    return out


def binding_label(b) -> str:
    return f"jobs on GPU{b.gpu}"


def launcher(plan, ctx):
    if plan.groups:     # each variant's group runs as a DDP launch of its own
        from smartlaunch.launch.groups import GroupsLauncher
        from smartlaunch.strategies import ddp
        return GroupsLauncher(plan, ctx, ddp.launcher)
    from smartlaunch.launch.independent import IndependentLauncher
    return IndependentLauncher(plan, ctx)
