"""--each on more GPUs than variants: whether each variant runs as a DDP group of k GPUs.

For every k of decision.world_sizes with V × k <= G, the V variants may run as V disjoint
DDP×k groups. The first group's DDP×k is judged as choose_auto judges one job; the others
scale it by their own prediction. A k wins when its mean efficiency meets the policy and it
gives more samples/s than single-GPU jobs; ties go to fewer GPUs.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from smartlaunch.decide import groups as G
from smartlaunch.decide.api import Role
from smartlaunch.decide.cost import Prediction
from smartlaunch.decide.plan import Reason, strategy_name
from smartlaunch.decide.select import Choice, _baseline, choose_auto
from smartlaunch.decide.words import gpu_list, pct, rate, times


@dataclass(frozen=True)
class Packing:
    """One way to run the variants as DDP groups; key: the SWEEP candidate's key."""
    key: tuple
    k: int
    groups: tuple[tuple[int, ...], ...]
    preds: tuple[Prediction | None, ...]     # each group's DDP×k prediction, None: not known


@dataclass(frozen=True)
class Packed:
    k: int
    groups: tuple[tuple[int, ...], ...]
    speedups: tuple[float | None, ...]       # each group over one GPU
    basis: str                               # measured | corrected | predicted | launch


def disjoint_groups(topology, usable, k: int, v: int, families) -> tuple | None:
    """v disjoint groups of k GPUs, each the best-linked of those left, or None."""
    pool, out = list(usable), []
    for _ in range(v):
        group = G.best_group(topology, pool, k, families)
        if group is None:
            return None
        out.append(group)
        pool = [g for g in pool if g not in group]
    return tuple(out)


def scaled_unit(ctx):
    return next((u for u in ctx.units.values() if u.ROLE == Role.SCALED and u.TORCHRUN), None)


def sizes(ctx) -> list[int]:
    """The group sizes k >= 2 the variants may get: V × k within the GPUs allowed."""
    v = len(ctx.request.variants)
    room = min(ctx.cap, len(ctx.usable))
    return [k for k in sorted(ctx.policy.decision.world_sizes) if k >= 2 and v * k <= room]


def packings(ctx, name) -> list[Packing]:
    """Every packing allowed (auto only); name: the SWEEP unit's."""
    unit, v = scaled_unit(ctx), len(ctx.request.variants)
    d = ctx.policy.decision
    if ctx.request.strategy != "auto" or unit is None or v < 1 or not sizes(ctx):
        return []
    if strategy_name(unit.NAME) not in d.allowed_strategies:
        ctx.reasons.append(Reason(
            f"{v} variant(s) on {min(ctx.cap, len(ctx.usable))} GPUs: no {unit.WORD} group per "
            f"variant, the policy does not allow {unit.WORD}",
            ctx.policy.rule("decision.allowed_strategies")))
        return []
    out = []
    for k in sizes(ctx):
        groups = disjoint_groups(ctx.topology, ctx.usable, k, v, d.ddp_link_classes)
        if groups is None:
            ctx.reasons.append(Reason(
                f"{v} × {unit.WORD}×{k} is not considered: the usable GPUs do not make {v} "
                f"disjoint groups of {k} linked by classes the policy allows for {unit.WORD}",
                ctx.policy.rule("decision.ddp_link_classes")))
            continue
        key = (name, tuple(itertools.chain(*groups)))
        out.append(Packing(key, k, groups, _predictions(ctx, groups)))
    return out


def _predictions(ctx, groups) -> tuple[Prediction | None, ...]:
    """Each group's prediction; a group linked as an earlier one reuses its curve."""
    if not ctx.predictable:
        return tuple(None for _ in groups)
    out, seen = [], {}
    for group in groups:
        like = seen.setdefault(_shape(ctx.topology, group), group)
        if like in ctx.curves:
            ctx.curves.setdefault(group, ctx.curves[like])
        out.append(ctx.predict([group])[group])
    return tuple(out)


def _shape(topology, group) -> tuple:
    pairs = sorted(topology.link(a, b).link_class for a, b in itertools.combinations(group, 2))
    return (len(group), tuple(pairs), G.numa_nodes(topology, group), G.pcie_lanes(topology, group))


def aggregate(p: Packing) -> Prediction | None:
    """The packing as one Prediction over its V × k GPUs (speedups summed)."""
    if not p.preds or any(x is None for x in p.preds):
        return None
    total = sum(x.speedup for x in p.preds)
    n = len(p.key[1])
    first = p.preds[0]
    step = first.step_s * first.speedup * n / (first.n * total) if total else first.step_s
    return Prediction(n, step, total, total / n, first.allreduce_s, first.exposed_s,
                      first.buckets, first.backward_share, first.backward_share_known,
                      first.comm_cost_s)


def choose(ctx, cands: dict, sweep_key):
    """The sweep's Choice (a packing or sweep_key's single-GPU jobs); None: no packing."""
    packs = [p for p in ctx.packings if p.key in cands]
    unit = scaled_unit(ctx)
    if not packs or unit is None:
        return None
    v, floor = len(ctx.request.variants), ctx.policy.decision.min_efficiency
    single = _baseline(ctx, cands)
    firsts = {p.k: (unit.NAME, p.groups[0]) for p in packs}
    sub = {single: cands[single], **{key: cands[key] for key in firsts.values() if key in cands}}
    mark = len(ctx.reasons)
    got = choose_auto(ctx, sub)
    ctx.reasons[mark:] = [Reason(f"each variant's group: {r.text}", r.rule)
                          for r in ctx.reasons[mark:]]
    base = got.measured.get(single)
    if got.basis in ("torchrun", "fallback", "only"):
        ctx.reasons.append(Reason(
            f"{v} variants → single-GPU jobs: a {unit.WORD} group per variant is chosen only "
            f"on a measured or predicted rate, and there is none ({got.basis})",
            ctx.policy.rule("decision.min_efficiency")))
        return Choice(sweep_key[0], sweep_key[1], "model")
    totals: dict = {sweep_key: float(v)}
    details: dict = {}
    for p in packs:
        first = firsts[p.k]
        s0, basis = _first_speedup(got, cands, first, base)
        if s0 is None:
            continue
        p0 = p.preds[0]
        each = tuple(s0 * (x.speedup / p0.speedup) if x is not None and p0 is not None and
                     p0.speedup else s0 for x in p.preds)
        totals[p.key] = sum(each)
        details[p.key] = (p, each, basis)
    ok = [key for key in details if totals[key] > v and totals[key] / len(key[1]) >= floor]
    win = max(ok, key=lambda key: (round(totals[key], 9), -len(key[1]))) if ok else sweep_key
    ctx.reasons.append(Reason(_sentence(ctx, unit, v, totals, details, win, sweep_key, base),
                              ctx.policy.rule("decision.min_efficiency")))
    measured = dict(got.measured)
    if base:
        measured[sweep_key] = v * base
        for key, (_, _, basis) in details.items():
            if basis in ("measured", "launch"):
                measured[key] = totals[key] * base
    if win != sweep_key:
        p, each, basis = details[win]
        ctx.packed = Packed(p.k, p.groups, each, basis)
    return Choice(win[0], win[1], got.basis if got.basis != "forced" else "model", measured,
                  got.superlinear, got.corrected)


def _first_speedup(got, cands, key, base) -> tuple[float | None, str]:
    """(speedup, basis) of the DDP×k candidate as choose_auto left it."""
    if key in got.measured and base:
        return got.measured[key] / base, "launch" if got.basis == "launch" else "measured"
    fix = got.corrected.get(key)
    if fix is not None and fix.basis:
        return fix.speedup, "corrected"
    pred = cands.get(key, (None, None))[1]
    return (pred.speedup, "predicted") if pred is not None else (None, "")


def _sentence(ctx, unit, v, totals, details, win, sweep_key, base) -> str:
    floor = ctx.policy.decision.min_efficiency
    per = f" ({rate(v * base)})" if base else ""
    parts = []
    for key, (p, each, basis) in details.items():
        n = len(key[1])
        spread = " + ".join(times(s) for s in each)
        parts.append(f"{v} × {unit.WORD}×{p.k} on " + " | ".join(
            ",".join(map(str, g)) for g in p.groups) + f": {spread} = {times(totals[key])} "
            f"one GPU's samples/s ({basis}; {pct(totals[key] / n)} efficiency"
            + (f", below the policy's {pct(floor)}" if totals[key] / n < floor else "") + ")")
    head = f"{v} variants on {min(ctx.cap, len(ctx.usable))} usable GPUs: " + "; ".join(parts) \
        + f"; {v} single-GPU jobs give {times(float(v))}{per}"
    if win == sweep_key:
        return head + f" → {v} single-GPU jobs on {gpu_list(sweep_key[1])}"
    p = details[win][0]
    tied = [key for key in details if key != win and round(totals[key], 9) ==
            round(totals[win], 9) and totals[key] / len(key[1]) >= floor]
    return head + (f" → each variant runs as {unit.WORD}×{p.k} on its own group, the most "
                   f"samples/s" + (" (a tie: fewer GPUs win)" if tied else ""))
