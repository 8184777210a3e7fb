"""After trials: correct the untried candidates' predictions by what the tried ones measured,
and say whether the choice is settled. Pure functions over speedups keyed by any hashable key."""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

Key = Hashable


@dataclass(frozen=True)
class Corrected:
    """An untried candidate's prediction after the trials."""
    speedup: float                  # predicted × ratio
    predicted: float                # the cost model's own speedup
    ratio: float                    # measured / predicted of the tried neighbours (1.0: none)
    basis: tuple = ()               # the tried keys the ratio comes from


@dataclass(frozen=True)
class Settled:
    """What the trials so far leave."""
    winner: Key                     # the best measured candidate (the baseline when none meets)
    corrected: dict = field(default_factory=dict)   # untried key -> Corrected
    open: tuple = ()                # untried keys that may still win within the band
    to_try: Key | None = None       # the first of `open` that can still be tried
    by_prediction: Key | None = None   # nothing left to try: the open one that wins as predicted


def pick(scores: Mapping[Key, float | None], baseline: Key, size: Callable[[Key], int],
         floor: float) -> Key:
    """The most samples/s among the non-baseline keys whose speedup / size meets `floor` and
    beats the baseline; otherwise the baseline. Ties go to fewer GPUs."""
    ok = [k for k, s in scores.items() if k != baseline and s is not None
          and s / size(k) >= floor and s > 1.0]
    return max(ok, key=lambda k: (scores[k], -size(k))) if ok else baseline


def correct(predicted: Mapping[Key, float], measured: Mapping[Key, float],
            size: Callable[[Key], int], family: Callable[[Key], str]) -> dict[Key, Corrected]:
    """Every predicted key not in `measured`, scaled by measured / predicted of the nearest
    measured size of its family (else any family's; equally near ones: geometric mean)."""
    ratios = {k: measured[k] / predicted[k] for k in measured
              if predicted.get(k) and measured[k] > 0}
    out = {}
    for k, p in predicted.items():
        if k in measured or p is None:
            continue
        pool = [t for t in ratios if family(t) == family(k)] or list(ratios)
        if not pool:
            out[k] = Corrected(p, p, 1.0)
            continue
        gap = min(abs(size(t) - size(k)) for t in pool)
        near = tuple(sorted((t for t in pool if abs(size(t) - size(k)) == gap), key=size))
        r = math.exp(sum(math.log(ratios[t]) for t in near) / len(near))
        out[k] = Corrected(p * r, p, r, near)
    return out


def settle(measured: Mapping[Key, float], predicted: Mapping[Key, float], baseline: Key, *,
           size: Callable[[Key], int], family: Callable[[Key], str], floor: float, band: float,
           can_try: Callable[[Key], bool] = lambda k: True) -> Settled:
    """measured: speedups from trials (the baseline's 1.0 among them); band: the prediction's
    relative error. An untried candidate is open when its corrected speedup × (1 + band) meets
    the floor and beats the winner; can_try: whether a trial of it may still run."""
    winner = pick(measured, baseline, size, floor)
    best = measured[winner]
    corrected = correct(predicted, measured, size, family)
    edge = 1.0 + band
    open_ = sorted((k for k, c in corrected.items()
                    if c.speedup * edge / size(k) >= floor and c.speedup * edge > max(best, 1.0)),
                   key=lambda k: (-corrected[k].speedup, size(k)))
    to_try = next((k for k in open_ if can_try(k)), None)
    by_prediction = None
    if to_try is None:
        sure = {k: corrected[k].speedup for k in open_}
        top = pick({baseline: 1.0, **sure}, baseline, size, floor)
        if top != baseline and sure[top] > best:
            by_prediction = top
    return Settled(winner, corrected, tuple(open_), to_try, by_prediction)
