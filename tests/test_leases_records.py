"""Holder records: stale ones are reclaimed, live ones name the holder, the epilog clears a job."""
from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest

from helpers_jobs import LEASE_HOLDER, PY, fake_topology, python_env, wait_for, write_script, write_topology
from smartlaunch.errors import ExitCode, NoFreeGPUError
from smartlaunch.launch.leases import LeaseManager, boot_id, lease_dir_for, release_job
from smartlaunch.policy.api import PathsPolicy, Policy


def _write_record(lease_dir: str, uuid: str, **over) -> str:
    rec = {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "boot_id": boot_id(),
           "uid": os.geteuid(), "user": "alice", "host": "h", "slurm_job_id": None, "time": 0.0,
           "gpu_uuid": uuid}
    rec.update(over)
    path = os.path.join(lease_dir, f"gpu-{uuid}.{rec['pid']}.{len(os.listdir(lease_dir))}.holder")
    with open(path, "w") as f:
        json.dump(rec, f)
    return path


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("stale", [
    {"pid": "dead"},
    {"boot_id": "00000000-0000-0000-0000-000000000000"},         # holder from before a reboot
    {"create_time": 12345.0},                                   # pid reused by another process
])
def test_stale_record_is_reclaimed(clean_env, stale):
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    if stale.get("pid") == "dead":
        stale = {"pid": _dead_pid()}
    path = _write_record(lease_dir, topo.gpu(0).uuid, **stale)
    assert mgr.taken(topo) == set()
    assert not os.path.exists(path)
    with mgr.acquire(topo, [0], 1, wait=False, timeout_s=0) as lease:
        assert lease.gpus == (0,)


def test_live_record_blocks(clean_env):
    """A lease is its record: a live holder's record keeps the GPU taken."""
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    parent = psutil.Process().parent()
    _write_record(lease_dir, topo.gpu(0).uuid, pid=parent.pid, create_time=parent.create_time(),
                  slurm_job_id="77")
    with pytest.raises(NoFreeGPUError, match=rf"GPU 0 is leased by pid {parent.pid} \(user alice, job 77\)"):
        mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)


def test_no_wait_names_every_holder_and_how_to_wait(clean_env):
    topo = fake_topology(2)
    topo_path = write_topology(clean_env / "topo.json", topo)
    holder = write_script(clean_env, "holder.py", LEASE_HOLDER)
    ready = clean_env / "ready"
    p = subprocess.Popen([PY, holder, topo_path, str(ready), "0,1"],
                         env=python_env(SLURM_JOB_ID="77"))
    try:
        wait_for(ready)
        mgr = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"])
        with pytest.raises(NoFreeGPUError) as err:
            mgr.acquire(topo, [0, 1], 1, wait=False, timeout_s=3600)
        user = psutil.Process(p.pid).username()
        assert str(err.value) == (f"GPUs 0,1 are leased by pid {p.pid} (user {user}, job 77); "
                                  "retry later or drop --no-wait to wait up to 3600 s")
        assert err.value.exit_code == ExitCode.NO_FREE_GPU
        with pytest.raises(NoFreeGPUError, match=r"waited \d+ s for 1 free GPU\(s\) of 0,1: .*jobs.wait_timeout_s"):
            mgr.acquire(topo, [0, 1], 1, wait=True, timeout_s=0.3)
        assert mgr.taken(topo) == {0, 1}
    finally:
        p.kill()
        p.wait()
    assert release_job(os.environ["SMARTLAUNCH_LEASE_DIR"], "77") != []


def test_busy_gpu_counts_as_taken(clean_env):
    topo = fake_topology(2, busy=(0,))
    mgr = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"])
    assert mgr.taken(topo) == {0}
    with mgr.acquire(topo, [0, 1], 1, wait=False, timeout_s=0) as lease:
        assert lease.gpus == (1,)
        with pytest.raises(NoFreeGPUError, match=r"GPU 0 is in use by pid 4242 \(user mallory\) .*"
                                                 r"GPU 1 is leased by this launch"):
            mgr.acquire(topo, [0, 1], 1, wait=False, timeout_s=0)


def test_partial_sets_are_not_held(clean_env):
    topo = fake_topology(2)
    mgr = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"])
    with mgr.acquire(topo, [1], 1, wait=False, timeout_s=0):
        assert mgr.try_acquire(topo, [0, 1], 2) is None
        assert mgr.taken(topo) == {1}               # GPU 0 was given back
    with mgr.acquire(topo, [0, 1], 2, wait=False, timeout_s=0) as both:
        assert both.gpus == (0, 1)
        both.release(0)
        assert mgr.taken(topo) == {1}


def test_shared_leases_coexist_but_exclusive_ones_do_not(clean_env):
    topo = fake_topology(1)
    d = os.environ["SMARTLAUNCH_LEASE_DIR"]
    shared_a, shared_b, exclusive = LeaseManager(d, share=True), LeaseManager(d, share=True), LeaseManager(d)
    a = shared_a.acquire(topo, [0], 1, wait=False, timeout_s=0)
    b = shared_b.acquire(topo, [0], 1, wait=False, timeout_s=0)
    with pytest.raises(NoFreeGPUError):
        exclusive.acquire(topo, [0], 1, wait=False, timeout_s=0)
    a.release()
    b.release()
    with exclusive.acquire(topo, [0], 1, wait=False, timeout_s=0):
        with pytest.raises(NoFreeGPUError):
            shared_a.acquire(topo, [0], 1, wait=False, timeout_s=0)


def test_release_job_removes_only_that_jobs_records(clean_env):
    topo = fake_topology(2)
    d = os.environ["SMARTLAUNCH_LEASE_DIR"]
    LeaseManager(d).close()
    mine = _write_record(d, topo.gpu(0).uuid, slurm_job_id="77")
    other = _write_record(d, topo.gpu(1).uuid, slurm_job_id="78")
    assert release_job(d, "77") == [mine]
    assert os.path.exists(other) and not os.path.exists(mine)


def test_lease_dir_env_overrides_built_in_policy_but_not_an_enforced_one(clean_env):
    pol = Policy(paths=PathsPolicy(lease_dir="/srv/leases"))
    assert lease_dir_for(pol) == os.environ["SMARTLAUNCH_LEASE_DIR"]
    enforced = Policy(paths=PathsPolicy(lease_dir="/srv/leases"),
                      sources={"paths.lease_dir": "enforced:/etc/smartlaunch/policy.yaml"})
    assert lease_dir_for(enforced) == "/srv/leases"
