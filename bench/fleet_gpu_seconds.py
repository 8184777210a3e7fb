"""Does the decision log's `gpu_s` count the GPU-seconds a launch really used? A check by hand.

Runs real launches of examples/train.py on fake topologies (SMARTLAUNCH_FAKE_TOPOLOGY: the
"GPUs" are CPU processes, but every process smartlaunch starts is assigned to its GPU exactly
as on a GPU node), each into one decision log, and watches every process each launch starts
(psutil, every 50 ms). A process is on a GPU when it is a dry run (SMARTLAUNCH_DRYRUN=1, its
CUDA_VISIBLE_DEVICES names the GPU by UUID), an all-reduce rank (comm_worker: LOCAL_RANK-th GPU
of the swept GPUs), a trial rank (SMARTLAUNCH_TRIAL=1: LOCAL_RANK-th of CUDA_VISIBLE_DEVICES) or
a job rank (launch.worker: LOCAL_RANK-th of the GPUs the decision line names). The launch's
GPU-seconds by hand are the integral of how many GPUs have at least one such process alive;
this is compared with the log's `gpu_s` (and its `measure_gpu_s`), and with what the log
counted before the measurements were included (GPUs held x run_s).

    python bench/fleet_gpu_seconds.py --out bench/results/fleet-gpu-seconds-DATE-cpu
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
TRAIN = str(REPO / "examples" / "train.py")
FIXTURES = REPO / "smartlaunch" / "topology" / "fixtures"

# (label, fixture, fresh cache?, smartlaunch options, script args)
LAUNCHES = (
    [("cold medium", "h200-nv18-pair", True, [], ["--steps", "300"])] * 4
    + [("warm medium", "h200-nv18-pair", False, [], ["--steps", "300"])] * 4
    + [("cold large", "h200-nv18-pair", True, [], ["--model", "large", "--steps", "40"])] * 3
    + [("forced ddp", "h200-nv18-pair", False, ["--strategy", "ddp"], ["--steps", "300"])] * 2
    + [("forced single", "h200-nv18-pair", False, ["--strategy", "single"], ["--steps", "300"])] * 2
    + [("cold 4 GPUs", "pcie-4gpu-x8", True, [], ["--steps", "300"])] * 3
    + [("cold 4 GPUs large", "pcie-4gpu-x8", True, [], ["--model", "large", "--steps", "40"])] * 3
    + [("warm 4 GPUs", "pcie-4gpu-x8", False, [], ["--steps", "300"])] * 3
)
GPUS_IN_LINE = re.compile(r"on GPUs? ?([\d,]+)")


def uuids(fixture: str) -> dict[str, int]:
    data = json.loads((FIXTURES / f"{fixture}.json").read_text())
    return {g["uuid"]: g["index"] for g in data["gpus"]}


def gpu_of(env: dict, cmd: str, job_gpus: list[int], by_uuid: dict[str, int]) -> int | None:
    """The GPU a started process runs on, or None for processes on no GPU (the launcher,
    guards, agents)."""
    local = env.get("LOCAL_RANK")
    if env.get("SMARTLAUNCH_DRYRUN") == "1":
        cvd = env.get("CUDA_VISIBLE_DEVICES", "")
        return by_uuid.get(cvd, int(cvd) if cvd.isdigit() else None)
    if local is None or not local.isdigit():
        return None
    local = int(local)
    if "smartlaunch.profile.comm_worker" in cmd:
        return local                    # ranks over the swept GPUs, sorted: 0.. on a fixture
    if env.get("SMARTLAUNCH_TRIAL") == "1" and "smartlaunch.profile.trial" in cmd:
        cvd = [int(x) for x in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.isdigit()]
        return cvd[local] if local < len(cvd) else None
    if "smartlaunch.launch.worker" in cmd and local < len(job_gpus):
        return job_gpus[local]
    return None


def run_one(label, fixture, fresh, opts, args, cache, policy) -> dict:
    env = dict(os.environ, SMARTLAUNCH_FAKE_TOPOLOGY=fixture, SMARTLAUNCH_CACHE_DIR=str(cache))
    by_uuid = uuids(fixture)
    proc = subprocess.Popen(["smartlaunch", "--policy", policy, *opts, TRAIN, *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    job_gpus: list[int] = []

    def read_stderr():
        for line in proc.stderr:
            m = GPUS_IN_LINE.search(line) if "--explain for why" in line else None
            if m:
                job_gpus[:] = [int(x) for x in m.group(1).split(",")]
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assigned: dict[int, int | None] = {}     # pid -> GPU
    busy_s, last = 0.0, time.monotonic()
    while proc.poll() is None:
        in_use = set()
        try:
            kids = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            # A process on no GPU is looked at again each tick: seen between fork and exec it
            # still has its parent's command line, and a job rank may come before the
            # decision line that names its GPUs is read.
            if assigned.get(k.pid) is None:
                try:
                    assigned[k.pid] = gpu_of(k.environ(), " ".join(k.cmdline()), job_gpus,
                                             by_uuid)
                except psutil.Error:
                    continue
            if assigned[k.pid] is not None and k.is_running():
                in_use.add(assigned[k.pid])
        now = time.monotonic()
        busy_s += len(in_use) * (now - last)
        last = now
        time.sleep(0.05)
    reader.join(timeout=10)
    return {"label": label, "fixture": fixture, "exit_code": proc.returncode,
            "by_hand_gpu_s": round(busy_s, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="writes OUT.json and OUT.md")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fleet-gpu-s-"))
    log = work / "decisions.jsonl"
    policy = work / "policy.yaml"
    policy.write_text(f"paths:\n  decision_log: {json.dumps(str(log))}\n")
    unlogged = work / "unlogged.yaml"
    unlogged.write_text("paths:\n  decision_log: /dev/null\n")
    rows = []
    for i, (label, fixture, fresh, opts, args) in enumerate(LAUNCHES):
        cache = work / (f"cache-{i}" if fresh else f"warm-{fixture}")
        if not fresh and not cache.exists():     # one launch, not logged, fills the cache
            subprocess.run(["smartlaunch", "--policy", str(unlogged), TRAIN, *args],
                           env=dict(os.environ, SMARTLAUNCH_FAKE_TOPOLOGY=fixture,
                                    SMARTLAUNCH_CACHE_DIR=str(cache)),
                           capture_output=True, check=True)
        rows.append(run_one(label, fixture, fresh, opts, args, cache, str(policy)))
        print(rows[-1], flush=True)
    recs = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    assert len(recs) == len(rows), (len(recs), len(rows))
    for row, rec in zip(rows, recs):
        held = len(rec["decided"]["gpus"]) * rec["run_s"]
        row.update(decided=f"{rec['decided']['strategy']}×{len(rec['decided']['gpus'])}",
                   log_gpu_s=rec["gpu_s"], log_measure_gpu_s=rec["measure_gpu_s"],
                   held_only_gpu_s=round(held, 2), torchrun_gpu_s=rec["torchrun"]["gpu_s"])
    Path(a.out + ".json").write_text(json.dumps(rows, indent=1) + "\n")
    tot = {k: sum(r[k] for r in rows) for k in ("by_hand_gpu_s", "log_gpu_s",
                                                "log_measure_gpu_s", "held_only_gpu_s")}
    lines = ["| # | launch | decided | by hand | log gpu_s | of it measuring | held only (before) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {i} | {r['label']} ({r['fixture']}) | {r['decided']} | {r['by_hand_gpu_s']:.1f} "
              f"| {r['log_gpu_s']:.1f} | {r['log_measure_gpu_s']:.1f} | {r['held_only_gpu_s']:.1f} |"
              for i, r in enumerate(rows)]
    lines.append(f"| | total | | {tot['by_hand_gpu_s']:.1f} | {tot['log_gpu_s']:.1f} | "
                 f"{tot['log_measure_gpu_s']:.1f} | {tot['held_only_gpu_s']:.1f} |")
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
