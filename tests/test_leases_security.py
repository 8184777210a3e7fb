"""Hostile shared lease directories: symlinks, pre-created files, loose permissions."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from helpers_jobs import PY, fake_topology, python_env, write_topology
from helpers_nobody import AS_NOBODY, HOLD_UNTIL_STDIN, NOBODY, as_nobody, needs_nobody, shared_lease_dir
from helpers_policy import as_admin_installed, needs_admin_install
from smartlaunch.errors import NoFreeGPUError
from smartlaunch.launch.leases import LeaseDirError, LeaseManager, open_lease_dir

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


def test_lock_file_symlink_to_victim_file_is_ignored_and_victim_untouched(clean_env):
    topo = fake_topology(2)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    victim = clean_env / "victim.txt"
    victim.write_text("precious")
    victim.chmod(0o640)
    before = os.stat(victim)
    os.symlink(victim, _lock_path(lease_dir, topo, 0))
    lease = mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)
    assert lease.gpus == (0,)                     # nothing at a predictable name is trusted
    lease.release()
    after = os.stat(victim)
    assert victim.read_text() == "precious"
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (before.st_mode, before.st_size, before.st_mtime_ns)


def test_lock_file_hard_link_is_ignored_and_victim_untouched(clean_env):
    topo = fake_topology(1)
    lease_dir = os.environ["SMARTLAUNCH_LEASE_DIR"]
    mgr = LeaseManager(lease_dir)
    victim = clean_env / "victim.txt"
    victim.write_text("precious")
    os.link(victim, _lock_path(lease_dir, topo, 0))
    with mgr.acquire(topo, [0], 1, wait=False, timeout_s=0) as lease:
        assert lease.gpus == (0,)
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


# ---- a lease directory the user cannot write: advice that user can follow ----------------
# Real commands as uid 65534 (helpers_nobody).


def _launch_as_nobody(d: Path, lease_owner: int, mode: int, wrap=lambda argv: argv):
    """`smartlaunch --strategy single t.py` as nobody, whose home and working directory are
    its own, with a lease directory owned by lease_owner; (exit code, stderr lines)."""
    for sub in ("home", "work", "leases"):
        (d / sub).mkdir(exist_ok=True)
    (d / "work" / "t.py").write_text("print('ran')\n")
    for sub in ("home", "work"):
        os.chown(d / sub, NOBODY, NOBODY)
    os.chown(d / "leases", lease_owner, lease_owner)
    (d / "leases").chmod(mode)
    env = {**python_env(), "HOME": str(d / "home"), "XDG_CACHE_HOME": str(d / "home" / ".cache"),
           "SMARTLAUNCH_LEASE_DIR": str(d / "leases"),
           "SMARTLAUNCH_FAKE_TOPOLOGY": write_topology(d / "topo.json", fake_topology(2))}
    r = subprocess.run(wrap([*AS_NOBODY, PY, "-m", "smartlaunch.cli", "--strategy", "single",
                             "t.py"]), cwd=d / "work", env=env, capture_output=True, text=True,
                       timeout=120)
    return r.returncode, [x for x in r.stderr.splitlines() if "smartlaunch" in x]


@needs_nobody
def test_a_shared_dir_the_user_cannot_write_names_what_the_user_can_do(nobody_dir):
    code, lines = _launch_as_nobody(nobody_dir, 0, 0o755)
    lease_dir = nobody_dir / "leases"
    assert code == 3 and len(lines) == 1, lines
    assert lines[0] == (
        f"smartlaunch: error: lease directory {lease_dir} is not writable by you (uid {NOBODY}; "
        f"it is owned by uid 0, mode 0755); set SMARTLAUNCH_LEASE_DIR (or paths.lease_dir in "
        f"your policy) to a directory you can write, or ask your admin to make it shared "
        f"(`chmod 1777 {lease_dir}`)")
    assert not list(lease_dir.iterdir())


@needs_nobody
def test_the_owner_of_a_read_only_dir_is_told_the_chmod(nobody_dir):
    code, lines = _launch_as_nobody(nobody_dir, NOBODY, 0o555)
    lease_dir = nobody_dir / "leases"
    assert code == 3 and lines == [
        f"smartlaunch: error: lease directory {lease_dir} is yours but not writable (mode "
        f"0555); run `chmod 1777 {lease_dir}` (shared with other users) or `chmod 700 "
        f"{lease_dir}` (yours only)"], lines


@needs_nobody
@needs_admin_install
def test_an_enforced_dir_the_user_cannot_write_says_ask_the_admin(nobody_dir):
    lease_dir = nobody_dir / "leases"
    admin = nobody_dir / "admin.yaml"
    admin.write_text(f"enforce:\n  paths:\n    lease_dir: {lease_dir}\n")
    code, lines = _launch_as_nobody(nobody_dir, 0, 0o755, lambda argv: as_admin_installed(
        argv, str(admin), nobody_dir / "overlay"))
    assert code == 3 and len(lines) == 1, lines
    assert "not writable by you" in lines[0] and "SMARTLAUNCH_LEASE_DIR" not in lines[0]
    assert lines[0].endswith(f"and the admin's policy fixes paths.lease_dir: ask your admin "
                             f"to make it shared (`chmod 1777 {lease_dir}`)"), lines


@needs_admin_install          # the same needs: root and unshare --mount
def test_a_lease_dir_on_a_read_only_filesystem_is_not_a_chmod(clean_env):
    # a read-only mount refuses even its owner: chmod would not help
    lease_dir = clean_env / "ro"
    lease_dir.mkdir()
    mount = f"mount -t tmpfs -o ro,mode=1777 tmpfs {lease_dir} && exec \"$@\""
    env = {**python_env(), "SMARTLAUNCH_LEASE_DIR": str(lease_dir),
           "SMARTLAUNCH_FAKE_TOPOLOGY": write_topology(clean_env / "topo.json", fake_topology(2))}
    (clean_env / "t.py").write_text("print('ran')\n")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh",
                        PY, "-m", "smartlaunch.cli", "--strategy", "single", "t.py"],
                       cwd=clean_env, env=env, capture_output=True, text=True, timeout=120)
    lines = [x for x in r.stderr.splitlines() if "smartlaunch" in x]
    assert r.returncode == 3 and lines == [
        f"smartlaunch: error: lease directory {lease_dir} is on a read-only filesystem; set "
        f"SMARTLAUNCH_LEASE_DIR (or paths.lease_dir in your policy) to a directory you can "
        f"write, or ask your admin to set paths.lease_dir to a writable directory"], r.stderr


# ---- files made by another account, for real (uid 65534 through setpriv) ---------------
# More in test_leases_strangers.py: records that do not parse, locks, hidepid.


_PLANT = """
import json, os, sys
d, uuid, victim, me = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lock = os.path.join(d, f"gpu-{uuid}.lock")
fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)   # nobody else may open it
os.write(fd, b"attacker data"); os.close(fd)
os.symlink(victim, os.path.join(d, f"gpu-{uuid}.lock.link"))
os.link(lock, os.path.join(d, f"gpu-{uuid}.lock.hard"))
boot = open("/proc/sys/kernel/random/boot_id").read().strip()
import psutil
for n, pid in (("a1", 1), ("a2", me)):     # live processes, not its own, and no lock held
    rec = {"pid": pid, "create_time": psutil.Process(pid).create_time(), "boot_id": boot,
           "uid": os.geteuid(), "user": "nobody", "host": "h", "slurm_job_id": None, "time": 0,
           "gpu_uuid": uuid}
    with open(os.path.join(d, f"gpu-{uuid}.{pid}.{n}.holder"), "x") as f:
        json.dump(rec, f)
"""


@needs_nobody
def test_files_planted_by_another_user_neither_block_nor_hijack(clean_env):
    """Another account pre-creates the old lock file (0600: we could not even open it), a
    symlink and a hard link, and well-formed holder records naming live processes that are
    not its own, with no lock held on them. None of it blocks the GPU, and nothing of theirs
    is opened for writing or changed."""
    topo = fake_topology(1)
    lease_dir = shared_lease_dir(os.environ["SMARTLAUNCH_LEASE_DIR"])
    victim = clean_env / "victim.txt"
    victim.write_text("precious")
    p = as_nobody(_PLANT, lease_dir, topo.gpu(0).uuid, str(victim), str(os.getpid()),
                  stderr=subprocess.PIPE)
    assert p.wait(timeout=60) == 0, p.stderr.read()
    planted = {n: os.lstat(os.path.join(lease_dir, n)) for n in os.listdir(lease_dir)}
    assert len(planted) == 5 and all(st.st_uid == NOBODY for st in planted.values())
    mgr = LeaseManager(lease_dir)
    with mgr.acquire(topo, [0], 1, wait=False, timeout_s=0) as lease:
        assert lease.gpus == (0,)
        ours = [n for n in os.listdir(lease_dir) if n not in planted]
        assert len(ours) == 1 and os.lstat(os.path.join(lease_dir, ours[0])).st_uid == os.geteuid()
        # and a second claim sees our lease, whatever their files say
        with pytest.raises(NoFreeGPUError, match="GPU 0 is leased by this launch"):
            LeaseManager(lease_dir).acquire(topo, [0], 1, wait=False, timeout_s=0)
    assert victim.read_text() == "precious"
    for n, st in planted.items():       # their files are theirs, unchanged (the stale
        if n.endswith(".holder"):       # records root may remove: ours is a root test)
            continue
        now = os.lstat(os.path.join(lease_dir, n))
        assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


@needs_nobody
def test_another_users_live_lease_blocks_and_is_named(clean_env):
    topo = fake_topology(2)
    lease_dir = shared_lease_dir(os.environ["SMARTLAUNCH_LEASE_DIR"])
    topo_path = write_topology(clean_env / "topo.json", topo)
    os.chmod(topo_path, 0o644)
    p = as_nobody(HOLD_UNTIL_STDIN, topo_path, "-", "0", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == "0"
        mgr = LeaseManager(lease_dir)
        with pytest.raises(NoFreeGPUError, match=rf"GPU 0 is leased by pid {p.pid} \(user nobody\)"):
            mgr.acquire(topo, [0], 1, wait=False, timeout_s=0)
        with mgr.acquire(topo, [0, 1], 1, wait=False, timeout_s=0) as lease:
            assert lease.gpus == (1,)
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    with LeaseManager(lease_dir).acquire(topo, [0], 1, wait=False, timeout_s=0) as lease:
        assert lease.gpus == (0,)       # their holder ended: its record is stale
