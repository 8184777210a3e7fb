"""Is the all-reduce curve measured beside a dry run the curve an idle node measures? (issue 15,
item 7: profile/comm.Sweep measures it while the dry run's script sets itself up, and
caches it for every later decision on the node.)

Each round, with fresh caches: a cold decision (`smartlaunch --explain=json`, trials off, warm
pools on) of a suite script, whose early sweep's curve is read back from the decision's cache;
then, right after, `smartlaunch-node bench-comm --no-pairs --json` over the same GPUs on the
idle node. Per size: bus bandwidth of each, per round, and early/alone (median of the rounds'
ratios). Checks itself: exit 1 when a round had no early sweep, a curve is missing or their
sizes differ (reasons printed). On a CPU box: `--fake h200-nv18-pair --cores 16` (gloo ranks;
pools start only with spare cores, so the decision's process is told it has 16).

    python bench/diag/early_comm.py --script embbag-b4096 --rounds 3 --out FILE.md \\
        [--fake h200-nv18-pair --cores 16]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
POLICY = "decision:\n  trials: false\n"
# A CPU box has too few cores for the warm pools; the self-check says it has more.
FAKE_CORES = ("import os, sys; n = int(sys.argv.pop(1)); "
              "os.sched_getaffinity = lambda pid: set(range(n)); "
              "from smartlaunch.cli import main; sys.exit(main(sys.argv[1:]))")


def fresh_env(base: dict[str, str]) -> tuple[str, dict[str, str]]:
    home = tempfile.mkdtemp(prefix="sl-early-")
    env = dict(base, HOME=home, SMARTLAUNCH_CACHE_DIR=f"{home}/cache",
               SMARTLAUNCH_LEASE_DIR=f"{home}/leases", SMARTLAUNCH_LOG_DIR=f"{home}/runs")
    return home, env


def early(entry, base, cores: int | None, timeout: float) -> dict:
    home, env = fresh_env(base)
    policy = Path(home, "policy.yaml")
    policy.write_text(POLICY)
    cli = [sys.executable, "-c", FAKE_CORES, str(cores)] if cores else \
        [sys.executable, "-m", "smartlaunch.cli"]
    argv = [*cli, "--explain=json", "--policy", str(policy), str(REPO / entry.script),
            *entry.args, "--steps", str(entry.steps), "--warmup", str(entry.warmup)]
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=home)
    out: dict = {"wall_s": time.perf_counter() - t0, "rc": r.returncode}
    try:
        plan = json.loads(r.stdout)
    except ValueError:
        out["error"] = r.stderr[-600:]
        return out
    files = glob.glob(f"{home}/cache/comm/*.json")
    curves = [json.loads(Path(f).read_text())["curve"] for f in files]
    shutil.rmtree(home, ignore_errors=True)
    t = plan.get("timings") or {}
    out.update(timings=t, profile=plan.get("profile") or {}, comm=plan.get("comm") or {},
               curve=curves[0] if len(curves) == 1 else None, n_curves=len(curves))
    return out


def alone(gpus: str, base, timeout: float) -> dict:
    home, env = fresh_env(base)
    argv = [sys.executable, "-m", "smartlaunch.node_cli", "bench-comm", "--gpus", gpus,
            "--no-pairs", "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=home)
    shutil.rmtree(home, ignore_errors=True)
    out: dict = {"wall_s": time.perf_counter() - t0, "rc": r.returncode}
    try:
        out["curve"] = json.loads(r.stdout)[0]
    except (ValueError, IndexError):
        out["error"] = r.stderr[-600:]
    return out


def busbw(curve: dict) -> dict[int, float]:
    """GB/s per measured size (nccl-tests' busbw: algbw * 2(n-1)/n)."""
    n = curve["world_size"]
    return {int(s): s / t * 2 * (n - 1) / n / 1e9 for s, t in curve["points"]}


def problems(e: dict, a: dict) -> list[str]:
    out = []
    if "error" in e or e.get("rc"):
        out.append(f"the decision failed (rc {e.get('rc')}): {e.get('error', '')[-300:]}")
    elif "allreduce_early" not in e["timings"]:
        out.append("the decision ran no early sweep (warm pools off, or too few cores)")
    elif e["curve"] is None:
        out.append(f"the decision's cache holds {e['n_curves']} curves, not 1")
    elif e["comm"].get("cached"):
        out.append("the decision's curve was read from a cache, not measured")
    elif e["profile"].get("gate_wait_s") is None and not e["profile"].get("cached"):
        out.append("the dry run had no gate")
    if "error" in a or a.get("rc"):
        out.append(f"bench-comm failed (rc {a.get('rc')}): {a.get('error', '')[-300:]}")
    if not out and sorted(busbw(e["curve"])) != sorted(busbw(a["curve"])):
        out.append("the early and the idle curves measured different sizes")
    return out


def size_name(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def report(rounds: list[tuple[dict, dict]], args) -> list[str]:
    lines = [f"# All-reduce curve beside a dry run vs alone ({time.strftime('%Y-%m-%d')}, "
             f"{args.fake or 'real topology'}, {args.condition})", "",
             f"Script {args.script}; {len(rounds)} rounds, each a cold decision (trials off; its "
             "early sweep beside the dry run) then `smartlaunch-node bench-comm` right after.", "",
             "| round | decision s | dry run s | gate wait s | early sweep s | all-reduce wait s "
             "| script start-up s | step ms | bench-comm s |", "|---|---|---|---|---|---|---|---|---|"]
    for i, (e, a) in enumerate(rounds, 1):
        t, p = e.get("timings") or {}, e.get("profile") or {}
        step = p.get("step_time_s")
        lines.append(f"| {i} | {e['wall_s']:.1f} | {t.get('profile', 0):.1f} | "
                     f"{p.get('gate_wait_s') or 0:.2f} | {t.get('allreduce_early', 0):.2f} | "
                     f"{t.get('allreduce', 0):.2f} | {p.get('startup_s') or 0:.1f} | "
                     f"{step * 1e3 if step else 0:.2f} | {a['wall_s']:.1f} |")
    good = [(busbw(e["curve"]), busbw(a["curve"])) for e, a in rounds if not problems(e, a)]
    if not good:
        return lines
    lines += ["", "Bus bandwidth, GB/s (each round's early / alone):", "",
              "| size | early (each round) | alone (each round) | early/alone, median | min–max |",
              "|---|---|---|---|---|"]
    for size in sorted(good[0][0]):
        ratios = [e[size] / a[size] for e, a in good]
        lines.append(f"| {size_name(size)} | {', '.join(f'{e[size]:.2f}' for e, _ in good)} | "
                     f"{', '.join(f'{a[size]:.2f}' for _, a in good)} | "
                     f"{statistics.median(ratios):.3f} | {min(ratios):.3f}–{max(ratios):.3f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", default="embbag-b4096")
    ap.add_argument("--condition", default="nvlink", choices=sorted(common.CONDITIONS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpus", default="0,1")
    ap.add_argument("--fake", help="topology fixture name (CPU self-check)")
    ap.add_argument("--cores", type=int, help="cores the decision's process is told it has")
    ap.add_argument("--timeout", type=float, default=110)
    ap.add_argument("--budget", type=float, default=220, help="no new round after this many s")
    ap.add_argument("--out")
    ap.add_argument("--json")
    args = ap.parse_args()
    base = common.child_env(dict(os.environ, PYTHONPATH=str(REPO)), args.condition)
    if args.fake:
        base["SMARTLAUNCH_FAKE_TOPOLOGY"] = args.fake
    entry = common.entry(args.script)
    if args.fake:   # a CPU box: a toy model, a few steps
        entry = type(entry)(entry.id, entry.script, (*entry.args, "--tiny"), 2, 10)
    t0, rounds, bad = time.perf_counter(), [], []
    for i in range(args.rounds):
        if i and time.perf_counter() - t0 > args.budget:
            bad.append(f"only {i} rounds within the {args.budget:g} s budget")
            break
        e = early(entry, base, args.cores, args.timeout)
        a = alone(args.gpus, base, args.timeout)
        rounds.append((e, a))
        bad += [f"round {i + 1}: {p}" for p in problems(e, a)]
        lines = report(rounds, args)
        print(f"round {i + 1}: decision {e['wall_s']:.1f} s, bench-comm {a['wall_s']:.1f} s"
              + "".join(f"; {p}" for p in problems(e, a)), flush=True)
        if args.out:
            Path(args.out).write_text("\n".join(lines + [""] + [f"- {b}" for b in bad]) + "\n")
        if args.json:
            Path(args.json).write_text(json.dumps(rounds, indent=1, default=str))
    print("\n".join(report(rounds, args)))
    for b in bad:
        print(f"early_comm: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
