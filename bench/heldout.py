#!/usr/bin/env python3
"""Held-out report: the frozen cost model on scripts it was never fitted on.

Reads regret records of the held-out scripts (bench/regret.py on common.HELD_OUT) and writes
one markdown report: per row the measured DDP speedup, the frozen model's replayed
prediction, smartlaunch's choice as it ran, and the choice the model and its uncertainty band
alone would have made (a prediction within MODEL_ERROR of the policy's threshold goes to a
trial; where the record holds that trial's measurement it decides, otherwise the row is
counted as "trial, not run"). Error figures are |ln(predicted / measured)| and the relative
|predicted / measured - 1|, median and 90th percentile, next to the fit's own error on the
old suite (bench/results/cost-fit-old-suite.json, written by fit_cost.py --json).

    python bench/heldout.py OUT.md records.jsonl [records.jsonl ...] [--run LABEL] [--floor 0.5]
        [--constants calibration.json ...]
    python bench/heldout.py OUT.md bench/results/regret.jsonl --run heldout   # all 24 rows

--constants: calibration records (`smartlaunch-node calibrate --out FILE`, one per link
condition, matched to a row by the record's NCCL_* variables, bench/common.CONDITIONS) replace
the shipped κ, per-step overhead and per-tensor cost for the rows of their condition; the
report then gives the speedup error of both sets of constants on the same rows. Nothing is
fitted: the records come from synthetic models, so the held-out rows stay held out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import multi_n  # noqa: E402
import fit_cost  # noqa: E402
from smartlaunch.decide.cost import MODEL_ERROR, CostModel, calibrated, predict_ddp  # noqa: E402

FIT = Path(__file__).parent / "results" / "cost-fit-old-suite.json"


def band_choice(pred: float, trial: float | None, floor: float, p90: float, n: int = 2) -> str:
    """What the model and its band decide: 'ddp', 'single', 'trial→ddp' / 'trial→single' by the
    recorded trial, or 'trial?' (inside the band, no trial recorded)."""
    eff = pred / n
    if abs(math.log(max(eff, 1e-9) / floor)) <= p90:
        if trial is None:
            return "trial?"
        return "trial→" + ("ddp" if trial / n >= floor and trial > 1 else "single")
    return "ddp" if eff >= floor and pred > 1 else "single"


def trial_speedup(sl: dict | None, n: int = 2) -> float | None:
    for c in (sl or {}).get("candidates") or ():
        if c.get("strategy") == "ddp" and len(c.get("gpus") or ()) == n and c.get("measured"):
            return c.get("speedup")
    return None


def node_models(paths: list[Path]) -> dict[str, tuple[CostModel, str]]:
    """Link condition -> (the cost model with that record's constants, its --explain text)."""
    out = {}
    for path in paths:
        record = json.loads(path.read_text())
        # The machine's own settings (NVLS off on the lent machines, NCCL's version) are in
        # every record; only the variables that make a link condition tell them apart.
        env = {k: v for k, v in (record.get("nccl") or {}).items()
               if k not in common.REQUIRED_ENV and k != "NCCL_VERSION"}
        cond = next((c for c, e in common.CONDITIONS.items() if e == env), None)
        if cond is None:
            raise SystemExit(f"{path}: its NCCL_* variables {env} match no link condition of "
                             f"bench/common.py ({', '.join(common.CONDITIONS)}); a record "
                             "written by `smartlaunch-node calibrate --out` names them")
        if cond in out:
            raise SystemExit(f"{path}: a second record for the {cond} condition")
        model, text = calibrated(CostModel(), record)
        out[cond] = (model, f"{text}, {record.get('gpu_name', '?')} "
                            f"({record.get('backend', '?')}), {path.name}")
    return out


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--floor", type=float, default=0.5, help="the policy's min_efficiency")
    ap.add_argument("--band-p90", type=float, default=MODEL_ERROR.p90_log,
                    help="|ln error| inside which a trial decides (default: MODEL_ERROR's; give "
                         "the figure that was in force when the records were measured)")
    ap.add_argument("--constants", nargs="+", type=Path, default=[],
                    help="calibration records (smartlaunch-node calibrate --out), one per link "
                         "condition: replay with them too and compare with the shipped constants")
    ap.add_argument("--run", action="append", default=[],
                    help="from data files (bench/results/regret.jsonl), only these runs (a label "
                         "or its prefix, e.g. heldout; repeatable)")
    args = ap.parse_args(argv)
    node = node_models(args.constants)
    node_errs, shipped_errs = [], []
    records = fit_cost.load(args.records, args.run)
    by = common.latest(records)
    rows = fit_cost.rows_from(records)
    table = common.build_rows(records)
    model = CostModel()
    errs, out = [], []
    regrets = {"as run": [], "model + band": [], "always-DDP": [], "seeds' rule": []}
    for r in table:
        sl = by.get(("smartlaunch", r["script"], r["condition"]))
        rep = next((x for x in rows if (x["script"], x["condition"]) == (r["script"], r["condition"])), None)
        if rep is None:
            continue
        # the plan's curve is its chosen group's: DDP×n, measured at the same n (issue 17)
        n, meas = rep["curve"].world_size, rep["measured"]
        pred = predict_ddp(rep["profile"], rep["curve"], n, model).speedup
        errs.append(math.log(pred / meas))
        if r["condition"] in node:
            shipped_errs.append(errs[-1])
            node_pred = predict_ddp(rep["profile"], rep["curve"], n, node[r["condition"]][0])
            node_errs.append(math.log(node_pred.speedup / meas))
        choice = band_choice(pred, trial_speedup(sl, n), args.floor, args.band_p90, n)
        rates = {1: r["single_sps"], **{k: v for k, v in r["ddp_sps_by_n"].items() if v}}
        mb = (multi_n.regret(n if choice.endswith("ddp") else 1, rates)
              if choice != "trial?" else None)
        for k, v in (("as run", r["regret"]["smartlaunch"]), ("model + band", mb),
                     ("always-DDP", r["regret"]["always_ddp"]), ("seeds' rule", r["regret"]["seeds"])):
            if v is not None:
                regrets[k].append(v)
        prof = rep["profile"]
        single = by.get(("single", r["script"], None)) or {}
        dec = "–" if r["decision_s"] is None else f"{r['decision_s']:.1f}"
        out.append(f"| {r['script']} | {r['condition']} | {meas:.2f} | {pred:.2f} | "
                   f"{100 * (pred / meas - 1):+.1f}% | {r['choice']['smartlaunch'] or '–'}"
                   f"{' (trial)' if r.get('predicted_by_trial') else ''} | {pct(r['regret']['smartlaunch'])} | "
                   f"{choice} | {pct(mb)} | {pct(r['regret']['always_ddp'])} | {pct(r['regret']['seeds'])} | "
                   f"{1e3 * prof.step_time_s:.2f} / {single.get('step_ms', float('nan')):.2f} | "
                   f"{dec} |")
    s = fit_cost.stats(errs)
    fit = json.loads(FIT.read_text()) if FIT.exists() else {}
    lines = ["# Held-out validation of the frozen cost model", "",
             f"Constants frozen in commit 9a133e3 before any held-out script was measured; "
             f"band replayed: p90 |ln err| {args.band_p90}; "
             f"policy min_efficiency {args.floor}. Records: "
             + ", ".join(f"`{p}`" for p in args.records)
             + (f" (runs {', '.join(args.run)})" if args.run else ""), "",
             "| script | link | measured | model | model err | smartlaunch (as run) | regret | "
             "model + band | regret | always-DDP | seeds | profile / script step ms | decide s |",
             "|" + "---|" * 13, *out, "",
             "## Error of the predicted DDP speedup", "",
             "| rows | what | median | p90 | median ln | p90 ln | within ±15% |", "|---|---|---|---|---|---|---|"]

    def erow(name, st):
        return (f"| {st['rows']} | {name} | {pct(st['median_rel'])} | {pct(st['p90_rel'])} | "
                f"{st['median_log']:.3f} | {st['p90_log']:.3f} | {st['within_15pct']} |")
    if fit.get("current"):
        lines.append(erow("old suite, frozen constants (in the fit)", fit["current"]["error"]))
    if fit.get("leave_one_script_out"):
        lines.append(erow("old suite, leave-one-script-out", fit["leave_one_script_out"]))
    lines.append(erow("**held-out scripts (new)**", s))
    if node_errs:
        lines += [erow("held-out rows with a calibration record, shipped constants",
                       fit_cost.stats(shipped_errs)),
                  erow("the same rows, node-measured constants", fit_cost.stats(node_errs)),
                  "", "Node-measured constants (from calibration records, not fitted on any "
                  "row):", *(f"- {c}: {t}" for c, (_, t) in node.items())]
    lines += ["", "## Regret", "",
              "| policy | rows | mean | max |", "|---|---|---|---|"]
    for k, v in regrets.items():
        if v:
            lines.append(f"| {k} | {len(v)} | {pct(sum(v) / len(v))} | {pct(max(v))} |")
    untried = sum(1 for line in out if "| trial? |" in line)
    if untried:
        lines.append(f"\n{untried} row(s) fell inside the band but no trial was recorded "
                     "(model-only run): not counted under model + band.")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
