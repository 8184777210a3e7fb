"""How long `discover()` takes on this machine (issue #3: <= 0.3 s for an 8-GPU node).

    python bench/topology_bench.py -n 20 [--out FILE.jsonl]      # python -m bench run topology

Runs discover() N times in this process (each call does nvmlInit .. nvmlShutdown, as the
launcher does), prints the median and the GPU count, and with --out appends one JSON line.
The first call is reported separately: it pays for loading libnvidia-ml and, without the
persistence daemon, for waking the driver.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smartlaunch.topology import discover  # noqa: E402

TARGET_S = 0.3


def measure(argv: list[str] | None = None) -> dict:
    """Times discover(), prints the result (and appends it to --out); returns it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="timed calls after the first (default 20)")
    parser.add_argument("--out", help="append a JSON line with the result to this file")
    parser.add_argument("--all", action="store_true", help="ignore CUDA_VISIBLE_DEVICES (whole node)")
    parser.add_argument("--by-call", action="store_true",
                        help="also time each NVML function over one read (where the time goes)")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if args.all:
        for var in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
            env.pop(var, None)

    t0 = time.perf_counter()
    topo = discover(env)
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.n):
        t0 = time.perf_counter()
        topo = discover(env)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times) if times else first
    result = {
        "bench": "topology_discover", "host": platform.node(), "source": topo.source,
        "gpus": len(topo.gpus), "gpu_name": topo.gpus[0].name if topo.gpus else None,
        "links": sorted({link.link_class for link in topo.links}),
        "driver": topo.driver_version, "nccl": topo.nccl_version,
        "first_s": round(first, 4), "median_s": round(median, 4),
        "min_s": round(min(times), 4) if times else None,
        "max_s": round(max(times), 4) if times else None, "n": len(times),
        "target_s": TARGET_S, "fingerprint": topo.fingerprint(), "note": topo.note,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    print(f"discover(): median {median:.4f} s over {len(times)} calls (first {first:.4f} s), "
          f"{len(topo.gpus)} GPU(s), source {topo.source}"
          + (f" — {topo.note}" if topo.note else ""))
    if args.by_call:
        result["by_call_s"] = by_call(env)
        for name, secs in list(result["by_call_s"].items())[:12]:
            print(f"  {secs:8.4f} s  {name}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"wrote {out}")
    return result


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: one measurement of the common format (bench/_record.py)."""
    r = measure(argv)
    figures = {k: r[k] for k in ("gpus", "gpu_name", "first_s", "median_s", "min_s", "max_s",
                                 "target_s", "driver", "nccl")}
    figures["links"] = ",".join(r["links"]) or None
    m = {"conditions": {"source": r["source"], "calls": r["n"], "all": "--all" in argv},
         "figures": figures}
    if r.get("by_call_s"):
        m["detail"] = {"by_call_s": r["by_call_s"]}
    if r.get("note"):
        m["note"] = r["note"]
    return [m]


def main(argv: list[str] | None = None) -> int:
    measure(argv)
    return 0


class _Timed:
    """pynvml with every function call timed (totals per function name)."""

    def __init__(self, mod):
        self._mod, self.totals = mod, {}

    def __getattr__(self, name):
        attr = getattr(self._mod, name)
        if not callable(attr) or not name.startswith("nvml"):
            return attr

        def timed(*a):
            t0 = time.perf_counter()
            try:
                return attr(*a)
            finally:
                self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0
        return timed


def by_call(env) -> dict[str, float]:
    import pynvml
    from smartlaunch.topology.nvml import NvmlBackend, NvmlUnavailable
    timed = _Timed(pynvml)
    try:
        NvmlBackend(nvml=timed).read(env)
    except NvmlUnavailable:
        pass
    return {k: round(v, 5) for k, v in sorted(timed.totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    sys.exit(main())
