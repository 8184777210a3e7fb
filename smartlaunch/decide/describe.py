"""Saying why, with numbers: every candidate's sentence, a DDP group's words and the
all-reduce figures --explain shows. Decides nothing."""
from __future__ import annotations

import dataclasses
from typing import Any

from smartlaunch.decide.api import Role
from smartlaunch.decide.cost import MiB
from smartlaunch.decide.groups import family_link, numa_nodes
from smartlaunch.decide.plan import Candidate, CommSummary
from smartlaunch.decide.select import (SUPERLINEAR, Choice, _baseline, _correction, _trial_cap,
                                       uncertainty)
from smartlaunch.decide.words import gbps, gpu_list, mb, pct, times


def describe(ctx, choice: Choice, cands: dict) -> tuple[Candidate, ...]:
    """Every candidate with its numbers and the sentence saying why it won or lost."""
    floor = ctx.policy.decision.min_efficiency
    batch = ctx.profile.batch_size if ctx.profile is not None else None
    chosen_key = (choice.strategy, choice.gpus)
    single_key = _baseline(ctx, cands)
    base_rate = choice.measured.get(single_key)
    rows = {}
    for key, (cand, pred) in cands.items():
        n = len(key[1])
        f: dict[str, Any] = {}
        if pred is not None:
            f = dict(allreduce_s=pred.allreduce_s or None, comm_cost_s=pred.comm_cost_s or None,
                     model_speedup=pred.speedup)
        if key in choice.measured and base_rate:
            sp = choice.measured[key] / base_rate
            f.update(predicted_samples_per_s=choice.measured[key], speedup=sp,
                     efficiency=sp / n, measured=True, draws=choice.draws.get(key, 1),
                     predicted_step_s=(n * batch / choice.measured[key]) if batch else None)
        elif pred is not None:
            f.update(predicted_step_s=pred.step_s, speedup=pred.speedup,
                     efficiency=pred.efficiency, predicted_samples_per_s=pred.samples_per_s(batch))
            fix = choice.corrected.get(key)
            if fix is not None and fix.basis:     # relative to the measured baseline
                sps = fix.speedup * base_rate if base_rate else None
                f.update(speedup=fix.speedup, efficiency=fix.speedup / n, corrected=True,
                         predicted_samples_per_s=sps,
                         predicted_step_s=(n * batch / sps) if batch and sps else
                         pred.step_s / fix.ratio)
        rows[key] = (dataclasses.replace(cand, chosen=key == chosen_key, **f), pred)
    win = rows[chosen_key][0] if chosen_key in rows else None
    error = uncertainty(ctx)
    out = []
    for c, pred in rows.values():
        head = ctx.units[c.strategy].sentence(ctx, c, pred, error)
        if c.measured and c.speedup and c.speedup > len(c.gpus) * SUPERLINEAR \
                and ctx.units[c.strategy].ROLE == Role.SCALED:
            head += (f" [superlinear: {times(c.speedup)} on {len(c.gpus)} GPUs; "
                     f"{choice.superlinear or 'measured against the dry run'}]")
        text = head + _tail(ctx, c, win, choice, floor, error)
        out.append(dataclasses.replace(c, reason=text))
    if chosen_key not in rows:   # forced DDP on a group the model did not consider
        c = Candidate(choice.strategy, choice.gpus, chosen=True)
        why = "as asked" if choice.basis == "forced" else \
            f"{ctx.units[c.strategy].named(c)} → chosen (a multi-node job is launched as torchrun would)"
        out.append(dataclasses.replace(c, reason=why))
    return tuple(out)


def group_note(ctx, gpus: tuple[int, ...]) -> str:
    """"worst link NV18, 1 NUMA node, all-reduce 230 GB/s at the gradient size measured on
    this group"."""
    k = numa_nodes(ctx.topology, gpus)
    text = f"worst link {family_link(ctx.topology, gpus)}, {k} NUMA node{'s' if k != 1 else ''}"
    curve = ctx.curves.get(gpus)
    if curve is not None:
        grad = ctx.profile.grad_bytes if ctx.profile is not None and ctx.profile.grad_bytes \
            else 256 * MiB
        low, top = int(curve.points[0][0]), int(curve.points[-1][0])
        if low <= grad <= top:   # a figure inside the measured sizes, never the fit beyond
            where = "at the gradient size" if grad != 256 * MiB else "at 256 MiB"
        elif grad > top:
            grad, where = top, f"at {mb(top)}, the largest measured"
        else:
            grad, where = low, f"at {mb(low)}, the smallest measured"
        how = f"derived from the curve measured on {gpu_list(curve.derived_from)}" if curve.derived_from else \
            "measured on this group"
        text += f", all-reduce {gbps(curve.bus_bandwidth_Bps(grad))} {where} {how}"
    elif ctx.predictable:
        text += ", no all-reduce curve measured on this group"
    return text


def _tail(ctx, c: Candidate, win: Candidate | None, choice: Choice, floor: float,
          error: tuple[float, str]) -> str:
    """Why the candidate won or lost, after its unit's head; error: uncertainty(ctx)."""
    fix = choice.corrected.get((c.strategy, c.gpus)) if c.corrected else None
    note = f" (corrected by the trials: {_correction(ctx, fix)})" if fix else ""
    if c.chosen:
        return note + (f" → chosen ({choice.basis})" if choice.basis != "forced"
                       else " → chosen (as asked)")
    if win is None:
        return note
    name = ctx.units[win.strategy].short_name(win)
    role, win_role = ctx.units[c.strategy].ROLE, ctx.units[win.strategy].ROLE
    if choice.basis == "forced":
        tail = ": not asked for"
    elif (role == Role.SCALED or (c.per_variant or 1) > 1) and c.efficiency is not None \
            and c.efficiency < floor:           # a DDP job, or variants as DDP groups (pack.py)
        tail = f": below the policy's {pct(floor)}" + (
            f" even at +{pct(error[0])}" if fix is not None and
            c.efficiency * (1 + error[0]) < floor else "")
    elif role == Role.SCALED and choice.basis in ("trial", "corrected") and not c.measured:
        if fix is None:
            tail = f": not tried ({_trial_cap(ctx)})"
        elif win.speedup is not None and c.speedup * (1 + error[0]) <= win.speedup:
            tail = f": not tried: short of {name}'s {times(win.speedup)} even at +{pct(error[0])}"
        else:
            tail = f": not tried: {times(c.speedup)} is less than {name}'s {times(win.speedup)}"
    elif role == Role.BASELINE and win.speedup is not None:
        verb = "give" if win_role == Role.SWEEP else "gives"    # "independent jobs give"
        tail = f": {name} {verb} {times(win.speedup)} its samples/s"
    elif c.speedup is not None and win.speedup is not None:
        tail = f": {times(c.speedup)} is less than {name}'s {times(win.speedup)}"
    else:
        tail = ": not chosen"
    tail = note + tail
    if win_role == Role.BASELINE:
        free = [g for g in c.gpus if g not in win.gpus]
        tail += f" → {ctx.units[win.strategy].named(win)}" + \
            (f"; {gpu_list(free)} left free" if free else "")
    else:
        tail += f" → {name}"
    return tail


def comm_summary(curve, profile) -> CommSummary | None:
    """The curve's figures, each only inside the measured sizes (None: extrapolated or
    implausible)."""
    if curve is None:
        return None
    grad = profile.grad_bytes if profile is not None and profile.grad_bytes else None
    sizes = [int(b) for b, _ in curve.points]

    def busbw(n: int | None) -> float | None:
        if not n or not sizes or not sizes[0] <= n <= sizes[-1]:
            return None
        v = curve.bus_bandwidth_Bps(n) / 1e9
        return round(v, 3) if v >= 0.1 else float(f"{v:.3g}")    # never a rounded 0.0
    first = float(curve.points[0][1]) if curve.points else 0.0
    latency = round(curve.latency_s * 1e6, 3) if 0 < curve.latency_s <= first else None
    return CommSummary(
        world_size=curve.world_size, backend=curve.backend, gpus=tuple(curve.gpus),
        busbw_256MiB_GBps=busbw(256 * MiB), busbw_at_grad_GBps=busbw(grad),
        grad_bytes=grad, latency_us=latency, cached=curve.cached,
        env=dict(curve.env), points=tuple((int(b), float(t)) for b, t in curve.points),
        bandwidth_Bps=curve.bandwidth_Bps, derived_from=tuple(curve.derived_from),
        busbw_largest_GBps=busbw(sizes[-1] if sizes else None))
