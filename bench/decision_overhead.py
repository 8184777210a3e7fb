"""How much a warm-cache smartlaunch decision adds on top of what any torch launcher pays.

Alternates `smartlaunch --explain=json` (after one cold call fills the profile, all-reduce and
trial caches) with `python -c "import torch, torch.distributed.run"` (torchrun's own start-up
floor), N rounds, and reports the medians and their difference. Runs anywhere: on a CPU
machine pass --fake h200-nv18-pair to decide against a fixture topology.

    python bench/decision_overhead.py --rounds 7 [--fake h200-nv18-pair] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report_md import emit

REPO = Path(__file__).resolve().parent.parent


def timed(argv, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(argv=None) -> dict:
    """Runs the rounds, prints (and with --out writes) the report; the measurement of the
    common format (bench/_record.py)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fake", help="topology fixture name (CPU machines)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    home = tempfile.mkdtemp(prefix="sl-decision-")
    env = {**os.environ, "HOME": home, "XDG_CACHE_HOME": f"{home}/cache",
           "SMARTLAUNCH_LEASE_DIR": f"{home}/leases", "PYTHONPATH": str(REPO)}
    if args.fake:
        env["SMARTLAUNCH_FAKE_TOPOLOGY"] = args.fake
    sl = [sys.executable, "-m", "smartlaunch.cli", "--explain=json", "--nproc-per-node", "2",
          str(REPO / "examples" / "train.py"), "--steps", "100000"]
    base = [sys.executable, "-c", "import torch, torch.distributed.run"]
    cold = timed(sl, env)
    warm, floor = [], []
    for _ in range(args.rounds):
        warm.append(timed(sl, env))
        floor.append(timed(base, env))
    w, f = statistics.median(warm), statistics.median(floor)
    lines = [f"# Warm-cache decision overhead ({'fake ' + args.fake if args.fake else 'real GPUs'})",
             "", f"{time.strftime('%Y-%m-%d')}, {args.rounds} alternating rounds, medians.", "",
             "| what | seconds |", "|---|---|",
             f"| cold `smartlaunch --explain` (dry run, all-reduce, trials) | {cold:.2f} |",
             f"| warm `smartlaunch --explain` | {w:.2f} |",
             f"| `python -c 'import torch, torch.distributed.run'` | {f:.2f} |",
             f"| **decision overhead (warm − floor)** | **{w - f:.2f}** |"]
    emit(lines, args.out)
    return {"conditions": {"topology": args.fake or "real", "rounds": args.rounds},
            "figures": {"cold_s": cold, "warm_s": w, "import_floor_s": f, "overhead_s": w - f}}


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: the rounds, the report printed, one measurement."""
    return [measure(argv)]


def main(argv=None) -> int:
    measure(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
