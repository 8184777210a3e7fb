"""One single-GPU job per variant (--each), queued onto the free GPUs."""
from __future__ import annotations

from smartlaunch.decide import groups as G
from smartlaunch.decide.api import Role, Variants
from smartlaunch.decide.cost import Prediction, predict_single
from smartlaunch.decide.explain import placement
from smartlaunch.decide.plan import Candidate, Plan, Reason
from smartlaunch.decide.words import gpu_list, rate, times
from smartlaunch.vocab import Strategy

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
    return {(NAME, pool): (Candidate(NAME, pool), pred)}


def prefer(ctx, key, pred, rival) -> bool:
    """The variants run side by side unless one job on the rival's GPUs is predicted faster
    than k jobs at once (or the policy prefers independent jobs for sweeps outright)."""
    k, best = len(ctx.request.variants), rival[1]
    prefers = ctx.policy.decision.prefer_independent_for_sweeps
    rule = ctx.policy.rule("decision.prefer_independent_for_sweeps")
    if prefers or best is None or pred is None or pred.speedup >= best:
        why = ("the policy prefers independent jobs for sweeps" if prefers else
               f"{min(k, len(key[1]))} concurrent jobs give "
               f"{times(pred.speedup if pred else None)} one job's samples/s, {rival[0]} at best {times(best)}")
        ctx.reasons.append(Reason(f"{k} variants → {k} independent single-GPU jobs on "
                                  f"{gpu_list(key[1])}: {why}", rule))
        return True
    ctx.reasons.append(Reason(f"{k} variants run one after another with {rival[0]}: predicted "
                              f"{times(best)} beats {times(pred.speedup)} from independent jobs",
                              rule))
    return False


def cpu_plan(request, policy, why: str, reasons: list, base: dict) -> Plan:
    reasons.append(Reason(f"{why}: {len(request.variants)} independent CPU jobs",
                          "user: --each" if request.strategy == "auto" else
                          "user: --strategy independent"))
    return Plan(NAME, "cpu", (), 1, 1, reasons=tuple(reasons), **base)


def plan_fields(ctx, choice) -> dict:
    peak = ctx.profile.peak_gpu_mem_bytes if ctx.profile is not None else None
    per_gpu, note = G.jobs_per_gpu(ctx.topology, ctx.policy, choice.gpus, peak)
    if note:
        ctx.reasons.append(Reason(note, ctx.policy.rule("jobs.jobs_per_gpu")))
    return dict(nproc_per_node=1, jobs_per_gpu=per_gpu)


def sentence(ctx, c: Candidate, pred, error) -> str:
    how = "measured" if c.measured else "predicted"
    head = f"independent jobs on {gpu_list(c.gpus)}"
    if c.speedup is not None:
        head += f": {how} {times(c.speedup)} one job's rate ({rate(c.predicted_samples_per_s)})"
    return head


def _what(plan: Plan, on_cpu: str) -> str:
    n = len(plan.variants)
    return f"{n} independent single-GPU jobs on {gpu_list(plan.gpus)}" if plan.gpus else \
        f"{n} independent {on_cpu}"


def headline(plan: Plan) -> str:
    return _what(plan, "CPU jobs")


def line(plan: Plan) -> str:
    return _what(plan, "jobs on the CPU")


def short_name(c: Candidate) -> str:
    return "independent jobs"


def named(c: Candidate) -> str:
    return f"independent jobs on {gpu_list(c.gpus)}"


def table_name(c: Candidate) -> str:
    return "independent"


def placement_lines(plan: Plan) -> list[str]:
    at_once = (", ".join(f"GPU{g} {plan.jobs_on(g)}" for g in plan.gpus) if plan.gpus
               else f"{plan.nproc_per_node} on the CPU")
    return [f"jobs at once: {at_once}", *placement(plan)]


def binding_label(b) -> str:
    return f"jobs on GPU{b.gpu}"


def launcher(plan, ctx):
    from smartlaunch.launch.independent import IndependentLauncher
    return IndependentLauncher(plan, ctx)
