"""What dry-run isolation costs (issue 14): the probe, the sandbox wrapper's start, and the
dry run's wall time with `dryrun.isolation` require vs off (same script, alternated).

    python bench/isolation_bench.py [--rounds 3] [--out REPORT.md]   # python -m bench run isolation

Ratios from one run each; the machine's load average is printed beside them.
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

from smartlaunch import sandbox
from smartlaunch.policy.api import DryRunPolicy, Policy
from smartlaunch.profile.runner import run_dry_run
from smartlaunch.request import Request

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "tiny_train.py"


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(argv=None) -> dict:
    """Runs it, prints (and with --out writes) the report; the measurement of the common
    format (bench/_record.py)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    probe = [timed(sandbox.probe) for _ in range(10)]
    plain, wrapped = [], []
    for _ in range(5):
        with tempfile.TemporaryDirectory() as tmp:
            plain.append(timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)))
            wrapped.append(timed(lambda: subprocess.run(
                # the status file must be new: the sandbox creates it (O_EXCL), never reuses one
                sandbox.wrap([sys.executable, "-c", "pass"], os.path.join(tmp, "s"), [],
                             os.path.join(tmp, "status.json")),
                check=True)))
    runs = {"off": [], "require": []}
    req = Request(script=str(SCRIPT), script_args=("--batch-size", "8"))
    for _ in range(args.rounds):
        for mode in runs:
            pol = Policy(dryrun=DryRunPolicy(warmup_steps=1, measure_steps=20, isolation=mode))
            runs[mode].append(run_dry_run(req, pol, gpu=None, environ=dict(os.environ)).dry_run_s)
    med = {k: statistics.median(v) for k, v in runs.items()}
    load = os.getloadavg()[0]
    overlays = len(sandbox.overlay_targets())
    lines = [
        f"# Dry-run isolation cost ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, "
        f"load average {load:.1f}, uid {os.getuid()})",
        "",
        f"- probe (fork, unshare, {overlays} overlays): median "
        f"{statistics.median(probe) * 1e3:.0f} ms over 10",
        f"- `python -c pass`: median {statistics.median(plain) * 1e3:.0f} ms; through the sandbox "
        f"wrapper: {statistics.median(wrapped) * 1e3:.0f} ms (5 each)",
        f"- tiny_train.py dry run, median of {args.rounds}: off {med['off']:.2f} s, require "
        f"{med['require']:.2f} s, ratio {med['require'] / med['off']:.2f}",
    ]
    emit(lines, args.out)
    return {"conditions": {"rounds": args.rounds, "overlays": overlays, "uid": os.getuid()},
            "figures": {"probe_ms": statistics.median(probe) * 1e3,
                        "python_pass_ms": statistics.median(plain) * 1e3,
                        "wrapped_pass_ms": statistics.median(wrapped) * 1e3,
                        "dry_run_off_s": med["off"], "dry_run_require_s": med["require"],
                        "ratio": med["require"] / med["off"], "load_average": load}}


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: one measurement."""
    return [measure(argv)]


def main(argv=None) -> int:
    measure(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
