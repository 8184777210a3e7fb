"""Holder records: stale ones are reclaimed, live ones name the holder, the epilog clears a job;
what a record may say, and what a launch says about one that does not parse."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess

import psutil
import pytest

from helpers_jobs import LEASE_HOLDER, PY, fake_topology, python_env, wait_for, write_script, write_topology
from smartlaunch.errors import ExitCode, NoFreeGPUError
from smartlaunch.launch.lease_holders import RecordError, current_user, parse_record
from smartlaunch.launch.lease_records import hold, write_locked
from smartlaunch.launch.leases import LeaseManager, boot_id, lease_dir_for, release_job
from smartlaunch.policy.api import PathsPolicy, Policy


def _write_record(lease_dir: str, uuid: str, *, held: list[int] | None = None, **over) -> str:
    """A holder record written by hand; with `held` (a list the fd goes to), live: its write
    lock held by this process, as a launch holds its own."""
    rec = {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "boot_id": boot_id(),
           "uid": os.geteuid(), "user": "alice", "host": "h", "slurm_job_id": None, "time": 0.0,
           "gpu_uuid": uuid}
    rec.update(over)
    path = os.path.join(lease_dir, f"gpu-{uuid}.{rec['pid']}.{len(os.listdir(lease_dir))}.holder")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, json.dumps(rec).encode())
    if held is None:
        os.close(fd)
    else:
        hold(fd)
        held.append(fd)
    return path


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("stale", [
    {},                                 # its pid lives (ours), but nobody holds its lock
    {"pid": "dead"},
    {"boot_id": "00000000-0000-0000-0000-000000000000"},
])
def test_a_record_nobody_holds_is_stale_and_reclaimed(clean_env, stale):
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    said: list[str] = []
    mgr = LeaseManager(lease_dir, say=said.append)
    if stale.get("pid") == "dead":
        stale = {"pid": _dead_pid()}
    path = _write_record(lease_dir, topo.gpu(0).uuid, **stale)
    assert mgr.taken(topo) == set()
    assert not os.path.exists(path)
    with mgr.acquire(topo, [0], 1, wait=False, timeout_s=0) as lease:
        assert lease.gpus == (0,)
    assert said == []                   # well formed: nothing to name


def test_live_record_blocks_and_names_its_files_owner(clean_env):
    """A lease is its record while its write lock is held: the pid and job come from the text,
    the user from the file's owner ("alice" in the text is not believed)."""
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    parent = psutil.Process().parent()
    held: list[int] = []
    path = _write_record(lease_dir, topo.gpu(0).uuid, held=held, pid=parent.pid,
                         create_time=parent.create_time(), slurm_job_id="77")
    with pytest.raises(NoFreeGPUError, match=rf"GPU 0 is leased by pid {parent.pid} "
                                             rf"\(user {current_user()}, job 77\)"):
        mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)
    os.close(held[0])                   # its holder is gone
    with mgr.acquire(topo, [0], 1, wait=False, timeout_s=0) as lease:
        assert lease.gpus == (0,) and not os.path.exists(path)


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


def test_a_policy_that_allows_busy_gpus_launches_on_one(clean_env, tmp_path):
    """decision.avoid_busy_gpus false (the workstation policy: a GPU another process uses is
    planned on its free memory): the launch gets the busy GPU at once, where the lease used to
    refuse it and the launch waited jobs.wait_timeout_s for the plan's own GPU."""
    topo = write_topology(tmp_path / "topo.json", fake_topology(1, busy=(0,)))
    script = write_script(tmp_path, "t.py", "import os\nprint('ran on', os.environ['CUDA_VISIBLE_DEVICES'])\n")
    env = python_env(SMARTLAUNCH_FAKE_TOPOLOGY=topo)
    argv = [PY, "-m", "smartlaunch.cli", "--strategy", "single", "--no-wait", script]
    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "GPU0 is busy" in refused.stderr, refused.stderr
    allow = tmp_path / "busy-ok.yaml"
    allow.write_text("decision:\n  avoid_busy_gpus: false\n")
    r = subprocess.run([*argv[:3], "--policy", str(allow), *argv[3:]], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ran on GPU-fake-0000-aaaa" in r.stdout or "ran on 0" in r.stdout, r.stdout


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
    held: list[int] = []
    mine = _write_record(d, topo.gpu(0).uuid, held=held, slurm_job_id="77")
    mine_dead = _write_record(d, topo.gpu(1).uuid, slurm_job_id="77")
    other = _write_record(d, topo.gpu(1).uuid, held=held, slurm_job_id="78")
    other_dead = _write_record(d, topo.gpu(0).uuid, slurm_job_id="78")
    assert sorted(release_job(d, "77")) == sorted([mine, mine_dead])
    assert os.path.exists(other)
    assert not any(os.path.exists(p) for p in (mine, mine_dead, other_dead))   # stale: swept


def test_lease_dir_env_overrides_built_in_policy_but_not_an_enforced_one(clean_env):
    pol = Policy(paths=PathsPolicy(lease_dir="/srv/leases"))
    assert lease_dir_for(pol) == os.environ["SMARTLAUNCH_LEASE_DIR"]
    enforced = Policy(paths=PathsPolicy(lease_dir="/srv/leases"),
                      sources={"paths.lease_dir": "enforced:/etc/smartlaunch/policy.yaml"})
    assert lease_dir_for(enforced) == "/srv/leases"


# ---- what a record may say ---------------------------------------------------------------
_GOOD = {"pid": 12, "create_time": 1.5, "uid": 0, "time": 2, "gpu_uuid": "GPU-x", "user": "a",
         "host": "h", "slurm_job_id": None, "boot_id": "b", "shared": True, "future": [1]}


def _parse(**over):
    return parse_record(json.dumps({**_GOOD, **over}).encode(), owner=0, record="r")


def test_a_well_formed_record_is_typed_and_named_by_its_owner():
    h = _parse()
    assert (h.pid, h.create_time, h.time, h.gpu_uuid, h.shared, h.slurm_job_id, h.record) == \
        (12, 1.5, 2.0, "GPU-x", True, None, "r")
    assert h.user == "root" and h.describe() == "pid 12 (user root)"     # not the text's "a"


@pytest.mark.parametrize("over, says", [
    ({"pid": "1"}, "field pid is not a positive integer"),
    ({"pid": -5}, "field pid is not a positive integer"),
    ({"pid": 1.5}, "field pid is not a positive integer"),
    ({"pid": True}, "field pid is not a positive integer"),
    ({"pid": 0}, "field pid is not a positive integer"),
    ({"pid": 1 << 40}, "field pid is not a positive integer"),
    ({"create_time": "x"}, "field create_time is not a finite number >= 0"),
    ({"create_time": float("nan")}, "field create_time is not a finite number >= 0"),
    ({"time": float("inf")}, "field time is not a finite number >= 0"),
    ({"time": -1}, "field time is not a finite number >= 0"),
    ({"uid": "0"}, "field uid is not the file's owner (uid 0)"),
    ({"uid": 65534}, "field uid is not the file's owner (uid 0)"),
    ({"gpu_uuid": None}, "field gpu_uuid is not a printable string of at most 256 characters"),
    ({"gpu_uuid": "a\nb"}, "field gpu_uuid is not a printable string"),
    ({"host": "\x1b[31mred"}, "field host is not a printable string of at most 256 characters "
                              "or null"),
    ({"user": "x" * 257}, "field user is not a printable string"),
    ({"slurm_job_id": 77}, "field slurm_job_id is not a printable string"),
    ({"shared": "yes"}, "field shared is not true or false"),
])
def test_a_record_with_a_wrong_field_names_it(over, says):
    with pytest.raises(RecordError) as err:
        _parse(**over)
    assert str(err.value).startswith(says), str(err.value)


@pytest.mark.parametrize("data, says", [
    (b"[1, 2]", "it is a JSON list, not an object"),
    (b'"pid"', "it is a JSON str, not an object"),
    (b"{", "it is not JSON"),
    (b"\xff\xfe", "it is not JSON"),
    (b"[" * 100000, "it is not JSON"),              # nesting deeper than the parser's stack
])
def test_a_record_that_is_not_an_object_says_so(data, says):
    with pytest.raises(RecordError, match=re.escape(says)):
        parse_record(data, owner=0)


def test_a_bad_record_is_named_once_and_leases_nothing(clean_env):
    """Read by the probe, every try and every waiter: named once in this process."""
    topo = fake_topology(1)
    d = os.environ["SMARTLAUNCH_LEASE_DIR"]
    said: list[str] = []
    LeaseManager(d).close()
    held: list[int] = []
    path = _write_record(d, topo.gpu(0).uuid, held=held, pid=os.getpid(), time="soon")
    name = os.path.basename(path)
    for _ in range(3):
        assert LeaseManager(d, say=said.append).taken(topo) == set()
    with LeaseManager(d, say=said.append).acquire(topo, [0], 1, wait=False, timeout_s=0) as lease:
        assert lease.gpus == (0,)
    assert said == [f"ignoring lease record {name} in {d} (owner uid {os.geteuid()}): field time "
                    f"is not a finite number >= 0; it leases nothing"]
    assert os.path.exists(path)     # live (its lock is held): not ours to remove
    os.close(held[0])


def test_a_live_record_linked_under_another_gpus_name_claims_nothing_there(clean_env):
    topo = fake_topology(2)
    d = os.environ["SMARTLAUNCH_LEASE_DIR"]
    said: list[str] = []
    mgr = LeaseManager(d, say=said.append)
    with mgr.acquire(topo, [0], 1, wait=False, timeout_s=0):
        (ours,) = os.listdir(d)
        fake = ours.replace(topo.gpu(0).uuid, topo.gpu(1).uuid)
        os.link(os.path.join(d, ours), os.path.join(d, fake))
        assert mgr.taken(topo) == {0}
        assert len(said) == 1 and said[0].startswith(f"ignoring lease record {fake} in {d}") \
            and "its fields gpu_uuid and pid do not match its name" in said[0]


def test_records_are_readable_by_all_whatever_the_umask_and_gone_once_released(clean_env):
    """A umask of 077 must not hide a lease from other users (they would lease the GPU too)."""
    topo = fake_topology(1)
    d = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(d)
    old = os.umask(0o077)
    try:
        lease = mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)
    finally:
        os.umask(old)
    (name,) = os.listdir(d)                 # no temporary name left beside it
    path = os.path.join(d, name)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    fd = os.open(path, os.O_RDONLY)
    try:
        assert write_locked(fd)
        lease.release()
        assert not os.path.exists(path)
        assert not write_locked(fd)         # unlinked, then closed: the lock went with it
    finally:
        os.close(fd)


def test_a_lease_released_after_its_manager_closed_leaves_no_record(clean_env):
    topo = fake_topology(2)
    d = os.environ["SMARTLAUNCH_LEASE_DIR"]
    with LeaseManager(d) as mgr:
        lease = mgr.acquire(topo, [0, 1], 2, wait=False, timeout_s=0)
    assert len(os.listdir(d)) == 2
    lease.release(0)
    assert len(os.listdir(d)) == 1
    lease.release()
    assert os.listdir(d) == [] and mgr._dfd == -1


def test_past_twenty_bad_records_one_line_says_the_rest_go_unnamed(clean_env):
    topo = fake_topology(1)
    d = os.environ["SMARTLAUNCH_LEASE_DIR"]
    said: list[str] = []
    mgr = LeaseManager(d, say=said.append)
    for i in range(30):
        with open(os.path.join(d, f"gpu-{topo.gpu(0).uuid}.1.{i:x}.holder"), "w") as f:
            f.write("junk")
    assert mgr.taken(topo) == set() and mgr.taken(topo) == set()
    assert len(said) == 21 and all("it is not JSON" in x for x in said[:20])
    assert said[20] == (f"ignoring more lease records in {d} that do not parse, without naming "
                        f"them (`ls -la {d}` lists them)")
