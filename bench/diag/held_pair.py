#!/usr/bin/env python3
"""Held windows next to another candidate (issue 38): does a held one-GPU trial read the same
when a DDP×2 trial measured on its GPU in between, held or ended? Three sequences, one after
another, each in its own session (s: one GPU on GPU 0, d: DDP×2 on GPUs 0,1; "held": another
window in the same ranks):

    A  s, d, s held, d held, s held, d held     (the near-floor repeats with both held)
    B  s, d, s held, d, s held                  (only s held; each d started afresh, then ended)
    C  s, s held, s held                        (s alone)

One JSON line per trial (sequence, candidate, how, samples/s, seconds); $OUT/held-pair.json.

    python bench/diag/held_pair.py --script cnn-small-b128 --out $OUT/held-pair.json
    python bench/diag/held_pair.py --tiny --fake h200-nv18-pair --out /tmp/hp.json   # CPU smoke
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

from smartlaunch.policy.load import build_policy, builtin_values  # noqa: E402
from smartlaunch.profile.session import Session  # noqa: E402
from smartlaunch.profile.trial import make_trial_runner  # noqa: E402
from smartlaunch.request import Request  # noqa: E402
from smartlaunch.topology import discover  # noqa: E402
from smartlaunch.vocab import Strategy  # noqa: E402

def trial_inputs(script: str, condition: str | None, fake: str | None, tiny: bool):
    """(request, policy, topology, environment) for trials of a suite script, as a cold decision
    under the shipped policy would run them; from the repository root."""
    base = dict(os.environ, PYTHONPATH=str(common.REPO))
    if fake:
        base["SMARTLAUNCH_FAKE_TOPOLOGY"] = fake
    env = common.child_env(base, condition)
    os.chdir(common.REPO)
    entry = common.entry(script)
    request = Request(script=entry.script, script_args=(
        *entry.args, "--warmup", str(entry.warmup), "--steps", "100000",
        *(["--tiny"] if tiny else [])))
    return request, build_policy(builtin_values()), discover(env), env


SEQUENCES = {"A": ("both", "sdsdsd"), "B": ("s", "sdsds"), "C": ("s", "sss")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", default="cnn-small-b128")
    ap.add_argument("--condition", default="host", choices=sorted(common.CONDITIONS))
    ap.add_argument("--sequences", default="A,B,C")
    ap.add_argument("--fake", help="topology fixture name (CPU machines)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    request, policy, topology, env = trial_inputs(args.script, args.condition, args.fake,
                                                  args.tiny)
    cand = {"s": (Strategy.SINGLE, (0,)), "d": (Strategy.DDP, (0, 1))}
    rows = []
    for name in args.sequences.split(","):
        held, order = SEQUENCES[name]
        with Session() as session:
            logs: list[str] = []

            def runner(hold):
                return make_trial_runner(request, policy, env, topology=topology,
                                         session=session, log=logs.append, hold=hold)
            both = runner(2)
            runners = {"s": both, "d": both} if held == "both" else {"s": runner(1), "d": runner(0)}
            seen: set = set()
            for i, c in enumerate(order):
                how = "held" if c in seen and (held == "both" or c == "s") else "afresh"
                seen.add(c)
                t0 = time.monotonic()
                rate = runners[c](*cand[c])
                row = {"sequence": name, "i": i, "candidate": c, "how": how,
                       "samples_per_s": rate, "wall_s": round(time.monotonic() - t0, 3),
                       "log": logs[-1][-300:] if logs else ""}
                rows.append(row)
                print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps({"script": args.script, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
