#!/usr/bin/env python3
"""Calibrate the cost model's constants from a regret run, and say how well they hold out.

Reads regret-records.jsonl (bench/regret.py), replays the cost model on every row that has
its profile, all-reduce curve and measured single/DDP rates, and grid-searches
compute_slowdown x ddp_overhead_s x contention_s_per_byte for the least mean relative speedup
error. Leave-one-script-out: each script's rows are predicted by constants fitted without it,
which is the error to expect on a model that was not in the fit.

    python bench/fit_cost.py [bench/results/regret-records.jsonl]
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from smartlaunch.decide.cost import CostModel, predict_ddp  # noqa: E402

GRID = {
    "compute_slowdown": [1.0 + 0.05 * i for i in range(11)],
    "ddp_overhead_s": [1e-4 * i for i in range(16)],
    "contention_s_per_byte": [1e-12 * i for i in range(0, 31, 2)],
}


def rows_from(records: list[dict]) -> list[dict]:
    by = common.latest(records)
    out = []
    for (kind, script, cond), rec in by.items():
        inputs = common.replay_inputs(rec) if kind == "smartlaunch" and rec.get("ok") else None
        single, ddp = by.get(("single", script, None)), by.get(("ddp", script, cond))
        if inputs is None or not (single and single.get("ok") and ddp and ddp.get("ok")):
            continue
        out.append({"script": script, "condition": cond, "profile": inputs[0],
                    "curve": inputs[1], "measured": ddp["samples_per_s"] / single["samples_per_s"]})
    return out


def errors(rows: list[dict], model: CostModel) -> list[float]:
    return [predict_ddp(r["profile"], r["curve"], r["curve"].world_size, model).speedup
            / r["measured"] - 1 for r in rows]


def fit(rows: list[dict]) -> tuple[CostModel, float]:
    best = None
    for values in itertools.product(*GRID.values()):
        m = dataclasses.replace(CostModel(), **dict(zip(GRID, values)))
        score = statistics.fmean(abs(e) for e in errors(rows, m))
        if best is None or score < best[1]:
            best = (m, score)
    return best


def describe(name: str, errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return (f"{name}: mean |error| {100 * statistics.fmean(a):.1f}%, max {100 * max(a):.1f}%, "
            f"{sum(x <= 0.15 for x in a)} of {len(a)} within ±15%")


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else Path(__file__).parent / "results" / "regret-records.jsonl"
    rows = rows_from([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    if not rows:
        print(f"{path}: no replayable rows (records need the profile and comm fields)")
        return 1
    current = CostModel()
    print(describe("current constants", errors(rows, current)))
    best, _ = fit(rows)
    print(describe("fitted on all rows", errors(rows, best)))
    print("  " + ", ".join(f"{k}={getattr(best, k):.3g}" for k in GRID))
    held = []
    scripts = sorted({r["script"] for r in rows})
    for script in scripts if len(scripts) > 1 else ():
        mine = [r for r in rows if r["script"] == script]
        m, _ = fit([r for r in rows if r["script"] != script])
        held += errors(mine, m)
    if held:
        print(describe("leave-one-script-out", held))
    print("\nper row (current constants):")
    for r, e in zip(rows, errors(rows, current)):
        print(f"  {r['script']:18} {r['condition']:8} measured {r['measured']:.2f}  error {100 * e:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
