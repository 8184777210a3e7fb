"""Choosing among the candidates: by the model, earlier launches, measured trials, or the
policy's fallback; each reason with its numbers."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from smartlaunch.decide.api import Role, by_role
from smartlaunch.decide.cost import MODEL_ERROR
from smartlaunch.decide.groups import best_group
from smartlaunch.decide.plan import Candidate, Reason, Strategy, strategy_name
from smartlaunch.decide.rerank import Corrected, pick, settle
from smartlaunch.decide.words import gpu_list, pct, pct_of, rate, times
from smartlaunch.profile.api import ProfileStatus
from smartlaunch.profile.feedback import candidate_name, one_gpu_rate

MAX_SCALED_TRIALS = 2   # where predictions rank the SCALED candidates, only the best two are tried


@dataclass
class Choice:
    strategy: Strategy
    gpus: tuple[int, ...]
    # forced | model | trial | corrected | launch | fallback | only | torchrun | multi-node
    basis: str = "forced"
    measured: dict = field(default_factory=dict)   # candidate key -> samples/s from a trial
    superlinear: str = ""        # why a measured speedup above N× on N GPUs stands, if one does
    corrected: dict = field(default_factory=dict)  # untried key -> rerank.Corrected
    draws: dict = field(default_factory=dict)      # key -> its trials, where more than one


def _key_n(key) -> int:
    return len(key[1])


def _baseline(ctx, keys):
    return next(k for k in keys if _role(ctx, k) == Role.BASELINE)


def _role(ctx, key) -> Role:
    return ctx.units[key[0]].ROLE


def _name(ctx, key) -> str:
    return ctx.units[key[0]].named(Candidate(key[0], key[1]))


def _short(ctx, key) -> str:
    return ctx.units[key[0]].short_name(Candidate(key[0], key[1]))


def _scaled_word(ctx) -> str:
    return " or ".join(u.WORD for u in ctx.units.values() if u.ROLE == Role.SCALED)


def _trial_cap(ctx) -> str:
    return (f"at most {MAX_SCALED_TRIALS} {_scaled_word(ctx)} trials: the model's pick and "
            "the fastest other")


def _pick(ctx, scores: dict) -> tuple:
    return pick(scores, _baseline(ctx, scores), _key_n, ctx.policy.decision.min_efficiency)


def choose_auto(ctx, cands: dict) -> Choice:
    d, rule = ctx.policy.decision, ctx.policy.rule
    keys = list(cands)
    single = _baseline(ctx, keys)
    scaled = [k for k in keys if _role(ctx, k) == Role.SCALED]
    ctx.scaled_keys = scaled
    ctx.preds = {k: cands[k][1] for k in scaled}
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
        n = ctx.request.max_gpus
        if n is not None and n > _key_n(k):
            # A count given: torchrun's own, even where decision.world_sizes kept it out.
            group = best_group(ctx.topology, ctx.usable, n, d.ddp_link_classes)
            k = (k[0], group) if group is not None else k
        ctx.reasons.append(Reason(
            f"could not measure: {p.note} → {_name(ctx, k)}, as torchrun "
            f"--nproc-per-node {_key_n(k)} would launch it", "dry run"))
        return Choice(k[0], k[1], "torchrun")

    if p is not None and p.status == ProfileStatus.ENDED:
        # its --help, a check that exits: a trial runs the same script to the same end
        return _fallback(ctx, scaled, f"nothing to measure: {p.note}; no trial would measure "
                                      f"more")

    if ctx.launched:
        got = _from_launches(ctx, single, scaled, preds)
        if got is not None:
            return got

    missing = [k for k in scaled if preds[k] is None]
    if not ctx.predictable or missing:
        if not ctx.predictable:
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
        # The model assumes each rank does the profiled work; this script may not.
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
        measured, note = _trials(ctx, [single, *_first(ctx, remaining, scores)], why,
                                 "decision.uncertainty_band", band)
        if measured:
            return measured
        return _by_model(ctx, scores, f"{note}, so the prediction decides")
    return _by_model(ctx, scores, None)


def _top(ctx, scaled: list, scores: dict) -> list:
    """The MAX_SCALED_TRIALS candidates to try, in N order: the model's own pick, then the
    most predicted samples/s among the rest."""
    first = _first(ctx, scaled, scores)
    rest = sorted((k for k in scaled if k not in first), key=lambda k: (-scores[k], _key_n(k)))
    return sorted((first + rest)[:MAX_SCALED_TRIALS], key=_key_n)


def uncertainty(ctx) -> tuple[float, str]:
    """(relative error of a predicted speedup, its source): decision.uncertainty_band, else
    MODEL_ERROR's p90, doubled in log space for a low-confidence profile."""
    band = ctx.policy.decision.uncertainty_band
    if band is not None:
        return band, "decision.uncertainty_band"
    p90, source = MODEL_ERROR.p90_log, MODEL_ERROR.label
    if getattr(ctx.profile, "low_confidence", False):
        p90, source = 2 * p90, source + ", doubled for a low-confidence profile"
    return math.expm1(p90), source


def _from_launches(ctx, single, scaled: list, preds: dict) -> Choice | None:
    """Candidates earlier launches of this job ran are scored by measurement, the rest by
    the model; None when no launch applies."""
    runs = {k: ctx.launched.get(candidate_name(strategy_name(k[0]), k[1])) for k in scaled}
    runs = {k: r for k, r in runs.items() if r is not None}
    prof = ctx.profile.to_dict() if ctx.profile is not None else {}
    base, source = one_gpu_rate(ctx.launched, prof)
    if not runs or not base:
        return None
    # A launch above N× of one GPU on N GPUs means the one-GPU rate is off: not used; said.
    impossible = {k: r.rank_steps_per_s / base for k, r in runs.items()
                  if r.rank_steps_per_s / base > _key_n(k) * SUPERLINEAR}
    if impossible:
        ctx.reasons.append(Reason(
            "not used: " + "; ".join(
                f"{_name(ctx, k)} ran at {times(v)} of one GPU on {_key_n(k)} GPUs, superlinear"
                for k, v in impossible.items())
            + f": its one-GPU rate comes from {source}, which a launch of this job outran; "
              "the decision uses the model and trials instead",
            ctx.policy.rule("decision.min_efficiency")))
        runs = {k: r for k, r in runs.items() if k not in impossible}
        if not runs:
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
    floor = pct(ctx.policy.decision.min_efficiency)
    if _role(ctx, win) == Role.SCALED:
        text = (f"{_name(ctx, win)}: predicted {times(scores[win])} "
                f"({pct(scores[win] / _key_n(win))} efficiency), at or above the policy's "
                f"{floor}, the most samples/s")
    else:
        best = max((k for k in scores if _role(ctx, k) == Role.SCALED and scores[k] is not None),
                   key=lambda k: scores[k] / _key_n(k), default=None)
        text = f"{_name(ctx, win)}: no {_scaled_word(ctx)} candidate reaches the policy's {floor}"
        if best is not None:
            text += f" (best {_short(ctx, best)} {pct(scores[best] / _key_n(best))})"
    if note:
        text = f"{note}: {text}"
    ctx.reasons.append(Reason(text, ctx.policy.rule("decision.min_efficiency")))
    return Choice(win[0], win[1], "model")


def _first(ctx, scaled: list, scores: dict) -> list:
    """[the SCALED candidate tried first]: the model's own pick, else the most predicted
    samples/s (the others are tried only while one could change the choice)."""
    base = _baseline(ctx, scores)
    own = _pick(ctx, {base: 1.0, **{k: scores[k] for k in scaled}})
    if own in scaled:
        return [own]
    return sorted(scaled, key=lambda k: (-scores[k], _key_n(k)))[:1]


def _trials(ctx, keys: list, why: str, rule_key: str,
            band: float | None = None) -> tuple[Choice | None, str]:
    """(the choice by measurement, or None and why not). keys: the baseline first. Untried
    candidates that, corrected by the trials, could still win are tried too, else their
    corrected prediction decides. band: the band in force, shown where the policy has none."""
    rule = f"{rule_key}={band:.2g} (built-in: the cost model's measured error)" \
        if band is not None and ctx.policy.decision.uncertainty_band is None \
        else ctx.policy.rule(rule_key)
    if ctx.trial is None:
        return None, f"{why}; a measured trial was wanted but none can run here"
    measured, single, d = {}, keys[0], ctx.policy.decision
    whys = getattr(ctx.trial, "why", {})
    # The dry run's own complete window stands for the one-GPU trial.
    floor_s = min(d.trial_seconds, ctx.policy.dryrun.measure_seconds)
    precision = ctx.policy.dryrun.precision
    by_dry_run = ctx.profile.trial_rate(d.trial_steps, floor_s, precision) \
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
    superlinear = _superlinear(ctx, measured, single, keys)
    if superlinear and by_dry_run is not None:
        # Superlinear against the dry run's one-GPU rate: measure one GPU again by a trial.
        ctx.trial.planned(1)
        again = ctx.trial(single[0], single[1])
        if again is not None and again > 0:
            measured[single] = float(again)
            superlinear += (f"; one GPU measured again by a trial: {rate(again)} (its dry run "
                            f"gave {rate(by_dry_run)})")
            by_dry_run = None
            still = _superlinear(ctx, measured, single, keys)
            superlinear += (f"; still superlinear against it ({still}): the one-process run is "
                            "held back by something two processes split (an input pipeline "
                            "or host work that does not scale with the step)") if still else ""
    if single not in measured:
        lost = whys.get(single)
        return None, (f"{why}; the trial of {_name(ctx, single)} gave no measurement"
                      + (f" ({lost})" if lost else ""))
    tried, later, then_scores = set(keys), {}, {}
    while True:
        st = _settle(ctx, measured, single, tried)
        if st.to_try is None:
            break
        k = st.to_try
        later[k] = (st.corrected[k], st.winner)
        then_scores[st.winner] = measured[st.winner] / measured[single]
        tried.add(k)
        ctx.trial.planned(1)
        got = ctx.trial(k[0], k[1])
        if got is not None and got > 0:
            measured[k] = float(got)
    draws = {k: [v] for k, v in measured.items()}
    again = _again_near_floor(ctx, measured, draws, single, tried)
    if again:
        st = _settle(ctx, measured, single, tried)
    scores = {k: v / measured[single] for k, v in measured.items()}
    win, win_speedup = _winner(st, scores)
    names = ", ".join(ctx.units[k[0]].table_name(Candidate(k[0], k[1])) + f" {rate(v)}" +
                      (f" (its dry run, {ctx.profile.steps_measured} steps)"
                       if k == single and by_dry_run is not None else "")
                      for k, v in measured.items() if k not in later)
    text = f"{why} → measured trials: {names}"
    edge = uncertainty(ctx)[0]
    for k, (c, then) in later.items():
        got = f" {rate(measured[k])}" if k in measured else " (no measurement)"
        text += (f"; then {_short(ctx, k)}{got}, tried because the trials corrected its "
                 f"prediction to {_corrected_words(ctx, k, c)}, which at +{pct(edge)} would "
                 f"meet the policy's {pct(d.min_efficiency)} and beat {_short(ctx, then)}'s "
                 f"{times(then_scores[then])}")
    untried = [k for k in ctx.scaled_keys if k not in tried and k != st.by_prediction]
    if untried:
        text += "; not tried: " + ", ".join(_short(ctx, k) + (
            f" {times(st.corrected[k].speedup)} ({pct(st.corrected[k].speedup / _key_n(k))})"
            if k in st.corrected else "") for k in untried)
        text += (f" (corrected by the trials: none could meet the policy's "
                 f"{pct(d.min_efficiency)} and beat {_short(ctx, st.winner)} even at "
                 f"+{pct(edge)})" if any(k in st.corrected for k in untried) else
                 f" ({_trial_cap(ctx)}, or out of the policy's reach even at the band's edge)")
    if again:
        text += "; " + again
    if superlinear:
        text += f"; superlinear: {superlinear}"
    lost = [k for k in keys if k not in measured]
    if lost:
        text += "; no measurement for " + ", ".join(
            _short(ctx, k) + (f" ({whys[k]})" if k in whys else "") for k in lost)
    if st.by_prediction is not None:
        k, c = st.by_prediction, st.corrected[st.by_prediction]
        how = "its trial gave no measurement" if k in tried else "it cannot be tried here"
        final = (f"{_name(ctx, k)} chosen on its prediction corrected by the trials: "
                 f"{_corrected_words(ctx, k, c)}, at or above the policy's "
                 f"{pct(d.min_efficiency)} and more samples/s than {_short(ctx, st.winner)}'s "
                 f"measured {times(scores[st.winner])} ({how})")
        basis = "corrected"
    else:
        final, basis = _name(ctx, win), "trial"
    final += _near_floor(ctx, scores, win, win_speedup, draws)
    ctx.reasons.append(Reason(f"{text} → {final}", rule))
    counts = {k: sum(1 for v in vs if v == v) for k, vs in draws.items()}
    return Choice(win[0], win[1], basis, measured, superlinear=superlinear,
                  corrected=st.corrected, draws={k: n for k, n in counts.items() if n > 1}), text


def _settle(ctx, measured: dict, single, tried: set):
    predicted = {k: p.speedup for k, p in ctx.preds.items() if p is not None}
    base = measured[single]
    return settle({k: v / base for k, v in measured.items()}, predicted, single,
                  size=_key_n, family=lambda k: k[0],
                  floor=ctx.policy.decision.min_efficiency, band=uncertainty(ctx)[0],
                  can_try=lambda k: k not in tried and ctx.units[k[0]].TRIAL)


def _winner(st, scores: dict) -> tuple:
    """(the key chosen once settled as `st`, its speedup: measured, else corrected)."""
    win = st.by_prediction or st.winner
    return win, scores[win] if win in scores else st.corrected[win].speedup


def _corrected_words(ctx, key, c: Corrected) -> str:
    """"1.02× (51%: the model's 1.12× × 0.91, as DDP×3 measured against its prediction)"."""
    if not c.basis:
        return f"{times(c.speedup)} ({pct(c.speedup / _key_n(key))}, uncorrected)"
    return f"{times(c.speedup)} ({pct(c.speedup / _key_n(key))}: {_correction(ctx, c)})"


def _correction(ctx, c: Corrected) -> str:
    """"the model's 1.12× × 0.91, as DDP×3 measured against its prediction"."""
    by = " and ".join(_short(ctx, t) for t in c.basis)
    return (f"the model's {times(c.predicted)} × {c.ratio:.2f}, as {by} measured against "
            f"{'its' if len(c.basis) == 1 else 'their'} prediction")


TRIAL_SPREAD = 0.07      # one trial's run-to-run standard deviation of ln(speedup)
NEAR_FLOOR_REPEATS = 2   # at most this many more rounds near the policy's floor


def _deciding(ctx, k, e: float, s: float, win, win_speedup: float) -> str | None:
    """How to run the other side when k's side of the floor decided the choice, else None."""
    floor, n = ctx.policy.decision.min_efficiency, _key_n(k)
    if k == win and e >= floor:
        return "--strategy single runs one GPU"
    if k != win and e < floor and s > win_speedup:
        return f"--strategy {strategy_name(k[0])} --nproc-per-node {n} runs it"
    return None


def _reach(draws: int) -> float:
    """Two run-to-run standard deviations of ln(efficiency) after `draws` trial pairs."""
    return 2 * TRIAL_SPREAD / math.sqrt(max(1, draws))


def interval(draws: int) -> float:
    """The relative half-width of a measured efficiency's interval after `draws` trials."""
    return math.expm1(_reach(draws))


def _near(ctx, scores: dict, win, win_speedup: float, draws: dict) -> dict:
    """Measured candidates whose side of the floor decided the choice, within _reach of it:
    key -> (efficiency, draws, how to run the other side)."""
    floor = ctx.policy.decision.min_efficiency
    if floor <= 0:
        return {}
    single = _baseline(ctx, scores)
    out = {}
    for k, s in scores.items():
        n = _key_n(k)
        if n < 2 or s <= 0 or not ctx.units[k[0]].COLLECTIVE:
            continue
        m = min(sum(1 for v in draws.get(k, [1]) if v == v), len(draws.get(single, [1])))
        e = round(s / n, 9)             # a mean of equal draws reads as each of them
        other = _deciding(ctx, k, e, s, win, win_speedup)
        if other is not None and abs(math.log(e / floor)) <= _reach(m):
            out[k] = (e, m, other)
    return out


def _again_near_floor(ctx, measured: dict, draws: dict, single, tried: set) -> str:
    """Measure again, with the baseline, each deciding candidate near the floor (at most
    NEAR_FLOOR_REPEATS rounds); measured[k] becomes the geometric mean of its draws.
    Returns the sentence saying so, or ""."""
    repeats, lost = 0, ""
    for attempt in range(2, 2 + NEAR_FLOOR_REPEATS):
        st = _settle(ctx, measured, single, tried)
        scores = {k: v / measured[single] for k, v in measured.items()}
        win, win_speedup = _winner(st, scores)
        near = [k for k in _near(ctx, scores, win, win_speedup, draws) if ctx.units[k[0]].TRIAL]
        if not near:
            break
        ctx.trial.planned(1 + len(near))
        base = ctx.trial(single[0], single[1], attempt)
        if base is None or base <= 0:       # without the baseline's draw, a pair is not one
            lost = (f"; the trial of {_name(ctx, single)} to measure again near the policy's "
                    f"{pct(ctx.policy.decision.min_efficiency)} gave no measurement")
            break
        repeats = attempt - 1
        draws[single].append(float(base))
        for k in near:
            got = ctx.trial(k[0], k[1], attempt)
            draws[k].append(float(got) if got is not None and got > 0 else math.nan)
        for k, vs in draws.items():
            ok = [v for v in vs if v == v]     # a draw that gave nothing is NaN
            measured[k] = ok[0] if len(set(ok)) == 1 else \
                math.exp(sum(map(math.log, ok)) / len(ok))
    if not repeats:
        return lost[2:]
    words, floor = [], ctx.policy.decision.min_efficiency
    for k, vs in draws.items():
        if k == single or len(vs) < 2:
            continue
        pairs = [round(v / b / _key_n(k), 9) for v, b in zip(vs, draws[single]) if v == v]
        mean = round(measured[k] / measured[single] / _key_n(k), 9)
        words.append(f"{_short(ctx, k)} " + ", ".join(pct(e) for e in pairs) +
                     f" (mean {pct_of(mean, floor)})")
    return (f"measured again near the policy's {pct(floor)} with "
            f"the baseline ({repeats} more round{'s' if repeats > 1 else ''}, at most "
            f"{NEAR_FLOOR_REPEATS}): " + "; ".join(words) + lost)


def _near_floor(ctx, scores: dict, win, win_speedup: float, draws: dict) -> str:
    """"; DDP×2's measured 63% is within ..." for every candidate _near the floor."""
    floor = ctx.policy.decision.min_efficiency
    spread = pct(math.expm1(TRIAL_SPREAD))
    said = []
    for k, (e, m, other) in _near(ctx, scores, win, win_speedup, draws).items():
        over = "one trial" if m == 1 else f"the mean of {m} trials"
        said.append(f"{_short(ctx, k)}'s measured {pct_of(e, floor)} is within two run-to-run "
                    f"standard deviations of {over} (±{spread} each"
                    + (f", ±{pct(math.expm1(_reach(m) / 2))} for the mean" if m > 1 else "")
                    + f") of the policy's {pct(floor)}: another run could land on the other "
                    f"side ({other})")
    return "".join(f"; {x}" for x in said)


SUPERLINEAR = 1.05      # a measured speedup above N× this on N GPUs is checked, never shown bare


def _superlinear(ctx, measured: dict, single, keys) -> str:
    """'DDP×2 2.40× on 2 GPUs' for every measured candidate above N× of one GPU, or ''."""
    if single not in measured or not measured[single]:
        return ""
    over = [f"{_short(ctx, k)} {times(measured[k] / measured[single])} on {_key_n(k)} GPUs"
            for k in keys if k != single and k in measured
            and measured[k] / measured[single] > _key_n(k) * SUPERLINEAR]
    return ", ".join(over)


def _fallback(ctx, scaled: list, why: str) -> Choice:
    """decision.fallback_strategy's largest group here, else the baseline on one GPU."""
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
