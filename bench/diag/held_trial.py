#!/usr/bin/env python3
"""Held trials on a real GPU: the same candidate measured again in its held ranks against trials
started afresh (profile/trial.py, `hold`). For each candidate given, one after another: R trials
afresh (hold 0), then R trials from one runner holding it (the first starts it, the rest measure
another window in the same ranks). Prints one JSON line per trial: how it ran, samples/s, wall
seconds of the call; the summary compares the rates and the seconds.

    python bench/diag/held_trial.py --script cnn-small-b128 --gpus 0 --rounds 3 --out $OUT/held.json
    python bench/diag/held_trial.py --script cnn-small-b128 --gpus 0 --rounds 2 --tiny \\
        --fake h200-nv18-pair --out /tmp/held.json                      # CPU smoke (gloo)
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from held_pair import trial_inputs  # noqa: E402

from smartlaunch.profile.session import Session  # noqa: E402
from smartlaunch.profile.trial import make_trial_runner  # noqa: E402
from smartlaunch.vocab import Strategy  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", default="cnn-small-b128")
    ap.add_argument("--gpus", default="0", help="one GPU: single; more: DDP on them")
    ap.add_argument("--condition", default="host", choices=sorted(common.CONDITIONS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fake", help="topology fixture name (CPU machines)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    gpus = tuple(int(g) for g in args.gpus.split(","))
    request, policy, topology, env = trial_inputs(
        args.script, args.condition if len(gpus) > 1 else None, args.fake, args.tiny)
    strategy = Strategy.DDP if len(gpus) > 1 else Strategy.SINGLE
    rows = []
    for hold in (0, 1):
        with Session() as session:
            logs: list[str] = []
            trial = make_trial_runner(request, policy, env, topology=topology, session=session,
                                      log=logs.append, hold=hold)
            for k in range(args.rounds):
                t0 = time.monotonic()
                rate = trial(strategy, gpus)
                row = {"how": "held" if hold and k else "afresh", "hold": hold, "k": k,
                       "samples_per_s": rate, "wall_s": round(time.monotonic() - t0, 3),
                       "stages": len(session.stages), "log": logs[-1][-400:] if logs else ""}
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for how in ("afresh", "held"):
        got = [r for r in rows if r["how"] == how and r["samples_per_s"]]
        if got:
            logs_ = [math.log(r["samples_per_s"]) for r in got]
            summary[how] = {"n": len(got), "samples_per_s": math.exp(statistics.fmean(logs_)),
                            "sd_ln": statistics.stdev(logs_) if len(got) > 1 else None,
                            "wall_s": statistics.median(r["wall_s"] for r in got)}
    print(json.dumps({"summary": summary}), flush=True)
    Path(args.out).write_text(json.dumps({"script": args.script, "gpus": gpus, "rows": rows,
                                          "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
