"""Hostile shared lease directories: symlinks, pre-created files, loose permissions."""
from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from helpers_jobs import LEASE_HOLDER, PY, fake_topology, python_env, wait_for, write_script, write_topology
from smartlaunch.errors import NoFreeGPUError
from smartlaunch.launch.leases import LeaseDirError, LeaseManager, open_lease_dir

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _lock_path(lease_dir, topo, i: int) -> str:
    return os.path.join(lease_dir, f"gpu-{topo.gpu(i).uuid}.lock")


def test_new_shared_dir_is_sticky_world_writable(clean_env):
    d = clean_env / "shared"
    LeaseManager(str(d)).close()
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o1777


def test_new_private_dir_is_owner_only(clean_env):
    d = clean_env / "private"
    LeaseManager(str(d), private=True).close()
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700


def test_lock_file_symlink_to_victim_file_leaves_victim_untouched(clean_env):
    topo = fake_topology(2)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    victim = clean_env / "victim.txt"
    victim.write_text("precious")
    victim.chmod(0o640)
    before = os.stat(victim)
    os.symlink(victim, _lock_path(lease_dir, topo, 0))
    with pytest.raises(NoFreeGPUError, match=r"GPU 0 is .*is a symlink"):
        mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)
    lease = mgr.acquire(topo, [0, 1], 1, wait=False, timeout_s=0)
    assert lease.gpus == (1,)                     # the trapped GPU is skipped, not followed
    lease.release()
    after = os.stat(victim)
    assert victim.read_text() == "precious"
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (before.st_mode, before.st_size, before.st_mtime_ns)


def test_lock_file_hard_link_is_refused(clean_env):
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    victim = clean_env / "victim.txt"
    victim.write_text("precious")
    os.link(victim, _lock_path(lease_dir, topo, 0))
    with pytest.raises(NoFreeGPUError, match="not a regular file with one link"):
        mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)
    assert victim.read_text() == "precious"


def test_lease_dir_that_is_a_symlink_is_refused(clean_env):
    real = clean_env / "real"
    real.mkdir(mode=0o700)
    link = clean_env / "link"
    link.symlink_to(real)
    with pytest.raises(LeaseDirError, match="is a symlink"):
        LeaseManager(str(link))
    assert list(real.iterdir()) == []


def test_world_writable_dir_without_sticky_bit_is_refused(clean_env):
    d = clean_env / "loose"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(LeaseDirError, match="without the sticky bit .*chmod 1777"):
        LeaseManager(str(d))
    d.chmod(0o1777)
    LeaseManager(str(d)).close()


@needs_root
def test_dir_owned_by_another_user_is_refused(clean_env):
    d = clean_env / "theirs"
    d.mkdir(mode=0o755)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(LeaseDirError, match=f"owned by uid {NOBODY}"):
        open_lease_dir(str(d))


@needs_root
def test_lock_file_precreated_by_another_user_is_not_truncated_or_hijacked(clean_env):
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    lock = _lock_path(lease_dir, topo, 0)
    with open(lock, "w") as f:
        f.write("attacker data")
    os.chown(lock, NOBODY, NOBODY)
    os.chmod(lock, 0o666)
    lease = mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)
    st = os.lstat(lock)
    assert open(lock).read() == "attacker data"
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o666)
    # Our own record says who holds the GPU, in a file we own.
    records = [n for n in os.listdir(lease_dir) if n.endswith(".holder")]
    assert len(records) == 1 and os.lstat(os.path.join(lease_dir, records[0])).st_uid == os.geteuid()
    # The lock file's owner can unlink it, making a fresh unlocked inode appear at the path.
    # Another launch must still see our live lease.
    os.unlink(lock)
    topo_path = write_topology(clean_env / "topo.json", topo)
    holder = write_script(clean_env, "holder.py", LEASE_HOLDER)
    r = subprocess.run([PY, holder, topo_path, str(clean_env / "ready"), "0"], env=python_env(),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and f"leased by pid {os.getpid()}" in r.stderr
    lease.release()


@needs_root
def test_forged_record_for_another_uid_is_ignored(clean_env):
    """A record claims to be our live launcher but is owned by someone else: not trusted."""
    import psutil
    from smartlaunch.launch.leases import boot_id
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    name = os.path.join(lease_dir, f"gpu-{topo.gpu(0).uuid}.1.forged.holder")
    with open(name, "w") as f:
        json.dump({"pid": os.getpid(), "create_time": psutil.Process().create_time(), "boot_id": boot_id(),
                   "uid": os.geteuid(), "user": "root", "host": "h", "slurm_job_id": None,
                   "time": 0, "gpu_uuid": topo.gpu(0).uuid}, f)
    os.chown(name, NOBODY, NOBODY)
    lease = mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)
    assert lease.gpus == (0,)
    lease.release()


def test_holder_record_names_are_unpredictable_and_not_followed(clean_env):
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    names = set()
    for _ in range(3):
        with mgr.acquire(topo, [0], 1, wait=False, timeout_s=0):
            names |= {n for n in os.listdir(lease_dir) if n.endswith(".holder")}
    assert len(names) == 3
    for n in names:
        assert not os.path.lexists(os.path.join(lease_dir, n))   # released leases leave no record
