#!/usr/bin/env python3
"""Calibrate the cost model's constants from a regret run, and say how well they hold out.

Reads regret records (bench/regret.py's regret-records.jsonl, or runs of the data file
bench/results/regret.jsonl), replays the cost model on every row that has
its profile, all-reduce curve and measured single/DDP rates, and grid-searches the fitted
constants (compute_slowdown, ddp_overhead_s, per_tensor_s, contention_s_per_byte,
contention_cap) for the least mean |ln(predicted / measured)|. Leave-one-script-out: each
script's rows are predicted by constants fitted without it, the error to expect on a model that
was not in the fit; its 90th percentile is what `MODEL_ERROR` in smartlaunch/decide/cost.py
records until a held-out run replaces it.

    python bench/fit_cost.py [records.jsonl ...] [--run LABEL]   # fit, leave-one-script-out
    python bench/fit_cost.py --held-out records.jsonl            # the current constants, no fit

Without files: the suite's 24 rows the shipped constants were fitted on (run suite-s2 of
bench/results/regret.jsonl, 2x H200, 2026-11-22).

A held-out evaluation never fits: run it only on scripts measured after the constants were
committed (bench/README.md, "Calibrating the cost model").
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import multi_n  # noqa: E402
from smartlaunch.decide.cost import CostModel, predict_ddp  # noqa: E402

SUITE_DATA = Path(__file__).parent / "results" / "regret.jsonl"
SUITE_RUNS = ("suite-s2",)          # the rows the shipped constants were fitted on

GRID = {
    "compute_slowdown": [1.0, 1.05, 1.1, 1.15, 1.2, 1.3],
    "ddp_overhead_s": [1e-4 * i for i in range(0, 13)],
    "per_tensor_s": [0.0, 1e-6, 2e-6, 4e-6, 8e-6],
    "contention_s_per_byte": [2e-12 * i for i in range(0, 16)],
    "contention_cap": [0.25, 0.5, 0.75, 1.0],
}

# Buffer bytes of the old suite's models (their records predate the profile's buffer_bytes
# field): BatchNorm running mean and variance in fp32 plus an int64 counter per layer.
OLD_BUFFERS = {"cnn-small-b128": 2 * 4 * (64 + 128 + 256 + 256) + 8 * 4,
               "resnet50-b64": 2 * 4 * 26_560 + 8 * 53,
               "resnet18-b64": 2 * 4 * 4_800 + 8 * 20}


def rows_from(records: list[dict]) -> list[dict]:
    by = common.latest(records)
    out = []
    for (kind, script, cond), rec in by.items():
        inputs = common.replay_inputs(rec) if kind == "smartlaunch" and rec.get("ok") else None
        # The plan carries its chosen group's curve: compare with DDP×N at that N (issue 17).
        n = inputs[1].world_size if inputs is not None else multi_n.LEGACY_N
        single, ddp = by.get(("single", script, None)), by.get((multi_n.ddp_label(n), script, cond))
        if inputs is None or not (single and single.get("ok") and ddp and ddp.get("ok")):
            continue
        prof = inputs[0]
        if not prof.buffer_bytes and script in OLD_BUFFERS:
            prof = dataclasses.replace(prof, buffer_bytes=OLD_BUFFERS[script])
        out.append({"script": script, "condition": cond, "profile": prof,
                    "curve": inputs[1], "measured": ddp["samples_per_s"] / single["samples_per_s"]})
    return out


def errors(rows: list[dict], model: CostModel) -> list[float]:
    """ln(predicted / measured) per row."""
    return [math.log(predict_ddp(r["profile"], r["curve"], r["curve"].world_size, model).speedup
                     / r["measured"]) for r in rows]


def fit(rows: list[dict]) -> tuple[CostModel, float]:
    best = None
    for values in itertools.product(*GRID.values()):
        m = dataclasses.replace(CostModel(), **dict(zip(GRID, values)))
        score = statistics.fmean(abs(e) for e in errors(rows, m))
        if best is None or score < best[1]:
            best = (m, score)
    return best


def pctl(xs: list[float], q: float) -> float:
    """The q-quantile by linear interpolation (numpy's default)."""
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = math.floor(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def stats(errs: list[float]) -> dict:
    a = [abs(e) for e in errs]
    rel = [abs(math.expm1(e)) for e in errs]
    return {"rows": len(a), "median_log": statistics.median(a), "p90_log": pctl(a, 0.9),
            "mean_log": statistics.fmean(a), "max_log": max(a),
            "median_rel": statistics.median(rel), "p90_rel": pctl(rel, 0.9),
            "within_15pct": sum(x <= 0.15 for x in rel)}


def describe(name: str, errs: list[float]) -> str:
    s = stats(errs)
    return (f"{name}: {s['rows']} rows, |error| median {100 * s['median_rel']:.1f}%, "
            f"p90 {100 * s['p90_rel']:.1f}% (log: median {s['median_log']:.3f}, p90 "
            f"{s['p90_log']:.3f}), {s['within_15pct']} within ±15%")


def load(paths: list[Path], runs=()) -> list[dict]:
    """Regret records of these files, one level each; from data files only the given runs."""
    return [r for p in paths for r in common.read_jsonl(p, runs)]


def constants(m: CostModel) -> dict:
    return {k: getattr(m, k) for k in GRID}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="*", type=Path)
    ap.add_argument("--held-out", action="store_true",
                    help="evaluate the current constants only (no fit)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--run", action="append", default=[],
                    help="from data files, only these runs (a label or its prefix; repeatable)")
    args = ap.parse_args(argv)
    paths = args.records or [SUITE_DATA]
    runs = args.run or ([] if args.records else list(SUITE_RUNS))
    rows = rows_from(load(paths, runs))
    if not rows:
        print(f"{', '.join(map(str, paths))}: no replayable rows (records need the profile and "
              "comm fields)")
        return 1
    current = CostModel()
    out = {"records": [str(p) for p in paths], "runs": runs, "current": {"constants": constants(current),
                                                          "error": stats(errors(rows, current))}}
    print(describe("current constants", errors(rows, current)))
    if not args.held_out:
        best, _ = fit(rows)
        print(describe("fitted on all rows", errors(rows, best)))
        print("  " + ", ".join(f"{k}={getattr(best, k):.3g}" for k in GRID))
        out["fit"] = {"constants": constants(best), "error": stats(errors(rows, best))}
        held = []
        scripts = sorted({r["script"] for r in rows})
        for script in scripts if len(scripts) > 1 else ():
            mine = [r for r in rows if r["script"] == script]
            m, _ = fit([r for r in rows if r["script"] != script])
            held += errors(mine, m)
        if held:
            print(describe("leave-one-script-out", held))
            out["leave_one_script_out"] = stats(held)
    print("\nper row (current constants):")
    out["rows"] = []
    for r, e in zip(rows, errors(rows, current)):
        pred = r["measured"] * math.exp(e)
        print(f"  {r['script']:20} {r['condition']:8} measured {r['measured']:.2f}  predicted "
              f"{pred:.2f}  error {100 * math.expm1(e):+.1f}%")
        out["rows"].append({"script": r["script"], "condition": r["condition"],
                            "measured": r["measured"], "predicted": pred, "log_error": e})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
