#!/usr/bin/env python3
"""Why DDP trials read low against torchrun (issue 26; docs/benchmarks.md, "Four GPUs").

On the 4× H100 the trials' DDP×2/×4 speedups came out 4-14% under torchrun's on three scripts
over host memory. The trial is the script under the dry-run recorder (5 warm-up steps, a window
of >= 20 steps and >= 1 s, rank 0's device time), started by smartlaunch's spawner; torchrun's
reference is the script's own timer (10-20 warm-up steps, ~2.5 s). This runs, one after
another, for each script: the script's own timer under torchrun (x1, xN), then the recorder
(x1: the dry run; xN: the trial's spawner, profile/trial_group.py) with the trial's window and
with the reference's, then the trial as the cold decision runs it (`smartlaunch --explain=json`,
empty cache, a policy whose band sends every DDP candidate to a trial), with the trial set up
beside the dry run and, with `decision.prestart: false`, started after it; and torchrun x1 again
(the reference's drift). It prints the speedup each way of measuring gives.

    python bench/trial_bias.py --scripts cnn-small-b128,gpt-124m-b8 --nproc 2 \\
        --condition host --out $OUT/trial-bias.json
    python bench/trial_bias.py --scripts cnn-small-b128 --condition nvlink --extra=--tiny \\
        --out /tmp/tb.json                                     # CPU smoke (gloo, fake topology)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

import common
from common import REPO

from smartlaunch.profile.dryrun import MAX_STEPS
# (warm-up, measured steps, least window seconds): the trial's and the reference's
WINDOWS = {"trial": (5, 20, 1.0), "reference": (20, 100, 2.5)}


def run(argv: list[str], env: dict, timeout: float = 120.0) -> tuple[int, str, float]:
    """One child in its own session, its whole process group ended at the timeout."""
    r = common.run(argv, env, timeout)
    return r["rc"], r["stdout"] + r["stderr"], r["wall_s"]


def recorder(script: list[str], n: int, window: str, env: dict, tmp: Path,
             step_s: float | None = None) -> dict:
    """The dry-run recorder on n ranks: n == 1 is the dry run, n > 1 the trial's spawner.
    A trial's ranks get a step count, as the product gives them (profile/trial.trial_steps,
    from the one-GPU step_s): a window closed by each rank's own clock (--min-seconds) can
    end one rank a step before the other, which then waits in NCCL for ever."""
    warm, measure, least = WINDOWS[window]
    out = tmp / f"rec-{n}-{window}"
    out.mkdir(parents=True, exist_ok=True)
    if n == 1:
        opts = ["--warmup", str(warm), "--measure", str(measure), "--min-seconds", str(least)]
    else:
        if step_s:
            measure = max(measure, min(MAX_STEPS, math.ceil(least / step_s)))
        opts = ["--warmup", str(warm), "--measure", str(measure)]
    if n == 1:
        argv = [sys.executable, "-m", "smartlaunch.profile.dryrun", "--out",
                str(out / "rank0.json"), *opts, *script]
    else:
        argv = [sys.executable, "-m", "smartlaunch.profile.trial_group", "--nproc", str(n), "--",
                "--out-dir", str(out), *opts, *script]
    rc, text, wall = run(argv, env)
    try:
        r = json.loads((out / "rank0.json").read_text())
    except (OSError, ValueError):
        return {"rc": rc, "wall_s": wall, "error": text[-600:]}
    step, batch = r.get("step_time_s"), r.get("batch_size") or 1
    return {"rc": rc, "wall_s": wall, "samples_per_s": n * batch / step if step else None,
            "steps_measured": r.get("steps_measured"), "step_ms": step * 1e3 if step else None}


def own_timer(script_id: str, n: int, env: dict, extra: list[str]) -> dict:
    e = common.entry(script_id)
    warm, steps, _ = WINDOWS["reference"]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(n), e.script, *e.args, "--warmup", str(warm), "--steps", str(steps), *extra]
    rc, text, wall = run(argv, env)
    tp = common.parse_throughput(text)
    return {"rc": rc, "wall_s": wall, **(tp or {"error": text[-600:]})}


# Every DDP candidate inside the band (a trial each), the throughput floor.
COLD_POLICY = "decision:\n  min_efficiency: 0.5\n  uncertainty_band: 2.0\n"


def cold(script: list[str], n: int, env: dict, tmp: Path, prestart: bool) -> dict:
    """The cold decision's own trial of DDP×n, its speedup over the dry run's one-GPU rate."""
    home = tmp / f"cold-{n}-{'early' if prestart else 'late'}"
    home.mkdir(parents=True, exist_ok=True)
    policy = home / "policy.yaml"
    policy.write_text(COLD_POLICY + ("" if prestart else "  prestart: false\n"))
    env = {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
           "SMARTLAUNCH_LEASE_DIR": str(home / "leases")}
    argv = [*common.SMARTLAUNCH, "--policy", str(policy), "--explain=json",
            "--nproc-per-node", str(n), *script]
    rc, text, wall = run(argv, env, timeout=300.0)
    plan = common.parse_plan(text)
    if plan is None:
        return {"rc": rc, "wall_s": wall, "error": text[-600:]}
    prof = plan.get("profile") or {}
    cand = next((c for c in plan.get("candidates") or () if c.get("strategy") == "ddp"
                 and len(c.get("gpus") or ()) == n), {})
    batch, step = prof.get("batch_size") or 1, prof.get("step_time_s")
    return {"rc": rc, "wall_s": wall, "speedup": cand.get("speedup"),
            "measured": cand.get("measured"), "dry_run_sps": batch / step if step else None,
            "reasons": [r.get("text", "") for r in plan.get("reasons") or ()][:4]}


WAYS = ("torchrun", "trial", "reference", "cold-early", "cold-late")


def measurement(row: dict) -> dict:
    """One script's row as a measurement of the common format (bench/_record.py): the DDP×N
    speedup each way, the standard deviation of their logs (what TRIAL_SPREAD pools), and the
    rates behind them."""
    n = str(row["nproc"])
    figures = {f"speedup_{w.replace('-', '_')}": (row.get(w) or {}).get("speedup") for w in WAYS}
    logs = [math.log(v) for v in figures.values() if v and v > 0]
    figures["sd_ln"] = statistics.stdev(logs) if len(logs) > 1 else None
    for w in ("torchrun", "trial", "reference"):
        for k in ("1", n):
            figures[f"sps{'1' if k == '1' else 'N'}_{w}"] = \
                ((row.get(w) or {}).get(k) or {}).get("samples_per_s")
    figures["sps1_torchrun_again"] = ((row.get("torchrun") or {}).get("1-again") or {}).get(
        "samples_per_s")
    for w in ("cold-early", "cold-late"):
        figures[f"dry_run_sps_{w[5:]}"] = (row.get(w) or {}).get("dry_run_sps")
        figures[f"wall_s_{w[5:]}"] = (row.get(w) or {}).get("wall_s")
    m = {"conditions": {"script": row["script"], "condition": row["condition"],
                        "nproc": row["nproc"]}, "figures": figures}
    errors = [f"{w}: {(row.get(w) or {}).get('error', '').strip().splitlines()[-1:]}"
              for w in ("cold-early", "cold-late") if (row.get(w) or {}).get("error")]
    if errors or figures["sd_ln"] is None:
        m["error"] = "; ".join(errors) or "fewer than two ways measured a speedup"
    return m


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: main(argv), then one measurement per script."""
    argv = list(argv)
    if "--out" not in argv:
        argv += ["--out", tempfile.mkstemp(prefix="trial-bias-", suffix=".json")[1]]
    main(argv)
    return [measurement(r) for r in json.loads(Path(argv[argv.index("--out") + 1]).read_text())]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", default="cnn-small-b128,gpt-124m-b8")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--condition", default="host", choices=sorted(common.CONDITIONS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra", default="", help="more script arguments (CPU: --tiny)")
    args = ap.parse_args(argv)
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    rows = []
    with tempfile.TemporaryDirectory(prefix="trial-bias-") as tmp:
        for sid in args.scripts.split(","):
            e = common.entry(sid)
            extra = args.extra.split()
            script = [e.script, *e.args, "--steps", "100000", *extra]
            one, many = common.child_env(base, None), common.child_env(base, args.condition)
            row = {"script": sid, "condition": args.condition, "nproc": args.nproc,
                   "torchrun": {"1": own_timer(sid, 1, one, extra),
                                str(args.nproc): own_timer(sid, args.nproc, many, extra)}}
            rows.append(row)
            for window in WINDOWS:
                row[window] = {"1": recorder(script, 1, window, one, Path(tmp) / sid)}
                save(args.out, rows)
                step = (row[window]["1"].get("step_ms") or 0) / 1e3 or None
                row[window][str(args.nproc)] = recorder(script, args.nproc, window, many,
                                                        Path(tmp) / sid, step)
                save(args.out, rows)
            for prestart in (True, False):
                row["cold-" + ("early" if prestart else "late")] = cold(
                    script, args.nproc, many, Path(tmp) / sid, prestart)
                save(args.out, rows)
            row["torchrun"]["1-again"] = own_timer(sid, 1, one, extra)
            for way in ("torchrun", *WINDOWS):
                a, b = row[way]["1"].get("samples_per_s"), \
                    row[way][str(args.nproc)].get("samples_per_s")
                row[way]["speedup"] = b / a if a and b else None
            ways = ("torchrun", *WINDOWS, "cold-early", "cold-late")
            print(sid, {w: row[w].get("speedup") for w in ways}, flush=True)
            save(args.out, rows)
    return 0


def save(path: str, rows: list) -> None:
    Path(path).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
