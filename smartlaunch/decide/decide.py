"""The decision as one pure step: `decide(Inputs, Measured)` returns the final Plan or the
next Need (decide/api.py); it reads no file, starts no process and never waits. Steps:

  1. the request alone: an impossible one fails at once (UsageError, PolicyError, PlanError);
  2. NeedLeases: with every usable GPU leased, the plan waits without measuring (WAIT_REASON);
  3. NeedProfile: a dry run, only where auto has a real choice (needs_profile);
  4. the candidates and their predictions, each with its group's curve (NeedCurve);
  5. the choice: by the model, earlier launches, or trials (NeedTrial: select.py);
  6. the plan: NCCL variables, NUMA bindings (prepare.py), reasons, timings;
  7. NeedNodes: for a job across a fixed node count, how many nodes run it (nodes.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from smartlaunch.decide import groups as G
from smartlaunch.decide import pack
from smartlaunch.decide.api import (Inputs, Measured, Need, NeedCurve, NeedLeases, NeedNodes,
                                    NeedProfile, NeedTrial, Role, Units, Variants, by_role)
from smartlaunch.decide.cost import CostModel, Prediction, predict_ddp
from smartlaunch.decide.curves import derived_note, group_curves
from smartlaunch.decide.nodes import RULE_NODES, TwoLevelCurve, choose_nodes
from smartlaunch.decide.plan import Candidate, Plan, Reason, strategy_name
from smartlaunch.decide.prepare import prepare
from smartlaunch.decide.words import gpu_list
from smartlaunch.decide.describe import comm_summary, describe
from smartlaunch.decide.select import Choice, choose_auto, uncertainty
from smartlaunch.allocation import IDLE_RULE, idle_line
from smartlaunch.errors import NoFreeGPUError, PlanError, PolicyError, UsageError
from smartlaunch.policy.api import Policy
from smartlaunch.profile.api import CommCurve, ModelProfile
from smartlaunch.profile.feedback import MeasuredRate
from smartlaunch.request import Request
from smartlaunch.topology.api import Topology

WAIT_REASON = "every usable GPU is leased by another launch: no dry run"


def decide(inputs: Inputs, measured: Measured = Measured()) -> Plan | Need:
    """The final Plan, or the next Need. Raises UsageError, PolicyError, PlanError or
    NoFreeGPUError for a request that cannot run."""
    try:
        return _sequence(inputs, measured)
    except _Needed as need:
        return need.need


def resolve(inputs: Inputs, fulfil: Callable[[Need, Measured], Measured],
            measured: Measured = Measured(),
            timings: Callable[[], Mapping[str, float]] | None = None) -> Plan:
    """decide until a Plan comes back; fulfil(need, measured) returns measured with the
    need's answer added. timings(): seconds per stage, stated by the final plan."""
    while True:
        out = decide(inputs, measured)
        if isinstance(out, Plan):
            if timings is None:
                return out
            return _sequence(inputs, dataclasses.replace(measured, timings=dict(timings())))
        measured = fulfil(out, measured)


class _Needed(Exception):
    """Raised where a measurement is missing; decide returns its need."""
    def __init__(self, need: Need):
        super().__init__(need)
        self.need = need


def _sequence(i: Inputs, m: Measured) -> Plan:
    return _nodes(i, m, _steps(i, m))


def _steps(i: Inputs, m: Measured) -> Plan:
    r, topology, policy = i.request, i.topology, i.policy
    _choose(i, None, frozenset(), cheap=True)        # 1: the request alone
    if not topology.gpus:
        leased = frozenset()
    elif m.leased is None:
        raise _Needed(NeedLeases())
    else:
        leased = m.leased
    try:
        if leased:
            _choose(i, None, leased, cheap=True)
    except NoFreeGPUError:                             # 2: everything leased: wait, unmeasured
        return _finish(i, m, _choose(i, None, frozenset(), wait_reason=WAIT_REASON,
                                     trials=False), None)
    usable = [g.index for g in topology.gpus
              if g.index not in leased and not (g.busy and policy.decision.avoid_busy_gpus)
              and topology.healthy(g.index)]
    if needs_profile(r, topology, usable, policy):
        if not m.profiled:                             # 3: the dry run
            raise _Needed(NeedProfile(usable[0], tuple(usable)))
        profile = m.profile
    else:
        profile = None
    return _finish(i, m, _choose(i, profile, leased, measured=m), profile)   # 4-5


def _nodes(i: Inputs, m: Measured, plan: Plan) -> Plan:
    """7: how many of i.nodes nodes run the job, where choosable; on one node kept, the plan
    of the same job with --nnodes 1."""
    n = i.nodes
    if n < 2 or not choosable(plan):
        return plan
    if m.between is None:
        raise _Needed(NeedNodes(n, plan.profile.grad_bytes, strategy_name(plan.strategy),
                                plan.gpus, plan.link_class, plan.device == "cuda",
                                tuple(plan.env_dict().items())))

    def keep(why: str) -> Plan:
        return dataclasses.replace(plan, reasons=plan.reasons + (
            Reason(f"all {n} nodes: {why}", RULE_NODES),))
    if not isinstance(m.between, CommCurve):
        return keep(str(m.between))
    intra = None
    if plan.nproc_per_node > 1:
        if plan.comm is None:
            return keep("the within-node all-reduce curve is missing, so nothing to weigh")
        intra = CommCurve.from_points(plan.comm.world_size, plan.comm.backend, plan.comm.points)
    choice = choose_nodes(plan.profile, TwoLevelCurve(intra, m.between, plan.nproc_per_node),
                          allowed=lambda ranks: ranks in i.policy.decision.world_sizes)
    kept = (Reason(choice.text, RULE_NODES),)
    if choice.nodes > 1:
        return dataclasses.replace(plan, nnodes=str(choice.nodes), reasons=plan.reasons + kept)
    one = _sequence(dataclasses.replace(i, nodes=0, request=dataclasses.replace(
        i.request, nnodes="1", nnodes_from="")), m)
    word = i.units[one.strategy].WORD
    what = f"{word}×{one.nproc_per_node}" if one.nproc_per_node > 1 else word
    why = Reason(f"on the one node kept, the job is decided as a one-node job (as with "
                 f"--nnodes 1): {what} on {gpu_list(one.gpus)}", RULE_NODES)
    return dataclasses.replace(one, reasons=one.reasons + kept + (why,))


def choosable(plan: Plan) -> bool:
    """Whether the node count is a choice: a multi-node plan with a usable profile, not
    forced, not a sweep."""
    return (plan.multi_node and plan.profile is not None and plan.profile.usable
            and bool(plan.profile.step_time_s) and not plan.forced and not plan.node_variants)


def needs_profile(request: Request, topology: Topology, usable: list[int],
                  policy: Policy) -> bool:
    """Whether auto has a real choice, so a dry run pays off."""
    if request.strategy != "auto" or request.no_python or not topology.gpus:
        return False
    if request.multi_node:
        lo, _, hi = request.nnodes.partition(":")
        return (hi or lo) == lo and not request.variants
    room = min(request.max_gpus or len(usable), len(usable))
    if request.variants:
        return any(k >= 2 and len(request.variants) * k <= room
                   for k in policy.decision.world_sizes)
    return room > 1


def _finish(i: Inputs, m: Measured, plan: Plan, profile: ModelProfile | None) -> Plan:
    """6: the workers' environment and bindings, the added reasons, the timings."""
    plan = prepare(plan, i.topology, i.policy, i.environ, units=i.units, numactl=i.numactl,
                   torchrun_numa=i.torchrun_numa)
    model_note = (i.model_note,) if i.model_note is not None and _predictable(i, profile) else ()
    idle = idle_line(i.allocation, plan)
    idle_note = (Reason(idle, IDLE_RULE),) if idle else ()
    reasons = plan.reasons + i.notes + m.notes + model_note + idle_note
    return dataclasses.replace(plan, reasons=reasons, timings=dict(m.timings))


def _predictable(i: Inputs, profile: ModelProfile | None) -> bool:
    return len(i.topology.gpus) >= 2 and profile is not None and profile.usable


class _Trials:
    """A trial's measured answer, else a NeedTrial numbered "trial k of n"."""

    def __init__(self, measured: Measured):
        self.measured = measured
        self.k, self.n = 0, 0
        self.why = {k: t.why for k, t in measured.trials.items() if t.why}

    def planned(self, n: int) -> None:
        self.n = self.k + n

    def __call__(self, strategy, gpus, attempt: int = 1) -> float | None:
        self.k += 1
        need = NeedTrial(strategy, tuple(gpus), self.k, max(self.n, self.k), attempt)
        got = self.measured.trials.get(need.key)
        if got is None:
            raise _Needed(need)
        return got.samples_per_s


def _curves(measured: Measured, profile: ModelProfile | None):
    """comm_for(group): the measured curve, else a NeedCurve up to the gradient size."""
    top = None
    if profile is not None and profile.grad_bytes:
        top = max(1 << 20, 1 << (int(profile.grad_bytes) - 1).bit_length())

    def comm_for(group):
        group = tuple(group)
        if group not in measured.curves:
            raise _Needed(NeedCurve(group, top))
        return measured.curves[group]
    return comm_for


def _choose(i: Inputs, profile: ModelProfile | None, unavailable: frozenset[int], *,
            cheap: bool = False, trials: bool = True, wait_reason: str = "",
            measured: Measured = Measured()) -> Plan:
    """Steps 4-5: the Plan before prepare. cheap: measure nothing (finds what cannot run);
    trials: whether a trial may be asked for."""
    request, topology, policy, units, environ = i.request, i.topology, i.policy, i.units, i.environ
    d = policy.decision
    model = i.model if _predictable(i, profile) else CostModel()
    launched = i.launched if profile is not None else None
    if cheap or not topology.gpus:
        comm_for, trial = (lambda g: None), None
    else:
        comm_for = _curves(measured, profile)
        trial = _Trials(measured) if trials and d.trials and not request.no_python else None
    forced = request.strategy != "auto"
    reasons: list[Reason] = []
    if request.multi_node:
        _check_multi_node(request, units)
    if forced:
        if request.strategy not in d.allowed_strategies:
            raise PolicyError(
                f"--strategy {request.strategy} is not allowed by the policy "
                f"({policy.rule('decision.allowed_strategies')}); use one of "
                f"{', '.join(d.allowed_strategies)} or --strategy auto")
        reasons.append(Reason(f"strategy {request.strategy} was asked for; the model only "
                              f"informs", f"user: --strategy {request.strategy}"))
    _check_variants(request, policy, units)
    topo = {"fingerprint": topology.fingerprint(), "source": topology.source,
            "note": topology.note, "hostname": topology.hostname,
            "hardware": topology.hardware(),
            "hardware_fingerprint": topology.hardware_fingerprint()}
    base = dict(profile=profile, topology=topo, nnodes=request.nnodes, forced=forced,
                variants=tuple(request.variants), wait_for_lease=not request.no_wait,
                wait_timeout_s=policy.jobs.wait_timeout_s, wait_reason=wait_reason,
                command=request.worker_command())
    if not topology.gpus:
        if request.multi_node:
            return _cpu_multi_node(request, reasons, base, units)
        return _cpu_plan(request, policy, reasons, base, units)

    visible = len(topology.gpus)
    cap = visible
    if request.max_gpus is not None:
        if request.max_gpus > visible:
            cvd = (environ or {}).get("CUDA_VISIBLE_DEVICES")
            seen = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else \
                G.gpu_list_short(g.index for g in topology.gpus)
            raise UsageError(f"--nproc-per-node {request.max_gpus} exceeds the {visible} GPUs "
                             f"visible to this job ({seen}); lower it or use --nproc-per-node gpu")
        cap = request.max_gpus
        reasons.append(Reason(f"at most {cap} GPU(s) asked for", f"user: --nproc-per-node {cap}"))
    if d.max_gpus is not None and d.max_gpus < cap:
        cap = max(1, d.max_gpus)
        reasons.append(Reason(f"the policy caps a job at {cap} GPU(s)",
                              policy.rule("decision.max_gpus")))

    peak = profile.peak_gpu_mem_bytes if profile is not None else None
    usable, excluded = _screen(topology, policy, peak, unavailable, forced, reasons)
    for e in excluded:
        rule = {"unhealthy": "decision.avoid_unhealthy_gpus", "busy": "decision.avoid_busy_gpus",
                "memory": "decision.memory_headroom"}.get(e.why)
        reasons.append(Reason(e.text + " → not used",
                              policy.rule(rule) if rule else "lease: another launch holds it"))

    ctx = Ctx(request, topology, policy, profile, comm_for, trial, model, usable, cap, reasons,
              units, launched=dict(launched or {}), excluded=excluded)
    if request.multi_node:
        choice = _multi_node(request, topology, policy, usable, excluded, cap, reasons,
                             units)
        if len(choice.gpus) > 1:
            ctx.predict([choice.gpus])  # the within-node level across nodes (nodes.py)
    elif forced:
        choice = units[request.strategy].forced(ctx)
    else:
        choice = None
    if choice is None:
        _note_world_sizes(ctx)
    cands = ctx.candidates(choice)
    derived = derived_note(topology, ctx.curves)
    if derived:
        reasons.append(Reason(derived, "derived curves: docs/decision.md"))
    if choice is None:
        choice = choose_auto(ctx, cands)
        if ctx.packings and (choice.strategy, choice.gpus) in cands \
                and units[choice.strategy].ROLE == Role.SWEEP:
            choice = pack.choose(ctx, cands, (choice.strategy, choice.gpus)) or choice
    plan_cands = describe(ctx, choice, cands)
    curve = ctx.curves.get(choice.gpus) or next(iter(ctx.curves.values()), None)
    ctx.left = tuple(g for g in usable if g not in choice.gpus)
    fields = units[choice.strategy].plan_fields(ctx, choice)
    return Plan(strategy=choice.strategy, device="cuda", gpus=choice.gpus, requested_max=cap,
                candidates=plan_cands, reasons=tuple(reasons), left_free=ctx.left,
                comm=comm_summary(curve, profile),
                uncertainty_band=round(uncertainty(ctx)[0], 4), **fields, **base)


def _cpu_plan(request: Request, policy: Policy, reasons: list[Reason], base: dict,
              units: Units) -> Plan:
    """Without GPUs: variants as independent jobs, else one process; forced as asked."""
    why = f"no GPUs visible ({base['topology']['note'] or 'NVML found none'})"
    name = request.strategy if request.strategy != "auto" else \
        by_role(units, Role.SWEEP if request.variants else Role.BASELINE).NAME
    return units[name].cpu_plan(request, policy, why, reasons, base)


def _check_variants(request: Request, policy: Policy, units: Units) -> None:
    takers = [u for u in units.values() if u.VARIANTS != Variants.FORBIDDEN]
    n = len(request.variants)
    unit = units.get(request.strategy)
    if unit is not None and n and unit.VARIANTS == Variants.FORBIDDEN:
        names = " or ".join(f"--strategy {strategy_name(u.NAME)}" for u in takers)
        raise UsageError(f"--strategy {request.strategy} cannot run {n} variants; use "
                         f"{names} (or auto) with --each")
    if unit is not None and not n and unit.VARIANTS == Variants.REQUIRED:
        base = strategy_name(by_role(units, Role.BASELINE).NAME)
        raise UsageError(f"--strategy {request.strategy} needs variants: give --each or "
                         f"--each-file, or use --strategy {base}")
    allowed = policy.decision.allowed_strategies
    if n and not any(strategy_name(u.NAME) in allowed for u in takers):
        raise PolicyError(f"the policy forbids {' and '.join(u.WORD for u in takers)} "
                          f"({policy.rule('decision.allowed_strategies')}); run the "
                          f"{n} variants one at a time without --each")


def _screen(topology, policy, peak, unavailable, forced, reasons):
    usable, excluded = G.screen(topology, policy, peak, unavailable)
    mem = [e for e in excluded if e.why == "memory"]
    if peak and mem and not usable:
        d = policy.decision
        roomiest = max((e.gpu for e in mem), key=lambda i: G.free_bytes(topology, i))
        text = (f"the profiled peak {G.gib(peak)} does not fit GPU{roomiest}'s "
                f"{G.gib(G.free_bytes(topology, roomiest))} free × {d.memory_headroom:.2f} headroom, "
                f"and DDP replicates the model on every GPU")
        if not forced:
            raise PlanError(text + ": reduce the batch size or use a larger GPU")
        reasons.append(Reason(text + "; launching anyway because the strategy was forced "
                              "(expect out-of-memory)", policy.rule("decision.memory_headroom")))
        usable, excluded = G.screen(topology, policy, None, unavailable)
    if not usable:
        waitable = [e for e in excluded if e.why in ("busy", "leased")]
        detail = "; ".join(e.text for e in excluded)
        if waitable:
            raise NoFreeGPUError(f"no free GPU ({detail}); wait for one or drop --no-wait")
        raise PlanError(f"no usable GPU ({detail}); fix or replace the GPUs, or run on another node")
    return usable, excluded


def _note_world_sizes(ctx) -> None:
    """Says which group sizes decision.world_sizes keeps the automatic choice from."""
    d = ctx.policy.decision
    scaled = [u for u in ctx.units.values() if u.ROLE == Role.SCALED
              and strategy_name(u.NAME) in d.allowed_strategies]
    out = [n for n in range(2, min(ctx.cap, len(ctx.usable)) + 1) if n not in d.world_sizes]
    if not scaled or not out or ctx.request.multi_node:
        return
    if len(scaled) == 1:      # "DDP×3, ×5, ×6 and ×7"
        sizes = f"{scaled[0].WORD}×{out[0]}" + "".join(
            f"{' and' if i == len(out) - 1 else ','} ×{n}" for i, n in enumerate(out) if i)
    else:                     # "DDP×3, ×5 and DDP-accum×3, ×5"
        sizes = " and ".join(f"{u.WORD}×" + ", ×".join(map(str, out)) for u in scaled)
    torchrun = next((u for u in scaled if u.TORCHRUN), scaled[0])
    n = str(out[0]) if len(out) == 1 else "N"
    ctx.reasons.append(Reason(
        f"{sizes} {'is' if len(out) * len(scaled) == 1 else 'are'} not considered: the "
        f"global batch is the "
        f"world size × the per-rank batch, and the policy's world sizes are the ones scripts, "
        f"samplers and LR schedules usually assume; --strategy {strategy_name(torchrun.NAME)} "
        f"--nproc-per-node {n} runs {'it' if len(out) == 1 else 'any N'} as asked",
        ctx.policy.rule("decision.world_sizes")))


def short_of(topology, usable, excluded, n, what) -> None:
    waitable = [e for e in excluded if e.why in ("busy", "leased")]
    detail = "; ".join(e.text for e in excluded) or "no other GPUs"
    msg = (f"{what} needs {n} GPUs but only {len(usable)} are usable ({detail}); "
           f"lower --nproc-per-node or free a GPU")
    raise (NoFreeGPUError if waitable else PlanError)(msg)


def _torchrun_unit(units: Units):
    return next(u for u in units.values() if u.TORCHRUN)


def _check_multi_node(request: Request, units: Units) -> None:
    """A job across nodes is one torchrun job (a sweep is split per node before this)."""
    if request.variants:
        raise ValueError("a sweep across nodes is decided for one node's share: "
                         "nodes.sweep_across_nodes(request).request")
    torchrun = strategy_name(_torchrun_unit(units).NAME)
    unit = units.get(request.strategy)
    if unit is not None and not unit.TORCHRUN and unit.VARIANTS != Variants.REQUIRED:
        raise UsageError(f"--strategy {request.strategy} runs one process on one node, but "
                         f"{request.nnodes_words()} makes one job across nodes; use --strategy "
                         f"{torchrun} (or auto, which launches it as torchrun would), --each "
                         f"to split a sweep over the nodes, or --nnodes 1 on one node")
    if unit is not None and unit.VARIANTS == Variants.REQUIRED:
        raise UsageError(f"--strategy {request.strategy} needs variants: give --each or "
                         f"--each-file to split them over the nodes ({request.nnodes_words()}), "
                         f"or use --strategy {torchrun} for one job across nodes")


def _multi_node_reason(request: Request, unit, n: int, where: str, given: str) -> Reason:
    return Reason(
        f"multi-node job ({request.nnodes_words()}): launched as torchrun would, {unit.WORD} "
        f"with {n} process(es) on this node {where}; one node decides for every node, and "
        f"only how many nodes to use is measured (between nodes), never what runs on each",
        given)


def _cpu_multi_node(request: Request, reasons: list[Reason], base: dict, units: Units) -> Plan:
    """No GPUs on a node of a multi-node job: torchrun's nproc-per-node ranks over gloo."""
    unit = _torchrun_unit(units)
    n, given = request.cpu_ranks()
    reasons.append(_multi_node_reason(request, unit, n, "(the CPU over gloo: no GPU visible)",
                                      given))
    return Plan(unit.NAME, "cpu", (), n, n, reasons=tuple(reasons), **base)


def _multi_node(request, topology, policy, usable, excluded, cap, reasons, units) -> Choice:
    """What torchrun would launch on every allowed local GPU; every node decides the same."""
    unit = _torchrun_unit(units)
    sized = policy.decision.largest_world_size(cap) if request.max_gpus is None else None
    if sized is not None and sized != cap:
        reasons.append(Reason(f"{unit.WORD} on {sized} of the {cap} local GPUs: the largest "
                              f"of the policy's world sizes; --nproc-per-node {cap} uses them "
                              f"all", policy.rule("decision.world_sizes")))
        cap = sized
    if len(usable) < cap:
        short_of(topology, usable, excluded, cap, f"a {request.nnodes}-node launch")
    group = G.best_group(topology, usable, cap, policy.decision.ddp_link_classes) \
        if cap > 1 else (usable[0],)
    if group is None:
        raise PolicyError(f"no {cap} usable GPUs are linked by a class the policy allows for DDP "
                          f"({policy.rule('decision.ddp_link_classes')}); lower --nproc-per-node")
    given = f"user: --nproc-per-node {request.max_gpus}" if request.max_gpus is not None else \
        "--nproc-per-node not given: every allowed local GPU"
    reasons.append(_multi_node_reason(request, unit, cap, f"({G.gpu_list_short(group)})",
                                      given))
    return Choice(unit.NAME, group, "multi-node")


@dataclasses.dataclass
class Ctx:
    """What one choice (steps 4-5) works with and gathers; lives for one call of decide."""
    request: Request
    topology: Topology
    policy: Policy
    profile: ModelProfile | None
    comm_for: Callable[[tuple[int, ...]], CommCurve | None]   # measured, or a NeedCurve
    trial: object | None                # decide's _Trials, or None: no trial may run
    model: CostModel
    usable: list[int]                   # the GPUs the choice may use
    cap: int                            # the most GPUs the job may use
    reasons: list[Reason]
    units: Units
    launched: dict[str, MeasuredRate] = dataclasses.field(default_factory=dict)
    excluded: list = dataclasses.field(default_factory=list)   # groups.Excluded, and why
    curves: dict[tuple[int, ...], CommCurve] = dataclasses.field(default_factory=dict)
    scaled_keys: list = dataclasses.field(default_factory=list)  # every SCALED candidate
    preds: dict = dataclasses.field(default_factory=dict)  # SCALED key -> Prediction or None
    left: tuple[int, ...] = ()          # usable GPUs the chosen plan does not hold
    packings: list = dataclasses.field(default_factory=list)   # pack.Packing: variants as groups
    packed: object = None               # pack.Packed: the chosen one, None: one GPU each

    @property
    def predictable(self) -> bool:
        return self.profile is not None and self.profile.usable

    def candidates(self, forced: Choice | None) -> dict[tuple, tuple[Candidate, Prediction | None]]:
        """(strategy, gpus) -> (candidate, prediction or None), in the units' order."""
        out: dict = {}
        units = self.units.values()
        if self.request.multi_node and forced is not None:
            units = [by_role(self.units, Role.BASELINE)]   # the node group: _multi_node's
        for unit in units:
            out.update(unit.candidates(self, forced))
        keep = (forced.strategy, forced.gpus) if forced is not None else None
        return {k: v for k, v in out.items() if k == keep or self.world_size_ok(k)}

    def world_size_ok(self, key) -> bool:
        """Whether a SCALED key's group size is in decision.world_sizes (others: True)."""
        unit = self.units[key[0]]
        return unit.ROLE != Role.SCALED or len(key[1]) in self.policy.decision.world_sizes

    def predict(self, groups) -> dict[tuple[int, ...], Prediction | None]:
        """The DDP prediction of every group, with its curve measured or derived."""
        groups = [tuple(g) for g in groups]
        if not self.predictable:
            return {g: None for g in groups}
        known = [g for g, c in self.curves.items() if c is not None and not c.derived_from]
        got = group_curves([*groups, *known], self.topology,
                           lambda g: self.curves.get(g) or self.comm_for(g))
        self.curves.update({g: got[g] for g in groups if got.get(g) is not None})
        return {g: predict_ddp(self.profile, got[g], len(g), self.model)
                if got.get(g) is not None else None for g in groups}
