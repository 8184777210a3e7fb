"""Hostile shared lease directories: symlinks, pre-created files, loose permissions."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from helpers_jobs import LEASE_HOLDER, PY, fake_topology, python_env, wait_for, write_script, write_topology
from helpers_policy import as_admin_installed, needs_admin_install
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


# ---- a lease directory the user cannot write: advice that user can follow ----------------
# Real commands as uid 65534. The capability lets that user read and search directories it
# does not own (this python may live under root's 0700 home), never write, so every write
# check below is the user's own.
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def _as_nobody_why_not() -> str | None:
    if os.geteuid() != 0:
        return "running a command as another uid needs root"
    probe = subprocess.run([*AS_NOBODY, PY, "-c", "import smartlaunch"], capture_output=True,
                           text=True)
    return None if probe.returncode == 0 else f"setpriv cannot run python as uid {NOBODY} " \
        f"here: {probe.stderr.strip()[-200:]}"


_WHY_NOT_NOBODY = _as_nobody_why_not()
needs_nobody = pytest.mark.skipif(_WHY_NOT_NOBODY is not None, reason=_WHY_NOT_NOBODY or "")


@pytest.fixture
def nobody_dir(clean_env):
    """A directory uid 65534 can reach without its capability: access(2), which the checks
    use, ignores capabilities for a non-root user, and pytest's tmp_path lies in a 0700 dir."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="smartlaunch-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


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
