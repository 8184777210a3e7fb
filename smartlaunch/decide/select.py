"""Choosing among the candidates (model, trial or fallback) and saying why, with numbers."""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

from smartlaunch.decide.api import Role, by_role
from smartlaunch.decide.cost import MODEL_ERROR
from smartlaunch.decide.plan import Candidate, CommSummary, Reason, Strategy, strategy_name
from smartlaunch.decide.words import gbps, gpu_list, pct, rate, times
from smartlaunch.profile.api import ProfileStatus

MiB = 1024 * 1024
# A trial costs decision.trial_seconds per candidate and the cold decision has a time goal
# (README): where predictions rank the SCALED candidates (every unit's together), only the
# best two are tried (issue 17: an 8-GPU node would otherwise try seven DDP group sizes).
MAX_SCALED_TRIALS = 2


@dataclass
class Choice:
    strategy: Strategy
    gpus: tuple[int, ...]
    basis: str = "forced"        # forced | model | trial | launch | fallback | only | torchrun | multi-node
    measured: dict = field(default_factory=dict)   # candidate key -> samples/s from a trial


def _key_n(key) -> int:
    """GPUs of a (strategy, gpus) key: a single job's key holds its one GPU."""
    return len(key[1])


def _baseline(ctx, keys):
    """The baseline's key among candidate keys (every speedup is relative to it)."""
    return next(k for k in keys if _role(ctx, k) == Role.BASELINE)


def _role(ctx, key) -> Role:
    return ctx.units[key[0]].ROLE


def _name(ctx, key) -> str:
    """The candidate with its GPUs, as reasons name a winner: "DDP×2 on GPUs 0,1"."""
    return ctx.units[key[0]].named(Candidate(key[0], key[1]))


def _short(ctx, key) -> str:
    return ctx.units[key[0]].short_name(Candidate(key[0], key[1]))


def _scaled_word(ctx) -> str:
    """The SCALED units' family words ("DDP"), for sentences about all of them."""
    return " or ".join(u.WORD for u in ctx.units.values() if u.ROLE == Role.SCALED)


def _trial_cap(ctx) -> str:
    """Why a SCALED candidate was not tried: MAX_SCALED_TRIALS bounds them all together."""
    return (f"at most {MAX_SCALED_TRIALS} {_scaled_word(ctx)} trials: the model's pick and "
            "the fastest other")


def _pick(ctx, scores: dict) -> tuple:
    """scores: key -> speedup over the baseline. The most samples/s among SCALED candidates
    that meet the policy's efficiency and beat the baseline; otherwise the baseline. Ties go
    to fewer GPUs."""
    floor = ctx.policy.decision.min_efficiency
    base = _baseline(ctx, scores)
    ok = [k for k, s in scores.items() if _role(ctx, k) == Role.SCALED and s is not None
          and s / _key_n(k) >= floor and s > 1.0]
    return max(ok, key=lambda k: (scores[k], -_key_n(k))) if ok else base


def choose_auto(ctx, cands: dict) -> Choice:
    d, rule = ctx.policy.decision, ctx.policy.rule
    keys = list(cands)
    single = _baseline(ctx, keys)
    scaled = [k for k in keys if _role(ctx, k) == Role.SCALED]
    ctx.scaled_keys = scaled
    trialable = [k for k in scaled if ctx.units[k[0]].TRIAL]
    sweep = next((k for k in keys if _role(ctx, k) == Role.SWEEP), None)
    preds = {k: cands[k][1] for k in keys}

    if sweep is not None:
        best = max((k for k in scaled if preds[k]), key=lambda k: preds[k].speedup, default=None)
        rival = (ctx.units[best[0]].WORD, preds[best].speedup) if best else \
            (_scaled_word(ctx), None)
        if ctx.units[sweep[0]].prefer(ctx, sweep, preds[sweep], rival):
            return Choice(sweep[0], sweep[1], "model")

    if not scaled:
        why = (f"only {ctx.cap} GPU allowed" if ctx.cap < 2 else
               f"only {len(ctx.usable)} usable GPU" if len(ctx.usable) < 2 else
               f"no {_scaled_word(ctx)} group is allowed")
        ctx.reasons.append(Reason(f"{_name(ctx, single)}: {why}",
                                  rule("decision.max_gpus") if ctx.cap < 2 and ctx.request.max_gpus
                                  is None else None))
        return Choice(single[0], single[1], "only")

    p = ctx.profile
    if p is not None and p.status == ProfileStatus.UNMEASURABLE:
        k = max([k for k in scaled if ctx.units[k[0]].TORCHRUN] or scaled, key=_key_n)
        ctx.reasons.append(Reason(
            f"could not measure: {p.note} → {_name(ctx, k)}, as torchrun "
            f"--nproc-per-node {_key_n(k)} would launch it", "dry run"))
        return Choice(k[0], k[1], "torchrun")

    if ctx.launched:
        got = _from_launches(ctx, single, scaled, preds)
        if got is not None:
            return got

    missing = [k for k in scaled if preds[k] is None]
    if not ctx.predictable or missing:
        if not ctx.predictable:
            p = ctx.profile
            why = "no profile" if p is None else f"the profile is {p.status.value}" + (
                f" ({p.note})" if p.note else "")
        else:
            why = "the all-reduce over " + "; ".join(gpu_list(k[1]) for k in missing) + \
                  " could not be measured"
        measured, note = _trials(ctx, [single, *trialable], why, "decision.trials") \
            if d.trials else (None, f"{why}, and trials are off")
        if measured:
            return measured
        known = {k: preds[k].speedup for k in [single, *scaled] if preds[k] is not None}
        if ctx.predictable and len(known) > 1:
            return _by_model(ctx, known, f"{note}; decided among the predicted candidates")
        return _fallback(ctx, scaled, note)

    scores = {k: preds[k].speedup for k in [single, *scaled]}
    if ctx.profile.work_depends_on_world_size and d.trials:
        # The model assumes torchrun's semantics (each rank does the profiled work); a
        # script that sizes its work by the world size (nanoGPT's accumulation) breaks that.
        why = (f"the script reads the world size before its first step "
               f"({ctx.profile.reads_world_size}) and accumulates {ctx.profile.micro_batches} "
               f"micro-batches per step, so its work per rank under DDP may differ from the "
               f"profiled run (nanoGPT divides its accumulation by WORLD_SIZE)")
        measured, note = _trials(ctx, [single, *_top(ctx, trialable, scores)], why,
                                 "decision.trials")
        if measured:
            return measured
        return _by_model(ctx, scores, f"{note}, so the prediction decides, assuming each rank "
                                      f"does the profiled work")
    floor = d.min_efficiency
    band, source = uncertainty(ctx)
    reach = math.log1p(band)
    close = [k for k in trialable
             if abs(math.log(max(preds[k].efficiency, 1e-9) / floor)) <= reach]
    if close and d.trials:
        why = ("the prediction is within its error of the policy's " + pct(floor) + " (±" +
               pct(band) + ", " + source + "): " +
               ", ".join(f"{_short(ctx, k)} {pct(preds[k].efficiency)}" for k in close))
        remaining = [k for k in trialable if preds[k].efficiency * (1 + band) >= floor]
        measured, note = _trials(ctx, [single, *_top(ctx, remaining, scores)], why,
                                 "decision.uncertainty_band")
        if measured:
            return measured
        return _by_model(ctx, scores, f"{note}, so the prediction decides")
    return _by_model(ctx, scores, None)


def _top(ctx, scaled: list, scores: dict) -> list:
    """The MAX_SCALED_TRIALS SCALED candidates to try, in N order: the model's own pick (the most
    samples/s among those predicted to meet the policy), then the most predicted samples/s
    among the rest, which a trial may show meeting it. By samples/s alone, DDP×3 and ×4 at
    59% and 41% were tried and ×2 at 82% was not (examples/train.py on pcie-4gpu-x8, CPU,
    2026-11-22)."""
    base = _baseline(ctx, scores)
    pick = _pick(ctx, {base: 1.0, **{k: scores[k] for k in scaled}})
    first = [pick] if pick in scaled else []
    rest = sorted((k for k in scaled if k not in first), key=lambda k: (-scores[k], _key_n(k)))
    return sorted((first + rest)[:MAX_SCALED_TRIALS], key=_key_n)


def uncertainty(ctx) -> tuple[float, str]:
    """(relative error of a predicted speedup, where that figure comes from). The policy's
    decision.uncertainty_band when set; else the cost model's measured error (MODEL_ERROR's
    90th percentile), doubled in log space when the profile is low-confidence (a window cut
    short times fewer steps than asked)."""
    band = ctx.policy.decision.uncertainty_band
    if band is not None:
        return band, "decision.uncertainty_band"
    p90, source = MODEL_ERROR.p90_log, MODEL_ERROR.label
    if getattr(ctx.profile, "low_confidence", False):
        p90, source = 2 * p90, source + ", doubled for a low-confidence profile"
    return math.expm1(p90), source


def _from_launches(ctx, single, scaled: list, preds: dict) -> Choice | None:
    """Earlier launches of this job measured what DDP×N really gave: those candidates are
    scored by measurement, the rest by the model (issue 15: predictions were off by up to 4×
    on workloads the model was not fitted to)."""
    from smartlaunch.profile.feedback import candidate_name, one_gpu_rate
    runs = {k: ctx.launched.get(candidate_name(strategy_name(k[0]), k[1])) for k in scaled}
    runs = {k: r for k, r in runs.items() if r is not None}
    prof = ctx.profile.to_dict() if ctx.profile is not None else {}
    base, source = one_gpu_rate(ctx.launched, prof)
    if not runs or not base:
        return None
    scores = {single: 1.0}
    for k in scaled:
        if k in runs:
            scores[k] = runs[k].rank_steps_per_s / base
        elif preds[k] is not None:
            scores[k] = preds[k].speedup
    win = _pick(ctx, scores)
    ran = []
    for k, r in runs.items():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.measured_at))
        ran.append(f"{_name(ctx, k)} ran at {times(scores[k])} of one GPU "
                   f"({pct(scores[k] / _key_n(k))} efficiency, {r.steps} steps, {when}"
                   + (f"; {r.assumed}" if r.assumed else "") + ")")
    text = ("measured by earlier launches of this job, preferred over predictions: "
            + "; ".join(ran) + f"; one GPU from {source}; the policy asks "
            f"{pct(ctx.policy.decision.min_efficiency)} → {_name(ctx, win)}")
    ctx.reasons.append(Reason(text, ctx.policy.rule("decision.min_efficiency")))
    batch = ctx.profile.batch_size if ctx.profile is not None and ctx.profile.batch_size else 1
    measured = {single: base * batch, **{k: scores[k] * base * batch for k in runs}}
    return Choice(win[0], win[1], "launch", measured)


def _by_model(ctx, scores: dict, note: str | None) -> Choice:
    win = _pick(ctx, scores)
    rule = ctx.policy.rule("decision.min_efficiency")
    if _role(ctx, win) == Role.SCALED:
        n = _key_n(win)
        text = (f"{_name(ctx, win)}: predicted {times(scores[win])} "
                f"({pct(scores[win] / n)} efficiency), at or above the policy's "
                f"{pct(ctx.policy.decision.min_efficiency)}, the most samples/s")
    else:
        best = max((k for k in scores if _role(ctx, k) == Role.SCALED and scores[k] is not None),
                   key=lambda k: scores[k] / _key_n(k), default=None)
        text = f"{_name(ctx, win)}: no {_scaled_word(ctx)} candidate reaches the policy's " \
               f"{pct(ctx.policy.decision.min_efficiency)}"
        if best is not None:
            text += f" (best {_short(ctx, best)} {pct(scores[best] / _key_n(best))})"
    if note:
        text = f"{note}: {text}"
    ctx.reasons.append(Reason(text, rule))
    return Choice(win[0], win[1], "model")


def _trials(ctx, keys: list, why: str, rule_key: str) -> tuple[Choice | None, str]:
    """(the choice by measurement, or None and why not). keys: the baseline first."""
    rule = ctx.policy.rule
    if ctx.trial is None:
        return None, f"{why}; a measured trial was wanted but none can run here"
    measured, single, d = {}, keys[0], ctx.policy.decision
    # The dry run's own complete window stands for the one-GPU trial: at least trial_steps
    # and dryrun.measure_seconds (0.5 s; a trial's 1 s window is for the DDP side, whose
    # first all-reduces and clock ramp a short window over-weights). Lengthening every dry
    # run to a trial's window would cut short the ones of scripts that end sooner, and a
    # cut-short profile widens the band (more trials, not fewer).
    floor_s = min(d.trial_seconds, ctx.policy.dryrun.measure_seconds)
    by_dry_run = ctx.profile.trial_rate(d.trial_steps, floor_s) \
        if ctx.profile is not None else None
    if by_dry_run is not None:
        measured[single] = by_dry_run
    ctx.trial.planned(len(keys) - len(measured))
    for k in keys:
        if k in measured:
            continue
        got = ctx.trial(k[0], k[1])
        if got is not None and got > 0:
            measured[k] = float(got)
    if single not in measured:
        return None, f"{why}; the trial of {_name(ctx, single)} gave no measurement"
    scores = {k: v / measured[single] for k, v in measured.items()}
    win = _pick(ctx, scores)
    names = ", ".join(ctx.units[k[0]].table_name(Candidate(k[0], k[1])) + f" {rate(v)}" +
                      (f" (its dry run, {ctx.profile.steps_measured} steps)"
                       if k == single and by_dry_run is not None else "")
                      for k, v in measured.items())
    lost = [k for k in keys if k not in measured]
    text = f"{why} → measured trials: {names}"
    untried = [k for k in ctx.scaled_keys if k not in keys]
    if untried:
        text += ("; not tried: " + ", ".join(_short(ctx, k) for k in untried) +
                 f" ({_trial_cap(ctx)}, or out of the policy's reach even at the band's edge)")
    if lost:
        text += "; no measurement for " + ", ".join(_short(ctx, k) for k in lost)
    ctx.reasons.append(Reason(f"{text} → {_name(ctx, win)}", rule(rule_key)))
    return Choice(win[0], win[1], "trial", measured), text


def _fallback(ctx, scaled: list, why: str) -> Choice:
    """The policy's decision.fallback_strategy names a unit: its largest group when it has
    candidates here, else the baseline on the first usable GPU."""
    fb = ctx.policy.decision.fallback_strategy
    rule = ctx.policy.rule("decision.fallback_strategy")
    mine = [k for k in scaled if strategy_name(k[0]) == fb]
    if mine:
        k = max(mine, key=_key_n)
        ctx.reasons.append(Reason(f"{why} → fallback {_name(ctx, k)}", rule))
        return Choice(k[0], k[1], "fallback")
    base = by_role(ctx.units, Role.BASELINE)
    key = (base.NAME, (ctx.usable[0],))
    extra = "" if fb == strategy_name(base.NAME) else f" (fallback {fb} does not apply to one job)"
    ctx.reasons.append(Reason(f"{why} → fallback {_name(ctx, key)}{extra}", rule))
    return Choice(*key, "fallback")


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
        if key in choice.measured and base_rate:
            sp = choice.measured[key] / base_rate
            f = dict(predicted_samples_per_s=choice.measured[key], speedup=sp,
                     efficiency=sp / n, measured=True,
                     predicted_step_s=(n * batch / choice.measured[key]) if batch else None)
            if pred is not None:
                f["allreduce_s"] = pred.allreduce_s or None
                f["comm_cost_s"] = pred.comm_cost_s or None
        elif pred is not None:
            f = dict(predicted_step_s=pred.step_s, predicted_samples_per_s=pred.samples_per_s(batch),
                     speedup=pred.speedup, efficiency=pred.efficiency,
                     allreduce_s=pred.allreduce_s or None, comm_cost_s=pred.comm_cost_s or None)
        rows[key] = (dataclasses.replace(cand, chosen=key == chosen_key, **f), pred)
    win = rows[chosen_key][0] if chosen_key in rows else None
    out = []
    for key, (c, pred) in rows.items():
        head = ctx.units[c.strategy].sentence(ctx, c, pred, uncertainty(ctx))
        text = head + _tail(ctx, c, win, choice, floor)
        out.append(dataclasses.replace(c, reason=text))
    if chosen_key not in rows:   # forced DDP on a group the model did not consider
        c = Candidate(choice.strategy, choice.gpus, chosen=True)
        why = "as asked" if choice.basis == "forced" else \
            f"{ctx.units[c.strategy].named(c)} → chosen (a multi-node job is launched as torchrun would)"
        out.append(dataclasses.replace(c, reason=why))
    return tuple(out)


def group_note(ctx, gpus: tuple[int, ...]) -> str:
    """Why this group for its N, and the curve its prediction used: "worst link NV18, 1 NUMA
    node, all-reduce 230 GB/s at the gradient size measured on this group"."""
    from smartlaunch.decide.groups import family_link, numa_nodes
    k = numa_nodes(ctx.topology, gpus)
    text = f"worst link {family_link(ctx.topology, gpus)}, {k} NUMA node{'s' if k != 1 else ''}"
    curve = ctx.curves.get(gpus)
    if curve is not None:
        grad = ctx.profile.grad_bytes if ctx.profile is not None and ctx.profile.grad_bytes \
            else 256 * MiB
        where = "at the gradient size" if grad != 256 * MiB else "at 256 MiB"
        text += f", all-reduce {gbps(curve.bus_bandwidth_Bps(grad))} {where} measured on this group"
    elif ctx.predictable:
        text += ", no all-reduce curve measured on this group"
    return text


def _tail(ctx, c: Candidate, win: Candidate | None, choice: Choice, floor: float) -> str:
    """Why the candidate won or lost, after its unit's head (StrategyUnit.sentence)."""
    if c.chosen:
        return f" → chosen ({choice.basis})" if choice.basis != "forced" else " → chosen (as asked)"
    if win is None:
        return ""
    name = ctx.units[win.strategy].short_name(win)
    role, win_role = ctx.units[c.strategy].ROLE, ctx.units[win.strategy].ROLE
    if choice.basis == "forced":
        tail = ": not asked for"
    elif role == Role.SCALED and c.efficiency is not None and c.efficiency < floor:
        tail = f": below the policy's {pct(floor)}"
    elif role == Role.SCALED and choice.basis == "trial" and not c.measured:
        tail = f": not tried ({_trial_cap(ctx)})"
    elif role == Role.BASELINE and win.speedup is not None:
        verb = "give" if win_role == Role.SWEEP else "gives"    # "independent jobs give"
        tail = f": {name} {verb} {times(win.speedup)} its samples/s"
    elif c.speedup is not None and win.speedup is not None:
        tail = f": {times(c.speedup)} is less than {name}'s {times(win.speedup)}"
    else:
        tail = ": not chosen"
    if win_role == Role.BASELINE:
        free = [g for g in c.gpus if g not in win.gpus]
        tail += f" → {ctx.units[win.strategy].named(win)}" + \
            (f"; {gpu_list(free)} left free" if free else "")
    else:
        tail += f" → {name}"
    return tail


def comm_summary(curve, profile) -> CommSummary | None:
    if curve is None:
        return None
    grad = profile.grad_bytes if profile is not None and profile.grad_bytes else None
    return CommSummary(
        world_size=curve.world_size, backend=curve.backend, gpus=tuple(curve.gpus),
        busbw_256MiB_GBps=round(curve.bus_bandwidth_Bps(256 * MiB) / 1e9, 3),
        busbw_at_grad_GBps=round(curve.bus_bandwidth_Bps(grad) / 1e9, 3) if grad else None,
        grad_bytes=grad, latency_us=round(curve.latency_s * 1e6, 3), cached=curve.cached,
        env=dict(curve.env), points=tuple((int(b), float(t)) for b, t in curve.points),
        bandwidth_Bps=curve.bandwidth_Bps)
