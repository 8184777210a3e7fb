"""Helpers for the lease and independent-job tests: fake topologies, plans, and small
scripts that record what they saw (GPU, environment, start/end times) into files."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

from smartlaunch.decide.plan import Plan, Strategy
from smartlaunch.profile.api import ModelProfile, ProfileStatus
from smartlaunch.policy.api import JobsPolicy, LaunchPolicy, Policy
from smartlaunch.request import Request
from smartlaunch.topology.api import GPU, GPUProcess, Topology

REPO = Path(__file__).resolve().parent.parent


def fake_topology(n: int = 2, *, busy: tuple[int, ...] = (), free_mib: int = 80000,
                  numa: bool = False) -> Topology:
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    gpus = tuple(
        GPU(index=i, nvml_index=i, uuid=f"GPU-fake-{i:04d}-aaaa", name="Fake H200",
            pci_bus_id=f"00000000:{i + 1:02X}:00.0", memory_total_mib=81920,
            memory_free_mib=free_mib, memory_used_mib=81920 - free_mib,
            processes=(GPUProcess(pid=4242, user="mallory", used_mib=1000),) if i in busy else (),
            numa_node=0 if numa else -1, cpus=cpus[:1] if numa else ())
        for i in range(n))
    return Topology(gpus=gpus, links=(), hostname="fakehost", source="fake:helpers_jobs")


def write_topology(path: Path, topo: Topology) -> str:
    path.write_text(json.dumps(topo.to_dict()))
    return str(path)


def policy(tmp_path: Path, **jobs) -> Policy:
    return Policy(launch=LaunchPolicy(log_dir=str(tmp_path / "logs"), signal_grace_s=2.0),
                  jobs=JobsPolicy(**jobs))


def plan(variants, *, gpus=(0, 1), device: str = "cuda", nproc: int = 1, profile=None,
         jobs_per_gpu: int = 1, wait: bool = True) -> Plan:
    return Plan(strategy=Strategy.INDEPENDENT, device=device, gpus=tuple(gpus), nproc_per_node=nproc,
                requested_max=len(gpus), variants=tuple(tuple(v) for v in variants),
                profile=ModelProfile(ProfileStatus.OK, **profile) if profile else None,
                jobs_per_gpu={g: jobs_per_gpu for g in gpus}, wait_for_lease=wait)


def request(script: str, *args: str, no_wait: bool = False) -> Request:
    return Request(strategy="independent", script=script, script_args=tuple(args), no_wait=no_wait)


# A job: records its environment and wall times to <out>/job-<JOB_INDEX>.json, prints a
# throughput line like the benchmark scripts, sleeps, exits with --exit.
JOB_SCRIPT = textwrap.dedent("""
    import argparse, json, os, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sleep", type=float, default=0.3)
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--rate", type=float, default=100.0)
    a = p.parse_args()
    start = time.time()
    started = os.path.join(a.out, f"started-{os.environ['SMARTLAUNCH_JOB_INDEX']}")
    open(started + ".tmp", "w").write(str(os.getpid()))
    os.replace(started + ".tmp", started)     # whole when it appears (tests read the pid)
    keys = ("CUDA_VISIBLE_DEVICES", "SMARTLAUNCH_JOB_INDEX", "SMARTLAUNCH_NUM_JOBS", "RANK",
            "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")
    rec = {k: os.environ.get(k) for k in keys}
    rec["pid"] = os.getpid()
    rec["affinity"] = sorted(os.sched_getaffinity(0))
    print(f"throughput: samples/s={a.rate} per_rank={a.rate} world=1 step_ms=1.0", flush=True)
    print("some stderr", file=sys.stderr, flush=True)
    time.sleep(a.sleep)
    rec.update(start=start, end=time.time(), argv=sys.argv[1:])
    with open(os.path.join(a.out, f"job-{os.environ['SMARTLAUNCH_JOB_INDEX']}.json"), "w") as f:
        json.dump(rec, f)
    sys.exit(a.exit)
""")

# A launcher stand-in: leases 1 of the topology's GPUs (waiting), records GPU and times, releases.
LEASE_CLIENT = textwrap.dedent("""
    import json, os, sys, time
    from smartlaunch.launch.leases import LeaseManager
    from smartlaunch.topology.api import Topology
    topo_path, out, hold_s, ident = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    topo = Topology.from_dict(json.load(open(topo_path)))
    mgr = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"])
    with mgr.acquire(topo, [g.index for g in topo.gpus], 1, wait=True, timeout_s=60) as lease:
        start = time.time()
        time.sleep(hold_s)
        end = time.time()
        gpu = lease.gpus[0]
    with open(os.path.join(out, f"{ident}.json"), "w") as f:
        json.dump({"gpu": gpu, "start": start, "end": end}, f)
""")

# Holds a lease on the given GPUs until killed; touches <ready> once it holds them.
LEASE_HOLDER = textwrap.dedent("""
    import json, os, sys, time
    from smartlaunch.launch.leases import LeaseManager
    from smartlaunch.topology.api import Topology
    topo_path, ready, gpus = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
    topo = Topology.from_dict(json.load(open(topo_path)))
    lease = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]).acquire(topo, gpus, len(gpus), wait=False, timeout_s=0)
    open(ready, "w").write(",".join(map(str, lease.gpus)))
    time.sleep(300)
""")


def write_script(dir_: Path, name: str, text: str) -> str:
    p = dir_ / name
    p.write_text(text)
    return str(p)


def python_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def wait_for(path: Path, timeout_s: float = 20.0) -> None:
    import time
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.02)


def overlapping(intervals: list[tuple[float, float]]) -> list[tuple]:
    """Pairs of (start, end) intervals that overlap in time."""
    s = sorted(intervals)
    return [(a, b) for a, b in zip(s, s[1:]) if b[0] < a[1]]


PY = sys.executable
