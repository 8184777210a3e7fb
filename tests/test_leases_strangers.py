"""Lease records and locks made by another account, for real: uid 65534 (`nobody`) plants
and locks, the victim is root or uid 4242 running `smartlaunch --strategy single` on a fake
topology. Whatever the stranger does, the launch goes on (one line naming each record it
ignores), never takes a GPU that another user's live lease holds, and waits for no lock a
stranger can take."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers_jobs import LEASE_HOLDER, PY, fake_topology, python_env, write_topology
from helpers_nobody import (HOLD_UNTIL_STDIN, NOBODY, VICTIM, as_nobody, as_user, needs_nobody,
                            needs_victim, shared_lease_dir)
from smartlaunch.launch.leases import LeaseManager

_PLANT = """
import fcntl, json, os, struct, sys
d, uuid, alive, unreadable = sys.argv[1], sys.argv[2], sys.argv[3] == "alive", sys.argv[4] == "1"
me, held = os.getpid(), []

def good(**over):
    return json.dumps({"pid": me, "create_time": 1.0, "uid": os.geteuid(), "user": "root",
                       "host": "h", "slurm_job_id": None, "time": 0.0, "gpu_uuid": uuid,
                       **over}).encode()

def name(tag, kind):
    return f"gpu-{uuid}.{me}.{tag}.holder" if kind == "holder" else f"queue.{me}.{tag}.waiter"

def record(tag, data, kind="holder", mode=0o644):
    fd = os.open(os.path.join(d, name(tag, kind)), os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    os.write(fd, data)
    if alive:       # held as a live lease is held: an OFD write lock, for as long as we run
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi0q", fcntl.F_WRLCK, 0, 0, 0, 0))
        held.append(fd)
    else:
        os.close(fd)
    print(name(tag, kind))

record("a1", good(pid="1"))
record("a2", good(pid=-5))
record("a3", good(pid=1.5))
record("a4", good(create_time="x"))
record("a5", b"[1, 2]")
record("a6", b" " * (1 << 20))
record("a7", good(uid=0))                       # speaks for root
record("a8", good(gpu_uuid="GPU-another"))      # another GPU's record under this one's name
record("b1", good(pid="1", gpu_uuid="queue:0,1"), kind="waiter")
os.mkfifo(os.path.join(d, name("c1", "holder")))
print(name("c1", "holder"))
os.symlink("/etc/passwd", os.path.join(d, name("c2", "holder")))
print(name("c2", "holder"))
os.mkdir(os.path.join(d, name("c3", "holder")))
print(name("c3", "holder"))
if unreadable:                                  # a lease others cannot read (umask 077)
    record("c4", good(), mode=0o600)
print("planted", flush=True)
if alive:
    sys.stdin.read()
"""

_SAYS = {"a1": "field pid is not a positive integer", "a2": "field pid is not a positive integer",
         "a3": "field pid is not a positive integer",
         "a4": "field create_time is not a finite number >= 0",
         "a5": "it is a JSON list, not an object",
         "a6": "it is 1048576 bytes, more than a record's 65536",
         "a7": f"field uid is not the file's owner (uid {NOBODY})",
         "a8": "its fields gpu_uuid and pid do not match its name",
         "b1": "field pid is not a positive integer", "c1": "it is a FIFO, not a regular file",
         "c2": "it is a symlink", "c3": "it is a directory, not a regular file",
         "c4": "it cannot be read (Permission denied)"}


def _setup(d: Path, victim: int) -> tuple[str, dict]:
    """A shared lease dir (root's, 1777) in `d`, the victim's home and work dir, a 2-GPU fake
    topology; (lease dir, the victim's environment)."""
    for sub in ("home", "work"):
        (d / sub).mkdir()
        os.chown(d / sub, victim, victim)
    (d / "work" / "t.py").write_text("import os\nprint('ran on', os.environ.get("
                                     "'CUDA_VISIBLE_DEVICES'))\n")
    lease_dir = shared_lease_dir(str(d / "leases"))
    topo = write_topology(d / "topo.json", fake_topology(2))
    os.chmod(topo, 0o644)
    env = {**python_env(), "HOME": str(d / "home"), "XDG_CACHE_HOME": str(d / "home" / ".cache"),
           "SMARTLAUNCH_LEASE_DIR": lease_dir, "SMARTLAUNCH_FAKE_TOPOLOGY": topo}
    return lease_dir, env


def _plant(lease_dir: str, alive: bool, unreadable: bool) -> tuple[subprocess.Popen, list[str]]:
    p = as_nobody(_PLANT, lease_dir, fake_topology(1).gpu(0).uuid, "alive" if alive else "exit",
                  "1" if unreadable else "0", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    names = []
    for line in p.stdout:
        if line.strip() == "planted":
            break
        names.append(line.strip())
    assert names and names[-1].split(".")[-2] == ("c4" if unreadable else "c3"), names
    if not alive:
        assert p.wait(timeout=30) == 0
    return p, names


def _victim_argv(victim: int, *args: str) -> list[str]:
    """The victim's `smartlaunch --strategy single t.py`; another uid's with the capability
    to read what it does not own (its launch runs this checkout's python, wherever it is)."""
    argv = [PY, "-m", "smartlaunch.cli", *args, "--strategy", "single", "t.py"]
    return argv if victim == 0 else [*as_user(victim), *argv]


def _hold_both(env: dict, umask: int = 0o022):
    """Both GPUs leased by this process (as root, its records made under `umask`), taken
    before anything is planted: our own scan would name (and, as root, remove) it."""
    old = os.umask(umask)
    try:
        with LeaseManager(env["SMARTLAUNCH_LEASE_DIR"]) as mgr:
            return mgr.acquire(fake_topology(2), [0, 1], 2, wait=False, timeout_s=0)
    finally:
        os.umask(old)


def _launch_then_release(lease, env: dict, d: Path, victim: int):
    """Start the victim's launch, give `lease` back once it says it waits; (exit code,
    stdout, stderr lines)."""
    proc = subprocess.Popen(_victim_argv(victim), cwd=d / "work", env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "waiting for" in line:       # it has read the queue: the GPUs may go
                break
    finally:
        lease.release()
    out, rest = proc.communicate(timeout=120)
    return proc.returncode, out, lines + rest.splitlines()


def _assert_each_named_once(lines: list[str], names: list[str], lease_dir: str) -> None:
    for n in names:
        mine = [x for x in lines if f" lease record {n} in " in x]
        assert mine == [f"smartlaunch: ignoring lease record {n} in {lease_dir} (owner uid "
                        f"{NOBODY}): {_SAYS[n.split('.')[-2]]}; it leases nothing"], (n, lines)
    assert not [x for x in lines if "Traceback" in x or "Error" in x], lines


@needs_nobody
@pytest.mark.timeout(180)
@pytest.mark.parametrize("alive", [True, False], ids=["planter-alive", "planter-gone"])
def test_records_that_do_not_parse_are_named_once_and_the_launch_goes_on(nobody_dir, alive):
    """The reviewer's crash: root's launch met a record with pid "1" (and the rest) and ended
    in a TypeError. Now each is one line, the launch waits for our lease as it should (so the
    forged waiter is read), then runs, exit 0; stale ones root may remove are removed."""
    lease_dir, env = _setup(nobody_dir, 0)
    lease = _hold_both(env)
    planter, names = _plant(lease_dir, alive, unreadable=False)
    try:
        code, out, lines = _launch_then_release(lease, env, nobody_dir, 0)
    finally:
        planter.stdin.close()
        planter.wait(timeout=30)
    assert code == 0 and "ran on" in out, "\n".join([str(code), *lines])
    assert any("waiting for 1 GPU(s)" in x and f"leased by pid {os.getpid()} (user root)" in x
               for x in lines), lines
    _assert_each_named_once(lines, names, lease_dir)
    regular = {n for n in names if n.split(".")[-2] in ("a1", "a2", "a3", "a4", "a5", "a6", "a7",
                                                        "a8", "b1")}
    left = set(os.listdir(lease_dir))
    # root removes what nobody holds; a live one stays its owner's
    assert (left & regular) == (regular if alive else set()), left
    assert left - regular == set(names) - regular           # FIFO, symlink, directory: untouched


@needs_nobody
@pytest.mark.timeout(180)
def test_another_users_launch_names_them_too_and_removes_nothing(nobody_dir):
    """uid 4242 (with a capability to read what it does not own, so its launch can run this
    checkout's python) may remove nothing of nobody's: it names each record once and goes on."""
    lease_dir, env = _setup(nobody_dir, VICTIM)
    lease = _hold_both(env)
    planter, names = _plant(lease_dir, alive=False, unreadable=False)
    code, out, lines = _launch_then_release(lease, env, nobody_dir, VICTIM)
    assert code == 0 and "ran on" in out, "\n".join([str(code), *lines])
    assert any("waiting for 1 GPU(s)" in x and f"leased by pid {os.getpid()} (user root)" in x
               for x in lines), lines
    _assert_each_named_once(lines, names, lease_dir)
    assert set(os.listdir(lease_dir)) == set(names)


_WHY_TAKEN = """
import json, sys
from smartlaunch.launch.leases import LeaseManager
from smartlaunch.topology.api import Topology
topo = Topology.from_dict(json.load(open(sys.argv[2])))
said = []
for _ in range(2):
    with LeaseManager(sys.argv[1], say=said.append) as m:
        why = m.why_taken(topo)
print(json.dumps({"why": why, "said": said}))
"""


@needs_victim
@pytest.mark.timeout(120)
def test_a_record_a_user_cannot_read_is_named_and_a_lease_made_under_umask_077_is_not_one(
        nobody_dir):
    """uid 4242 without any capability: nobody's 0600 record is one line and leases nothing;
    ours, made under umask 077, is 0644 all the same, so 4242 sees both GPUs leased (it would
    have leased them too, had our records been unreadable)."""
    lease_dir, env = _setup(nobody_dir, VICTIM)
    lease = _hold_both(env, umask=0o077)
    planter, names = _plant(lease_dir, alive=True, unreadable=True)
    try:
        r = subprocess.run([*as_user(VICTIM, read_all=False), PY, "-c", _WHY_TAKEN, lease_dir,
                            env["SMARTLAUNCH_FAKE_TOPOLOGY"]], env=env, cwd=nobody_dir / "work",
                           capture_output=True, text=True, timeout=60)
    finally:
        lease.release()
        planter.stdin.close()
        planter.wait(timeout=30)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    ours = f"leased by pid {os.getpid()} (user root)"
    assert got["why"] == {"0": ours, "1": ours}
    holders = [n for n in names if n.endswith(".holder")]  # why_taken reads no queue
    _assert_each_named_once(["smartlaunch: " + x for x in got["said"]], holders, lease_dir)
    assert len(got["said"]) == len(holders)


_FLOCK_DIR = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX if sys.argv[2] == "-x" else fcntl.LOCK_SH)
print("locked", flush=True)
sys.stdin.read()
"""


@needs_nobody
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["-x", "-s"])
def test_another_users_flock_on_the_lease_dir_blocks_nothing(nobody_dir, how):
    """Claims take no lock a stranger can hold: --no-wait gets a free GPU at once."""
    lease_dir, env = _setup(nobody_dir, 0)
    p = as_nobody(_FLOCK_DIR, lease_dir, how, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with LeaseManager(lease_dir).acquire(fake_topology(2), [0], 1, wait=False, timeout_s=0):
            assert time.monotonic() - t0 < 1.0
        r = subprocess.run(_victim_argv(0, "--no-wait"), cwd=nobody_dir / "work", env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "ran on GPU-fake-0000-aaaa" in r.stdout, r.stderr
        assert p.poll() is None             # and it held its lock all along
    finally:
        p.stdin.close()
        p.wait(timeout=30)


_HIDEPID = """
mount -t proc -o hidepid=2 proc /proc || exit 97
"$@" test -e /proc/$HOLDER && exit 98
exec "$@" "$PY" -m smartlaunch.cli --no-wait --strategy single t.py
"""


@needs_victim
@pytest.mark.timeout(120)
def test_another_users_live_lease_counts_where_proc_hides_its_process(nobody_dir):
    """/proc mounted hidepid=2: uid 4242 cannot see nobody's process, whose lease (its
    record's lock) still holds both GPUs: --no-wait refuses, naming the holder; nothing is
    leased twice."""
    lease_dir, env = _setup(nobody_dir, VICTIM)
    holder = as_nobody(HOLD_UNTIL_STDIN, env["SMARTLAUNCH_FAKE_TOPOLOGY"], "-", "0,1",
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert holder.stdout.readline().strip() == "0,1"
        before = sorted(os.listdir(lease_dir))
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _HIDEPID,
                            "sh", *as_user(VICTIM, read_all=False)], cwd=nobody_dir / "work",
                           env={**env, "HOLDER": str(holder.pid), "PY": PY}, capture_output=True,
                           text=True, timeout=120)
        if r.returncode == 97:
            pytest.skip(f"cannot mount /proc with hidepid=2 here: {r.stderr.strip()[-200:]}")
        assert r.returncode != 98, "hidepid=2 did not hide another user's process"
        lines = [x for x in r.stderr.splitlines() if "smartlaunch" in x]
        assert r.returncode == 6 and len(lines) == 1, (r.returncode, r.stderr)
        assert f"GPUs 0,1 are leased by pid {holder.pid} (user nobody)" in lines[0], lines
        assert sorted(os.listdir(lease_dir)) == before      # no record of the victim's left
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


_LOCK_THEIRS = """
import errno, fcntl, os, struct, sys
path = sys.argv[1]
try:
    os.open(path, os.O_RDWR)
    print("opened for writing", flush=True)
except PermissionError:
    pass
fd = os.open(path, os.O_RDONLY)
try:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi0q", fcntl.F_WRLCK, 0, 0, 0, 0))
    print("write-locked", flush=True)
except OSError as exc:
    assert exc.errno == errno.EBADF, exc
fcntl.flock(fd, fcntl.LOCK_EX)
print("flocked", flush=True)
sys.stdin.readline()                  # its holder is dead now: take what a reader can
fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi0q", fcntl.F_RDLCK, 0, 0, 0, 0))
fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi0q", fcntl.F_RDLCK, 0, 0, 0, 0))
print("read-locked", flush=True)
sys.stdin.read()
"""


@needs_nobody
@pytest.mark.timeout(120)
def test_a_strangers_locks_on_a_dead_launchs_record_do_not_keep_it_alive(clean_env):
    """nobody cannot write-lock root's record (it cannot open it for writing); the flock and
    read locks it can take on it keep nothing alive once root's launch is SIGKILLed."""
    topo = fake_topology(1)
    lease_dir = shared_lease_dir(os.environ["SMARTLAUNCH_LEASE_DIR"])
    topo_path = write_topology(clean_env / "topo.json", topo)
    ready = clean_env / "ready"
    victim = subprocess.Popen([PY, "-c", LEASE_HOLDER, topo_path, str(ready), "0"],
                              env=python_env())
    stranger = None
    try:
        from helpers_common import wait_until
        wait_until(ready.exists, 30, "the victim's lease")
        (record,) = os.listdir(lease_dir)
        stranger = as_nobody(_LOCK_THEIRS, os.path.join(lease_dir, record),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert stranger.stdout.readline().strip() == "flocked"      # nothing else before it
        mgr = LeaseManager(lease_dir)
        assert mgr.taken(topo) == {0}
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        stranger.stdin.write("go\n")
        stranger.stdin.flush()
        assert stranger.stdout.readline().strip() == "read-locked"
        assert mgr.taken(topo) == set()
        with mgr.acquire(topo, [0], 1, wait=False, timeout_s=0) as lease:
            assert lease.gpus == (0,)
    finally:
        victim.kill()
        victim.wait()
        if stranger is not None:
            stranger.stdin.close()
            stranger.wait(timeout=30)
