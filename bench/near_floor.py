#!/usr/bin/env python3
"""Near the default policy's floor: torchrun's own spread against the decision's draws.

On 4× H200 (2026-11-28) the default policy (min_efficiency 0.7) chose one GPU on two rows where
one torchrun run of DDP×2 read 71.5% and 77.5%; the decision's three draws read 56–74%. One
torchrun run cannot say which side of 70% a script is on. This measures both sides as often as
the budget allows, one job at a time, for each script, R rounds of:

    torchrun ×1, torchrun ×N      (the script's own timer; efficiency = ×N ÷ ×1 ÷ N)
    smartlaunch --explain=json    (empty cache, the default policy: its choice, its measured
                                   efficiency and the near-floor draws its reason lists)

and prints, per script, torchrun's efficiencies with their mean and standard deviation of ln,
and each decision's choice and draws. A choice is wrong only where torchrun's mean clears the
floor by more than two of its own standard errors on the other side.

    python bench/near_floor.py --scripts cnn-small-b128,bn-convnet-b64 --condition host \\
        --nproc 2 --rounds 4 --out $OUT/near-floor.json
    python bench/near_floor.py --scripts cnn-small-b128 --rounds 1 --tiny --fake h200-nv18-pair \\
        --out /tmp/nf.json                                          # CPU smoke (gloo)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common

DRAWS = re.compile(r"DDP×(\d+) ((?:\d+%, )*\d+%) \(mean (\d+)%\)")
FLOOR = 0.7


def torchrun(entry, nproc: int, env, timeout: float, extra: list[str]) -> float | None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(nproc), entry.script, *entry.args, "--warmup", str(entry.warmup),
            "--steps", str(entry.steps), *extra]
    tp = common.parse_throughput(common.run(argv, env, timeout)["stdout"])
    return tp["samples_per_s"] if tp else None


def decision(entry, nproc: int, env, timeout: float, extra: list[str]) -> dict:
    home = tempfile.mkdtemp(prefix="sl-floor-")
    env = dict(env, HOME=home, XDG_CACHE_HOME=f"{home}/cache",
               SMARTLAUNCH_LEASE_DIR=f"{home}/leases", SMARTLAUNCH_LOG_LEVEL="debug")
    argv = [*common.SMARTLAUNCH, "--explain=json", "--nproc-per-node", str(nproc), entry.script,
            *entry.args, "--warmup", str(entry.warmup), "--steps", "100000", *extra]
    res = common.run(argv, env, timeout)
    plan = common.parse_plan(res["stdout"])
    if not plan:
        return {"error": common.run_error(res, "no plan")}
    ddp = next((c for c in plan.get("candidates", []) if c.get("strategy") == "ddp"
                and len(c.get("gpus") or ()) == nproc), {})
    text = " ".join(r.get("text", "") if isinstance(r, dict) else str(r)
                    for r in plan.get("reasons", []))
    m = DRAWS.search(text)
    draws = [int(x.rstrip("%")) / 100 for x in m.group(2).split(", ")] if m else []
    # each trial in order: how it started (early or for it), its steps and step times
    trials = [ln.split("trial ", 1)[1] for ln in res["stderr"].splitlines()
              if " steps, mean " in ln and "trial " in ln]
    return {"choice": f"{plan.get('strategy')}×{plan.get('nproc_per_node')}",
            "efficiency": ddp.get("efficiency"), "measured": ddp.get("measured"),
            "draws": draws, "trials": trials, "timings": plan.get("timings"),
            "wall_s": round(res["wall_s"], 1)}


def summary(rows: list[dict], nproc: int) -> dict:
    effs = [r["torchrun_eff"] for r in rows if r.get("torchrun_eff")]
    out: dict = {"torchrun_eff": effs}
    if len(effs) >= 2:
        logs = [math.log(e) for e in effs]
        mean, sd = statistics.fmean(logs), statistics.stdev(logs)
        se = sd / math.sqrt(len(logs))
        out.update(mean=math.exp(mean), sd_ln=sd,
                   side="above" if mean - 2 * se > math.log(FLOOR) else
                   "below" if mean + 2 * se < math.log(FLOOR) else "undecided")
        right = {"above": f"ddp×{nproc}", "below": "single×1"}.get(out["side"])
        out["wrong"] = None if right is None else sum(
            1 for r in rows if r.get("decision", {}).get("choice") not in (None, right))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", default="cnn-small-b128,bn-convnet-b64")
    ap.add_argument("--condition", default="host", choices=sorted(common.CONDITIONS))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--budget", type=float, default=None, help="seconds; no round starts after")
    ap.add_argument("--fake", help="topology fixture name (CPU machines)")
    ap.add_argument("--tiny", action="store_true", help="toy models (CPU smoke)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    base = dict(os.environ, PYTHONPATH=str(common.REPO))
    if args.fake:
        base["SMARTLAUNCH_FAKE_TOPOLOGY"] = args.fake
    extra = ["--tiny"] if args.tiny else []
    single_env, ddp_env = common.child_env(base, None), common.child_env(base, args.condition)
    result: dict = {"condition": args.condition, "nproc": args.nproc, "floor": FLOOR,
                    "scripts": {}}
    for script in args.scripts.split(","):
        entry = common.entry(script)
        rows: list[dict] = []
        result["scripts"][script] = {"rounds": rows}
        for k in range(args.rounds):
            if args.budget and time.monotonic() - t0 > args.budget:
                break
            one = torchrun(entry, 1, single_env, args.timeout, extra)
            many = torchrun(entry, args.nproc, ddp_env, args.timeout, extra)
            row = {"round": k + 1, "torchrun_1": one, "torchrun_n": many,
                   "torchrun_eff": many / one / args.nproc if one and many else None,
                   "decision": decision(entry, args.nproc, ddp_env, args.timeout, extra)}
            rows.append(row)
            print(json.dumps({"script": script, **row}), flush=True)
            result["scripts"][script]["summary"] = summary(rows, args.nproc)
            Path(args.out).write_text(json.dumps(result, indent=1))
        print(json.dumps({"script": script, **result["scripts"][script].get("summary", {})}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
