"""Leases under real concurrency: many launchers, and a launcher killed while holding a GPU."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from helpers_jobs import (LEASE_CLIENT, LEASE_HOLDER, PY, fake_topology, overlapping, python_env,
                          wait_for, write_script, write_topology)
from smartlaunch.launch.leases import LeaseManager


@pytest.mark.timeout(60)
def test_fifty_concurrent_launches_never_share_a_gpu(clean_env):
    topo = write_topology(clean_env / "topo.json", fake_topology(2))
    client = write_script(clean_env, "client.py", LEASE_CLIENT)
    out = clean_env / "out"
    out.mkdir()
    t0 = time.monotonic()
    procs = [subprocess.Popen([PY, client, topo, str(out), "0.03", str(i)], env=python_env())
             for i in range(50)]
    codes = [p.wait(timeout=50) for p in procs]
    elapsed = time.monotonic() - t0
    assert codes == [0] * 50
    recs = [json.loads(f.read_text()) for f in out.iterdir()]
    assert len(recs) == 50
    by_gpu = {g: [(r["start"], r["end"]) for r in recs if r["gpu"] == g] for g in (0, 1)}
    assert sum(len(v) for v in by_gpu.values()) == 50
    for g, spans in by_gpu.items():
        assert overlapping(spans) == [], f"GPU {g} was held by two launches at once"
    assert elapsed < 30, f"50 launches took {elapsed:.1f} s"


def test_sigkilled_holder_frees_its_gpu_within_a_second(clean_env):
    topo = fake_topology(2)
    topo_path = write_topology(clean_env / "topo.json", topo)
    holder = write_script(clean_env, "holder.py", LEASE_HOLDER)
    ready = clean_env / "ready"
    p = subprocess.Popen([PY, holder, topo_path, str(ready), "0"], env=python_env())
    try:
        wait_for(ready)
        mgr = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"], poll_s=0.02)
        assert 0 in mgr.taken(topo)
        p.send_signal(signal.SIGKILL)
        # Not reaped on purpose: a zombie holder must not count as alive.
        t0 = time.monotonic()
        lease = mgr.acquire(topo, [0], 1, wait=True, timeout_s=1.0)
        assert lease.gpus == (0,)
        assert time.monotonic() - t0 < 1.0
        lease.release()
    finally:
        p.kill()
        p.wait()


def test_waiting_launch_gets_the_gpu_when_the_holder_releases(clean_env):
    topo = fake_topology(1)
    mgr = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"], poll_s=0.02)
    topo_path = write_topology(clean_env / "topo.json", topo)
    holder = write_script(clean_env, "holder.py", LEASE_HOLDER)
    ready = clean_env / "ready"
    p = subprocess.Popen([PY, holder, topo_path, str(ready), "0"], env=python_env())
    statuses: list[str] = []
    try:
        wait_for(ready)
        subprocess.Popen(["sh", "-c", f"sleep 0.5; kill {p.pid}"])
        t0 = time.monotonic()
        lease = mgr.acquire(topo, [0], 1, wait=True, timeout_s=10, status=statuses.append)
        assert 0.3 < time.monotonic() - t0 < 5
        lease.release()
    finally:
        p.kill()
        p.wait()
    assert statuses and f"leased by pid {p.pid}" in statuses[0] and "waiting for 1 free GPU(s) of 0" in statuses[0]


# Waits for its stdin to close (every claimer starts racing at once), then claims `count` GPUs
# without waiting, over and over, until it has held `wins` leases (each a moment) or 60 s
# passed; writes the spans it held.
_CLAIMER = textwrap.dedent("""
    import json, os, random, sys, time
    from smartlaunch.launch.leases import LeaseManager
    from smartlaunch.topology.api import Topology
    topo_path, out, share, count, wins = sys.argv[1:6]
    topo = Topology.from_dict(json.load(open(topo_path)))
    mgr = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"], share=share == "shared")
    sys.stdin.read()
    spans, tries, deadline = [], 0, time.monotonic() + 60
    while len(spans) < int(wins) * int(count) and time.monotonic() < deadline:
        tries += 1
        lease = mgr.try_acquire(topo, [g.index for g in topo.gpus], int(count))
        if lease is not None:
            start = time.monotonic()
            time.sleep(random.random() * 0.002)
            spans += [(g, start, time.monotonic()) for g in lease.gpus]
            lease.release()
        time.sleep(random.random() * 0.002)
    json.dump({"shared": share == "shared", "spans": spans, "tries": tries}, open(out, "w"))
""")


@pytest.mark.timeout(120)
def test_racing_claims_never_lease_a_gpu_twice(clean_env):
    """Sixteen launches released at once claim 3 GPUs over and over, without waiting: shared
    ones, exclusive ones, exclusive pairs, ten leases each. An exclusive lease never overlaps
    another lease of its GPU; shared ones may overlap each other. No lock serialises them:
    claim, then check."""
    topo = write_topology(clean_env / "topo.json", fake_topology(3))
    client = write_script(clean_env, "claimer.py", _CLAIMER)
    out = clean_env / "out"
    out.mkdir()
    kinds = [("shared", 1)] * 6 + [("exclusive", 1)] * 6 + [("exclusive", 2)] * 4
    procs = [subprocess.Popen([PY, client, topo, str(out / f"{i}.json"), share, str(count), "10"],
                              stdin=subprocess.PIPE, env=python_env())
             for i, (share, count) in enumerate(kinds)]
    for p in procs:
        p.stdin.close()
    assert [p.wait(timeout=100) for p in procs] == [0] * len(procs)
    results = [json.loads((out / f"{i}.json").read_text()) for i in range(len(kinds))]
    spans = [(g, s, e, r["shared"], i) for i, r in enumerate(results) for g, s, e in r["spans"]]
    for gpu in range(3):
        mine = [x for x in spans if x[0] == gpu]
        for g, s, e, shared, who in mine:
            if shared:
                continue
            clash = [x for x in mine if x[4] != who and x[1] < e and s < x[2]]
            assert clash == [], f"GPU {gpu}: exclusive lease of claimer {who} overlaps {clash}"
    for i, (share, count) in enumerate(kinds):     # and each got its ten
        assert len(results[i]["spans"]) == 10 * count, (i, share, count, results[i]["tries"])
    assert os.listdir(os.environ["SMARTLAUNCH_LEASE_DIR"]) == []
