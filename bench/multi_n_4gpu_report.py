#!/usr/bin/env python3
"""Issue 27's report from bench/multi_n_4gpu.py's records: per row the allowed and the
unconstrained best, smartlaunch's choice under each policy, regret both ways, predicted against
measured speedup per N, the cold decision's time and where it went, and smartlaunch's DDP×4
against torchrun's; then the goals. Pure functions over records, plus the CLI:

    python bench/multi_n_4gpu_report.py OUT_DIR_OR_RECORDS... [--run LABEL] [--out README.md] [--json F]

Several record files (two device calls) merge; a row is scored only against the single runs
of its own call (a speedup is a ratio from one call on one machine).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import multi_n
from common import read_jsonl

GOAL_REGRET_POLICY = 0.02
GOAL_REGRET_FREE = 0.05
GOAL_COLD_S = 20.0
GOAL_RATIO = 0.99
SUPERLINEAR = 1.05        # speedup above this x N: the reference is suspect, not the DDP run
DRIFT = 0.05              # single at the block's end vs its start; a window's last part vs first
DISAGREE = 0.10           # the dry run's one-GPU rate vs the single reference


def policies() -> dict[str, tuple[float, tuple[int, ...]]]:
    """name -> (min_efficiency, world sizes an automatic choice may use)."""
    from smartlaunch.policy.api import DecisionPolicy
    d = DecisionPolicy()
    return {"throughput": (0.5, tuple(d.world_sizes)),      # bench/policy-throughput.yaml
            "default": (d.min_efficiency, tuple(d.world_sizes))}


# ---- records -------------------------------------------------------------------------------
def load(paths, runs=()) -> list[dict]:
    """Records of output directories, their records.jsonl, or data files of the common format
    (bench/results/multi-n-4gpu.jsonl: only the given runs, when given), one level each."""
    recs = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "records.jsonl"
        recs += read_jsonl(p, runs)
    return recs


_CHUNKS = re.compile(r"^chunks: step_ms=([\d.,eE+-]+)\s*$", re.M)


def parse_chunks(text: str) -> list[float] | None:
    found = _CHUNKS.findall(text or "")
    return [float(x) for x in found[-1].split(",") if x] if found else None


def part(r: dict) -> str:
    """ddp2/ddp3/ddp4, cold, default, launch, single, check, baseline."""
    return f"ddp{r.get('nproc')}" if r["kind"] == "ddp" else r["kind"]


def chunk_drift(chunks) -> float | None:
    """The window's last part against its first (+: it slowed down)."""
    if not chunks or len(chunks) < 2 or chunks[0] <= 0:
        return None
    return chunks[-1] / chunks[0] - 1


def describe(r: dict) -> str:
    what = f"{part(r):8} {r.get('script', '-'):18} {r.get('condition') or '-':7}"
    if r.get("variant"):
        what += f" [{r['variant']}]"
    if not r.get("ok"):
        return f"{what} FAILED {r.get('error', '')[:200]}"
    if r["kind"] == "baseline":
        return f"{what} python + torch import {r['wall_s']:.2f} s"
    if r["kind"] in ("cold", "default"):
        return (f"{what} {r.get('choice')}×{r.get('nproc_per_node')} pred "
                f"{multi_n.predicted(r)} {r['wall_s']:.1f} s")
    drift = chunk_drift(r.get("chunks_ms"))
    world = "" if r.get("world") is None else f", world {r['world']}"
    window = "" if drift is None else f", window drift {drift:+.1%}"
    return (f"{what} {r.get('samples_per_s') or 0:,.1f} samples/s, "
            f"step {r.get('step_ms') or 0:.2f} ms{world}{window}, {r['wall_s']:.1f} s")


def _latest(records, **match) -> dict | None:
    """The last successful record matching, else the last one."""
    got = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    ok = [r for r in got if r.get("ok")]
    return (ok or got or [None])[-1]


# ---- scoring -------------------------------------------------------------------------------
def allowed(measured: dict[int, float], min_eff: float, sizes) -> dict[int, float]:
    """What a policy permits by measurement: single, and DDP×N of its sizes at or above its
    efficiency floor (speedup ≥ min_eff × N)."""
    if 1 not in measured:
        return {}
    one = measured[1]
    return {n: v for n, v in measured.items()
            if n == 1 or (n in sizes and v / one >= min_eff * n)}


def best(measured: dict[int, float]) -> int | None:
    return max(measured, key=lambda n: (measured[n], -n)) if measured else None


def chosen_n(rec: dict | None) -> int | None:
    if not rec or not rec.get("ok"):
        return None
    return multi_n.choice_n(rec.get("choice"), rec.get("nproc_per_node"), 4)


def score(measured: dict[int, float], n: int | None, min_eff: float, sizes) -> dict[str, Any]:
    """Regret of choosing n: under the policy (against the best it permits by measurement;
    never below 0, a choice the measurement puts outside the policy is flagged) and
    unconstrained (against the best of every N measured)."""
    ok = allowed(measured, min_eff, sizes)
    a, u = best(ok), best(measured)
    out = {"allowed_best": a, "free_best": u, "n": n, "regret_policy": None,
           "regret_free": None, "outside_policy": None}
    if n is None or n not in measured or 1 not in measured or len(measured) < 2:
        return out
    out["regret_policy"] = max(0.0, 1 - measured[n] / measured[a])
    out["regret_free"] = 1 - measured[n] / measured[u]
    out["outside_policy"] = n not in ok
    return out


def build(records: list[dict]) -> dict[str, Any]:
    """{rows, check, summary} from every record given."""
    pols = policies()
    floors = {r.get("call"): r["wall_s"] for r in records if r["kind"] == "baseline" and r.get("ok")}
    keys = []
    for r in records:
        if r.get("row") and (r["row"], r["script"], r["condition"]) not in keys:
            keys.append((r["row"], r["script"], r["condition"]))
    rows = []
    for row, script, cond in sorted(keys):
        mine = [r for r in records if r.get("row") == row]
        ddps = {n: _latest(mine, kind="ddp", nproc=n) for n in (2, 3, 4)}
        calls = [r.get("call") for r in ddps.values() if r and r.get("ok")]
        call = calls[-1] if calls else (mine[-1].get("call") if mine else None)
        singles = [r for r in records if r["kind"] == "single" and r["script"] == script
                   and r.get("call") == call and r.get("ok")]
        rates = [r["samples_per_s"] for r in singles]
        ref = statistics.median(rates) if rates else None
        start = next((r for r in singles if r.get("position") == "start"), None)
        end = next((r for r in reversed(singles) if r.get("position") == "end"), None)
        measured = {1: ref} if ref else {}
        for n, r in ddps.items():
            if r and r.get("ok") and r.get("call") == call and (r.get("samples_per_s") or 0) > 0:
                measured[n] = r["samples_per_s"]
        cold = _latest(mine, kind="cold")
        default = _latest(mine, kind="default")
        launch = _latest(mine, kind="launch")
        scores = {"throughput": score(measured, chosen_n(cold), *pols["throughput"]),
                  "default": score(measured, chosen_n(default), *pols["default"])}
        pred = multi_n.predicted(cold) if cold and cold.get("ok") else {}
        meas = {n: v / ref for n, v in measured.items() if ref and n > 1}
        t = (cold or {}).get("timings") or {}
        total = t.get("since_process_start") or (cold or {}).get("wall_s")
        floor = floors.get((cold or {}).get("call"))
        beyond = (total - floor - ((cold or {}).get("startup_s") or 0.0)
                  if cold and cold.get("ok") and total is not None and floor is not None else None)
        top = launch.get("world") if launch and launch.get("ok") else None
        ddpn = measured.get(top) if top and top > 1 else None
        ratio = launch["samples_per_s"] / ddpn if ddpn else None
        dry = None
        if cold and cold.get("ok") and cold.get("step_time_s") and cold.get("profile_batch"):
            dry = cold["profile_batch"] / cold["step_time_s"]
        runs = [r for r in [*singles, *ddps.values(), launch] if r and r.get("ok")]
        drifts = [d for d in (chunk_drift(r.get("chunks_ms")) for r in runs) if d is not None]
        flags = [f"DDP×{n} {s:.2f}× > {SUPERLINEAR:.2f}×N: reference suspect"
                 for n, s in meas.items() if s > SUPERLINEAR * n]
        drift = end["samples_per_s"] / start["samples_per_s"] - 1 if start and end else None
        if drift is not None and abs(drift) > DRIFT:
            flags.append(f"single drifted {drift:+.1%} across the block")
        if dry and ref and abs(dry / ref - 1) > DISAGREE:
            flags.append(f"dry run's one-GPU rate {dry / ref:.2f}× the reference")
        if drifts and max(abs(d) for d in drifts) > DRIFT:
            flags.append(f"a window's last part {max(drifts, key=abs):+.1%} vs its first")
        for pol, s in scores.items():
            if s["outside_policy"]:
                flags.append(f"{pol}: the choice measures below the policy's efficiency floor")
        rows.append({
            "row": row, "script": script, "condition": cond, "call": call,
            "single_sps": ref, "single_runs": rates, "single_drift": drift,
            "measured_sps": measured, "measured_speedup": meas, "predicted_speedup": pred,
            "predicted_by_trial": {len(c.get("gpus") or ()): bool(c.get("measured"))
                                   for c in (cold or {}).get("candidates") or ()
                                   if c.get("strategy") == "ddp"},
            "scores": scores,
            "dry_run_sps": dry,
            "cold_s": (cold or {}).get("wall_s") if cold and cold.get("ok") else None,
            "cold_since_start_s": total if cold and cold.get("ok") else None,
            "cold_beyond_s": beyond, "cold_timings": t,
            "default_s": (default or {}).get("wall_s") if default and default.get("ok") else None,
            "launch_sps": launch.get("samples_per_s") if launch and launch.get("ok") else None,
            "ddp4_ratio": ratio, "window_drift_max": max(drifts, key=abs) if drifts else None,
            "flags": flags,
            "errors": {part(r): r.get("error") for r in [*ddps.values(), cold, default, launch]
                       if r and not r.get("ok")},
        })
    check = [r for r in records if r.get("variant")]
    return {"rows": rows, "check": check, "summary": summarize(rows),
            "calls": sorted({str(r.get("call")) for r in records if r.get("call")}),
            "machines": sorted({r.get("machine", "?") for r in records}),
            "date": max((r.get("date", "") for r in records), default="")}


def summarize(rows: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": len(rows)}
    goals: dict[str, bool | None] = {}
    for pol in ("throughput", "default"):
        rp = [r["scores"][pol]["regret_policy"] for r in rows
              if r["scores"][pol]["regret_policy"] is not None]
        rf = [r["scores"][pol]["regret_free"] for r in rows
              if r["scores"][pol]["regret_free"] is not None]
        out[pol] = {"scored": len(rp), "max_policy": max(rp, default=None),
                    "mean_policy": statistics.fmean(rp) if rp else None,
                    "max_free": max(rf, default=None),
                    "mean_free": statistics.fmean(rf) if rf else None}
        goals[f"{pol} policy: regret under the policy ≤ 2% max"] = \
            None if not rp else max(rp) <= GOAL_REGRET_POLICY
        goals[f"{pol} policy: unconstrained regret ≤ 5% max"] = \
            None if not rf else max(rf) <= GOAL_REGRET_FREE
    beyond = [r["cold_beyond_s"] for r in rows if r["cold_beyond_s"] is not None]
    out["cold_beyond_s"] = {"max": max(beyond, default=None),
                            "median": statistics.median(beyond) if beyond else None}
    goals["cold decision ≤ 20 s beyond start-up (max)"] = \
        None if not beyond else max(beyond) <= GOAL_COLD_S
    ratios = [r["ddp4_ratio"] for r in rows if r["ddp4_ratio"]]
    geo = math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None
    out["ddp4_ratio"] = {"n": len(ratios), "geomean": geo, "min": min(ratios, default=None)}
    goals["the largest DDP×N under smartlaunch ÷ torchrun's ≥ 0.99 (geomean)"] = \
        None if geo is None else geo >= GOAL_RATIO
    errs = [abs(p / r["measured_speedup"][n] - 1) for r in rows
            for n, p in r["predicted_speedup"].items() if n in r["measured_speedup"]]
    out["pred_error_abs"] = {"n": len(errs), "max": max(errs, default=None),
                             "mean": statistics.fmean(errs) if errs else None}
    out["flagged_rows"] = sum(bool(r["flags"]) for r in rows)
    out["goals"] = goals
    return out


# ---- markdown ------------------------------------------------------------------------------
def _f(x, fmt="{:.2f}", none="–") -> str:
    return none if x is None else fmt.format(x)


def _pct(x) -> str:
    return _f(None if x is None else 100 * x, "{:.1f}%")


def _n(n) -> str:
    return multi_n.name(n)


LINK = {"host": "host memory", "nvlink": "NVLink"}


def render(data: dict[str, Any]) -> str:
    rows, s = data["rows"], data["summary"]
    pols = policies()
    L = [f"# DDP×N on one GPU node (issues 26, 27) — {'+'.join(data['machines'])}, {data['date']}", "",
         "Made by `bench/multi_n_4gpu.py` (calls " + ", ".join(data["calls"]) + "); rebuilt with "
         "`python bench/multi_n_4gpu_report.py <dirs>`. References: torchrun one GPU (the median "
         "of the block's runs at its start and end) and torchrun DDP×2, ×3, ×4, one after another; "
         "speedup = DDP×N ÷ that single, same per-GPU batch, same call. Allowed best: the best "
         "the policy permits by measurement (single, or DDP×N with N in its world sizes "
         f"{pols['throughput'][1]} and speedup ≥ min_efficiency × N: throughput "
         f"{pols['throughput'][0]}, default {pols['default'][0]}); unconstrained best: the best "
         "of every N. Regret = 1 − chosen ÷ best.", ""]
    if data["check"]:
        L += ["## One-GPU check: gpt-124m-b8, which one-GPU number to trust", "",
              "| # | run | samples/s | step ms | window parts (ms) | drift last/first | wall s |",
              "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(data["check"], 1):
            ch = r.get("chunks_ms")
            L.append(f"| {i} | {r['variant']} | {_f(r.get('samples_per_s'), '{:,.1f}')} | "
                     f"{_f(r.get('step_ms'), '{:.2f}')} | "
                     f"{', '.join(f'{x:.2f}' for x in ch) if ch else '–'} | "
                     f"{_pct(chunk_drift(ch))} | {_f(r.get('wall_s'), '{:.1f}')}"
                     f"{'' if r.get('ok') else ' FAILED: ' + str(r.get('error'))[:120]} |")
        L.append("")
    L += ["## Choices and regret", "",
          "| # | script | link | 1 GPU s/s | speedup ×2 / ×3 / ×4 | throughput: allowed best · "
          "free best · choice | regret policy / free | default: allowed best · choice | "
          "regret policy / free |", "|" + "---|" * 9]
    for r in rows:
        m = r["measured_speedup"]
        t, d = r["scores"]["throughput"], r["scores"]["default"]
        L.append(f"| {r['row']} | {r['script']} | {LINK.get(r['condition'], r['condition'])} | "
                 f"{_f(r['single_sps'], '{:,.0f}')} | "
                 + " / ".join(_f(m.get(n), "{:.2f}") for n in (2, 3, 4)) + " | "
                 f"{_n(t['allowed_best'])} · {_n(t['free_best'])} · **{_n(t['n'])}** | "
                 f"{_pct(t['regret_policy'])} / {_pct(t['regret_free'])} | "
                 f"{_n(d['allowed_best'])} · **{_n(d['n'])}** | "
                 f"{_pct(d['regret_policy'])} / {_pct(d['regret_free'])} |")
    L += ["", "## Predicted against measured speedup (the cold decision's plan, throughput policy)",
          "", "| # | script | link | ×2 pred / meas | ×4 pred / meas | dry run 1-GPU s/s ÷ "
          "reference | flags |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        def pm(n):
            p, mm = r["predicted_speedup"].get(n), r["measured_speedup"].get(n)
            trial = " (trial)" if r["predicted_by_trial"].get(n) else ""
            return f"{_f(p)}{trial} / {_f(mm)}"
        dr = r["dry_run_sps"] / r["single_sps"] if r["dry_run_sps"] and r["single_sps"] else None
        L.append(f"| {r['row']} | {r['script']} | {LINK.get(r['condition'], r['condition'])} | "
                 f"{pm(2)} | {pm(4)} | {_f(dr)} | {'; '.join(r['flags']) or '–'} |")
    L += ["", "## Cold decision (empty cache, throughput policy) and the largest DDP×N under smartlaunch", "",
          "Beyond start-up = the command's own clock (`since_process_start`) − `import torch, "
          "torch.distributed.run` in this call − the dry run's time to its first step. Seconds.",
          "", "| # | script | link | command | beyond start-up | profile (gate) | all-reduce "
          "(early) | trials (start/set-up/steps/exit) | default-policy call | largest DDP×N SL ÷ torchrun |",
          "|" + "---|" * 10]
    for r in rows:
        t = r["cold_timings"]
        prof = _f(t.get("profile"), "{:.1f}") + (f" ({t['profile_gate']:.1f})" if "profile_gate" in t else "")
        comm = _f(t.get("allreduce"), "{:.1f}") + (f" ({t['allreduce_early']:.1f})" if "allreduce_early" in t else "")
        trials = _f(t.get("trials"), "{:.1f}") + (
            " (" + "/".join(f"{t.get(f'trials_{k}', 0):.1f}" for k in ("start", "setup", "steps", "exit"))
            + ")" if t.get("trials") else "")
        L.append(f"| {r['row']} | {r['script']} | {LINK.get(r['condition'], r['condition'])} | "
                 f"{_f(r['cold_s'], '{:.1f}')} | {_f(r['cold_beyond_s'], '{:.1f}')} | {prof} | "
                 f"{comm} | {trials} | {_f(r['default_s'], '{:.1f}')} | {_f(r['ddp4_ratio'], '{:.3f}')} |")
    L += ["", "## Summary", ""]
    for pol in ("throughput", "default"):
        p = s[pol]
        L.append(f"- {pol} policy, {p['scored']} rows scored: regret under the policy max "
                 f"{_pct(p['max_policy'])} (mean {_pct(p['mean_policy'])}); unconstrained max "
                 f"{_pct(p['max_free'])} (mean {_pct(p['mean_free'])}).")
    pe, c, q = s["pred_error_abs"], s["cold_beyond_s"], s["ddp4_ratio"]
    L += [f"- Predicted vs measured speedup (every N the plan gave): max |pred ÷ meas − 1| "
          f"{_pct(pe['max'])}, mean {_pct(pe['mean'])} over {pe['n']}.",
          f"- Cold decision beyond start-up: max {_f(c['max'], '{:.1f}')} s, median "
          f"{_f(c['median'], '{:.1f}')} s.",
          f"- the largest DDP×N under smartlaunch ÷ torchrun's: geomean {_f(q['geomean'], '{:.3f}')}, min "
          f"{_f(q['min'], '{:.3f}')} over {q['n']} rows.",
          f"- Rows flagged (suspect reference, drift, dry-run disagreement): {s['flagged_rows']} "
          f"of {s['rows']}.", "",
          "Goals: " + "; ".join(f"{k}: {'no data' if v is None else ('met' if v else 'NOT met')}"
                                for k, v in s["goals"].items()) + "."]
    errors = [(r["row"], r["script"], r["condition"], k, v) for r in rows
              for k, v in r["errors"].items()]
    if errors:
        L += ["", "## Failed runs", ""] + [f"- row {a} {b} / {c} / {k}: {v}" for a, b, c, k, v in errors]
    return "\n".join(L) + "\n"


def write(records: list[dict], out: Path, name: str = "README.md") -> list[Path]:
    if not records:
        return []
    data = build(records)
    md, js = out / name, out / "summary.json"
    md.write_text(render(data))
    js.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    return [md, js]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", help="output directories, records.jsonl files or "
                    "data files (bench/results/multi-n-4gpu.jsonl)")
    ap.add_argument("--run", action="append", default=[],
                    help="from data files, only these runs (a label or its prefix; repeatable)")
    ap.add_argument("--out", help="markdown file (default: print)")
    ap.add_argument("--json", help="also write the rows and summary here")
    args = ap.parse_args(argv)
    records = load(args.sources, args.run)
    if not records:
        print(f"no records in {', '.join(args.sources)}; give the directory bench/multi_n_4gpu.py "
              "wrote (--out) or its records.jsonl", file=sys.stderr)
        return 2
    data = build(records)
    text = render(data)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
