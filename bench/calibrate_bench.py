"""How long `smartlaunch-node calibrate` takes and how steady its constants (κ, per-step
overhead, per gradient tensor) are, and what the status line's per-step counter costs the dry
run.

Runs the command N times (each a fresh measurement: the node record is overwritten, the
all-reduce curve is cached after the first), reports wall time against the 30 s goal as a
ratio, and the spread of κ and the per-step overhead across runs; then times TickWriter.set,
the one store a dry-run step pays for "dry run step k of n". Runs anywhere: on a CPU machine
pass --fake h200-nv18-pair (gloo ranks; the figures then describe gloo on that CPU, not a GPU).

    python bench/calibrate_bench.py --runs 5 [--fake h200-nv18-pair] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from report_md import emit

REPO = Path(__file__).resolve().parent.parent
GOAL_S = 30.0


def measure(argv=None) -> dict:
    """Runs it, prints (and with --out writes) the report; the measurement of the common
    format (bench/_record.py)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--fake", help="topology fixture name (CPU machines)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    home = tempfile.mkdtemp(prefix="sl-calibrate-")
    env = {**os.environ, "HOME": home, "XDG_CACHE_HOME": f"{home}/cache",
           "PYTHONPATH": str(REPO)}
    if args.fake:
        env["SMARTLAUNCH_FAKE_TOPOLOGY"] = args.fake
    walls, records, failures = [], [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "smartlaunch.node_cli", "calibrate", "--json"],
                           env=env, capture_output=True, text=True, cwd=home)
        walls.append(time.perf_counter() - t0)
        if r.returncode:
            failures.append(r.stderr.strip().splitlines()[-1:] or [f"exit {r.returncode}"])
            continue
        records.append(json.loads(r.stdout))

    sys.path.insert(0, str(REPO))
    import socket
    from smartlaunch.profile.control import Control
    mine, theirs = socket.socketpair()
    w = Control(theirs.detach())
    n = 200_000
    tick_s = min(timeit.repeat(lambda: w.step(7, 26), number=n, repeat=5)) / n
    mine.close()

    kappa = [r["constants"]["contention_s_per_byte"] * 1e12 for r in records]
    ovh = [r["constants"]["ddp_overhead_s"] * 1e3 for r in records]
    # the per-tensor median as measured (before a value within its spread is kept as 0)
    per = [r["measured_median"]["per_tensor_s"] * 1e6 for r in records]
    per_sd = [r["spread"]["per_tensor_s"] * 1e6 for r in records]
    med = statistics.median(walls)
    lines = [f"# smartlaunch-node calibrate ({args.fake or 'this node'}), "
             f"{time.strftime('%Y-%m-%d')}", "",
             f"- runs: {args.runs}, failed: {len(failures)}"
             + (f" ({'; '.join(f[0] for f in failures)})" if failures else ""),
             f"- wall time per run (s): {', '.join(f'{x:.1f}' for x in walls)}; median "
             f"{med:.1f} s = {med / GOAL_S:.2f} of the {GOAL_S:.0f} s goal",
             f"- in-command measurement (s): "
             f"{', '.join(str(r['elapsed_s']) for r in records)}"]
    if records:
        sd = [r["spread"]["contention_s_per_byte"] * 1e12 for r in records]
        lines += [f"- κ per run (ms/GB): {', '.join(f'{x:.0f}' for x in kappa)}; median "
                  f"{statistics.median(kappa):.0f}, within-run sd "
                  f"{', '.join(f'{x:.0f}' for x in sd)}",
                  f"- DDP overhead per run (ms/step): {', '.join(f'{x:.2f}' for x in ovh)}; "
                  f"median {statistics.median(ovh):.2f}",
                  f"- per gradient tensor per run (µs, measured median): "
                  f"{', '.join(f'{x:.1f}' for x in per)}; median {statistics.median(per):.1f}, "
                  f"within-run sd {', '.join(f'{x:.1f}' for x in per_sd)}"
                  f"; kept as 0 (below 0, or within its sd of 0) in "
                  f"{sum('per_tensor_s' in r['clamped_to_zero'] + r['within_noise'] for r in records)}"
                  f" of {len(records)} runs"]
    lines += [f"- Control.step (the dry run's per-step progress, a message at most every "
              f"0.1 s): {tick_s * 1e9:.0f} ns per step, best of 5 x {n:,}"]
    emit(lines, args.out)
    m = {"conditions": {"topology": args.fake or "real", "runs": args.runs},
         "figures": {"failed": len(failures), "wall_median_s": med, "goal_s": GOAL_S,
                     "control_step_ns": tick_s * 1e9},
         "detail": {"wall_s": walls, "kappa_ms_per_GB": kappa, "overhead_ms": ovh,
                    "per_tensor_us": per}}
    if records:
        m["figures"].update(kappa_median_ms_per_GB=statistics.median(kappa),
                            overhead_median_ms=statistics.median(ovh),
                            per_tensor_median_us=statistics.median(per))
    return m


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: one measurement."""
    return [measure(argv)]


def main(argv=None) -> int:
    measure(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
