"""Many launchers queueing for few GPUs (issue 13): how long after its job ends does each
launcher exit, and how much do the waiters write?

    python bench/wait_bench.py [--launchers 20] [--job-s 0.5] [--src DIR] [--label NAME]
                               [--out FILE.json]   # python -m bench run wait

N concurrent `smartlaunch --strategy single job.py` on the fake 2-GPU topology
(SMARTLAUNCH_FAKE_TOPOLOGY=h200-nv18-pair), all started at once, one private lease dir. The
job sleeps --job-s, then writes time.time() to its own file as its last act; a thread per
launcher records the launcher's exit time. exit latency = launcher exit - job end. `--src`
runs another checkout (e.g. the code before a change: `git archive <rev> | tar -x -C DIR`).
Also reported: stderr lines per launcher, the most any one wrote, and wall time of the batch.
Run it on an otherwise quiet machine; the CPU count is recorded with the result.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB = """import sys, time
time.sleep(float(sys.argv[2]))
with open(sys.argv[1], "w") as f:
    f.write(repr(time.time()))
"""


def run_batch(n: int, job_s: float, src: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="wait-bench-") as tmp:
        tmp = Path(tmp)
        job = tmp / "job.py"
        job.write_text(JOB)
        env = dict(os.environ, SMARTLAUNCH_FAKE_TOPOLOGY=str(
            src / "smartlaunch/topology/fixtures/h200-nv18-pair.json"),
            SMARTLAUNCH_LEASE_DIR=str(tmp / "leases"), HOME=str(tmp),
            PYTHONPATH=str(src), SMARTLAUNCH_CACHE_DIR=str(tmp / "cache"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        exits: dict[int, float] = {}
        procs = []
        t0 = time.time()
        for i in range(n):
            p = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", "--strategy", "single",
                                  str(job), str(tmp / f"end{i}"), str(job_s)], cwd=tmp, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            procs.append(p)
        errs: dict[int, str] = {}

        def wait(i: int, p: subprocess.Popen) -> None:
            errs[i] = p.stderr.read()
            p.wait()
            exits[i] = time.time()
        threads = [threading.Thread(target=wait, args=(i, p)) for i, p in enumerate(procs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        lat, codes = [], [p.returncode for p in procs]
        for i in range(n):
            end = tmp / f"end{i}"
            if end.exists():
                lat.append(exits[i] - float(end.read_text()))
        lines = [len(errs[i].splitlines()) for i in range(n)]
    return {"launchers": n, "job_s": job_s, "exit_codes": sorted(set(codes)),
            "jobs_ran": len(lat), "wall_s": round(wall, 2),
            "exit_latency_s": {"median": round(statistics.median(lat), 3),
                               "min": round(min(lat), 3), "max": round(max(lat), 3),
                               "all": [round(x, 3) for x in sorted(lat)]},
            "stderr_lines": {"total": sum(lines), "max_per_launcher": max(lines)},
            "sample_stderr": errs[max(range(n), key=lambda i: lines[i])][-1500:]}


def measurement(r: dict) -> dict:
    """One batch's result as a measurement of the common format (bench/_record.py)."""
    lat = r["exit_latency_s"]
    return {"conditions": {"launchers": r["launchers"], "job_s": r["job_s"],
                           "label": r.get("label")},
            "figures": {"jobs_ran": r["jobs_ran"], "wall_s": r["wall_s"],
                        "exit_latency_median_s": lat["median"], "exit_latency_min_s": lat["min"],
                        "exit_latency_max_s": lat["max"],
                        "stderr_lines": r["stderr_lines"]["total"],
                        "stderr_lines_max": r["stderr_lines"]["max_per_launcher"],
                        "exit_codes": ",".join(map(str, r["exit_codes"])),
                        "loadavg_before": r.get("loadavg_before")},
            "detail": {"exit_latency_s": lat["all"]},
            "date": str(r.get("date", ""))[:10] or None}


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: one batch, one measurement."""
    return [measurement(measure(argv))]


def main() -> None:
    measure()


def measure(argv: list[str] | None = None) -> dict:
    """Runs one batch, prints its result (and adds it to --out's list); returns it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--launchers", type=int, default=20)
    ap.add_argument("--job-s", type=float, default=0.5)
    ap.add_argument("--src", type=Path, default=REPO)
    ap.add_argument("--label", default="this checkout")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    r = run_batch(args.launchers, args.job_s, args.src.resolve())
    r.update(label=args.label, cpus=os.cpu_count(),
             loadavg_before=os.getloadavg()[0],
             date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    print(json.dumps(r, indent=1))
    if args.out:
        rows = json.loads(args.out.read_text()) if args.out.exists() else []
        rows.append(r)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return r


if __name__ == "__main__":
    main()
