"""smartlaunch.sandbox's pure parts on literal input, and `require` without isolation."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest

from smartlaunch import sandbox
from smartlaunch.policy.api import DryRunPolicy, Policy
from smartlaunch.profile.api import ProfileStatus
from smartlaunch.profile.runner import run_dry_run
from smartlaunch.request import Request

MOUNTINFO = """\
22 1 0:21 / /proc rw,nosuid - proc proc rw
23 1 0:22 / /sys rw - sysfs sysfs rw
24 1 0:5 / /dev rw - devtmpfs udev rw
25 24 0:23 / /dev/shm rw - tmpfs tmpfs rw
1 0 252:1 / / rw,relatime - ext4 /dev/vda1 rw
40 1 0:40 / /scratch rw - nfs4 server:/scratch rw
41 40 0:41 / /scratch/ro\\040data ro - nfs4 server:/data ro
42 1 0:42 / /home rw - xfs /dev/vdb rw
43 1 0:43 / /mnt/tools ro - squashfs /dev/loop0 ro
"""


def test_targets_are_writable_mounts_and_top_level_dirs_never_proc_dev_sys_run(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(os.path, "isdir", lambda p: True)
    monkeypatch.setattr(os.path, "islink", lambda p: p == "/lib")
    got = sandbox.overlay_targets(MOUNTINFO, ["home", "tmp", "proc", "dev", "run", "lib",
                                              "etc", "scratch", "mnt"])
    # /home and /scratch are mounts of their own; the read-only ones are skipped; /lib is a link
    assert got == ["/etc", "/home", "/mnt", "/scratch", "/tmp"]


def test_a_directory_owned_by_another_id_is_named(tmp_path):
    job = tmp_path / "project" / "run"
    job.mkdir(parents=True)
    os.chown(tmp_path / "project", 4321, 4321)
    st = os.stat(tmp_path)
    bad = sandbox.unmapped_dirs([str(job)], [str(tmp_path)], st.st_uid, st.st_gid)
    assert bad == [str(tmp_path / "project")]
    assert sandbox.unmapped_dirs([str(job)], [str(job)], st.st_uid, st.st_gid) == []


def test_require_without_isolation_runs_no_dry_run_and_says_why(clean_env, monkeypatch, shared_dir):
    monkeypatch.setattr(sandbox, "unavailable", lambda paths=(): "unshare: Operation not permitted")
    script = clean_env / "touch.py"
    script.write_text(f"open({str(shared_dir / 'ran')!r}, 'w').close()\n")
    prof = run_dry_run(Request(script=str(script)), Policy(), gpu=None, environ=dict(os.environ))
    assert prof.status == ProfileStatus.SKIPPED
    assert "cannot be isolated here (unshare: Operation not permitted)" in prof.note
    assert "dryrun.isolation=require" in prof.note
    assert not (shared_dir / "ran").exists()
    # best-effort: run anyway, then delete what it created where we looked; name the rest
    (clean_env / "kept.txt").write_text("mine\n")
    script.write_text(f"open({str(shared_dir / 'ran')!r}, 'w').close()\n"
                      "import os; os.makedirs('lightning_logs/version_0')\n"
                      "open('kept.txt', 'a').write('changed\\n')\n")
    best = Policy(dryrun=DryRunPolicy(isolation="best-effort"))
    prof = run_dry_run(Request(script=str(script)), best, gpu=None, environ=dict(os.environ))
    assert (shared_dir / "ran").exists() and "not isolated" in prof.note
    assert not (clean_env / "lightning_logs").exists()
    assert "removed the 2 files and directories it created" in prof.note
    assert "cannot be restored: " + str(clean_env / "kept.txt") in prof.note


# A container runtime bind-mounts the driver's libcuda.so.1 (read-only) as a file below /usr;
# an overlay over /usr shows /usr's own filesystem without mounts on it. Set up in a private
# mount namespace of its own, so the machine's mounts are never touched.
MOUNTED_BELOW = r'''
import ctypes, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x00020000) == 0, "unshare"
assert libc.mount(b"none", b"/", None, (1 << 14) | (1 << 18), None) == 0, "private"
src, spot, ro = sys.argv[1:4]
assert libc.mount(src.encode(), spot.encode(), None, 4096, None) == 0, "bind"
assert libc.mount(b"none", spot.encode(), None, 4096 | 32 | 1, None) == 0, "remount ro"
cmd = [sys.executable, "-m", "smartlaunch.sandbox", "--scratch", sys.argv[4], "--",
       sys.executable, "-c",
       "import sys; spot, ro = sys.argv[1:3]; print(open(spot).read());"
       "open(ro + '/new.txt', 'w').write('x'); print('wrote below', ro)", spot, ro]
sys.exit(subprocess.run(cmd).returncode)
'''


def test_a_read_only_mount_below_an_overlay_is_still_there(tmp_path, shared_dir):
    import subprocess
    import sys
    why = sandbox.unavailable()
    assert why is None or os.getuid() != 0, why      # root here: isolation must work
    if why is not None:
        import pytest
        pytest.skip(f"isolation unavailable for uid {os.getuid()}: {why}")
    lib = shared_dir / "libfake-driver.so.1"
    lib.write_text("driver code\n")
    spot = tmp_path / "usr-lib" / "libcuda.so.1"       # tmp_path lies below a covered dir
    spot.parent.mkdir()
    spot.write_text("")                                 # the runtime's empty placeholder
    r = subprocess.run([sys.executable, "-c", MOUNTED_BELOW, str(lib), str(spot),
                        str(tmp_path), str(shared_dir / "scratch")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("driver code"), r.stdout + r.stderr
    assert not (tmp_path / "new.txt").exists()          # the directory itself stays covered
    assert spot.read_text() == ""                       # nothing leaked into the real tree


# A writable mount that is not a directory tree of its own (a container's /etc/hosts, a FUSE
# home) cannot be covered; bound back, it must be read-only, and a writable filesystem mounted
# below a restored one must still be covered.
NESTED = r'''
import ctypes, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x00020000) == 0, "unshare"
assert libc.mount(b"none", b"/", None, (1 << 14) | (1 << 18), None) == 0, "private"
hosts_src, hosts, data_src, data, scratch = sys.argv[1:6]
assert libc.mount(hosts_src.encode(), hosts.encode(), None, 4096, None) == 0, "bind hosts (rw)"
assert libc.mount(data_src.encode(), data.encode(), None, 4096, None) == 0, "bind data"
assert libc.mount(b"none", data.encode(), None, 4096 | 32 | 1, None) == 0, "data ro"
assert libc.mount(b"tmpfs", (data + "/scratch").encode(), b"tmpfs", 0, None) == 0, "tmpfs"
probe = ("import sys\nhosts, data = sys.argv[1:3]\n"
         "for p in (hosts, data + '/scratch/ckpt.pt'):\n"
         "    try:\n        open(p, 'a').write('x'); print('wrote', p)\n"
         "    except OSError as e:\n        print('refused', p, e.errno)\n")
r = subprocess.run([sys.executable, "-m", "smartlaunch.sandbox", "--scratch", scratch, "--",
                    sys.executable, "-c", probe, hosts, data], capture_output=True, text=True)
print(r.stdout + r.stderr)
print("real hosts:", open(hosts).read().strip())
print("real scratch:", sorted(os.listdir(data + "/scratch")))
'''


def test_restored_mounts_are_read_only_and_covered_below(tmp_path, shared_dir):
    import subprocess
    import sys
    if sandbox.unavailable() is not None and os.getuid() != 0:
        import pytest
        pytest.skip("isolation unavailable for this uid")
    hosts_src = shared_dir / "hosts"
    hosts_src.write_text("127.0.0.1 localhost\n")
    hosts = tmp_path / "etc-hosts"
    hosts.write_text("")
    data_src = shared_dir / "dataset"
    (data_src / "scratch").mkdir(parents=True)
    data = tmp_path / "data"
    data.mkdir()
    r = subprocess.run([sys.executable, "-c", NESTED, str(hosts_src), str(hosts), str(data_src),
                        str(data), str(shared_dir / "scratch")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"refused {hosts} 30" in r.stdout, r.stdout          # EROFS: shared, read-only
    assert f"wrote {data}/scratch/ckpt.pt" in r.stdout, r.stdout  # the overlay took it
    assert "real hosts: 127.0.0.1 localhost" in r.stdout and "real scratch: []" in r.stdout, r.stdout


# ---- torch.compile's cache, shared through the sandbox --------------------------------------
def test_compile_caches_are_only_existing_private_directories_of_ours(tmp_path):
    ours = tmp_path / "inductor"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(ours)}
    assert sandbox.compile_caches(env) == []                 # not there: never made
    assert not ours.exists()
    ours.mkdir(mode=0o755)
    assert sandbox.compile_caches(env) == [str(ours)]
    triton = tmp_path / "triton"
    triton.mkdir(mode=0o700)
    assert sandbox.compile_caches({**env, "TRITON_CACHE_DIR": str(triton)}) == [str(ours),
                                                                              str(triton)]
    os.chmod(ours, 0o775)                                    # a group may write it: not shared
    assert sandbox.compile_caches(env) == []
    os.chmod(ours, 0o700)
    link = tmp_path / "link"
    link.symlink_to(ours)
    assert sandbox.compile_caches({"TORCHINDUCTOR_CACHE_DIR": str(link)}) == []
    if os.geteuid() == 0:
        os.chown(ours, 65534, 65534)                         # another user's: not shared
        assert sandbox.compile_caches(env) == []


def test_an_absent_inductor_cache_is_made_private_and_nothing_there_is_followed(tmp_path):
    env = {"TMPDIR": str(tmp_path), "USER": "u"}
    made_here = tmp_path / "torchinductor_u"
    made: list[str] = []
    assert sandbox.compile_caches(env, made.append) == [str(made_here)]
    assert made == [str(made_here)]
    assert made_here.is_dir() and stat.S_IMODE(made_here.stat().st_mode) == 0o700
    assert sandbox.compile_caches(env, made.append) == [str(made_here)]   # there: as it is
    assert made == [str(made_here)]
    # a link where the cache would be: not followed, its target not made, nothing shared
    target = tmp_path / "elsewhere"
    (tmp_path / "planted").symlink_to(target)
    assert sandbox.compile_caches({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "planted")},
                                  made.append) == []
    assert not target.exists() and made == [str(made_here)]
    # no parent to hold it: nothing made above it
    deep = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "no" / "such" / "cache")}
    assert sandbox.compile_caches(deep, made.append) == []
    assert not (tmp_path / "no").exists()
    if os.geteuid() == 0:                       # another user's, made before ours: not shared
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
        assert sandbox.compile_caches({"TORCHINDUCTOR_CACHE_DIR": str(theirs)},
                                      made.append) == []


def test_a_made_cache_nothing_was_compiled_into_goes_with_the_session(tmp_path):
    from smartlaunch.profile.session import Session
    empty, used = tmp_path / "empty", tmp_path / "used"
    with Session() as s:
        for d in (empty, used):
            env = {"TORCHINDUCTOR_CACHE_DIR": str(d)}
            assert sandbox.compile_caches(env, s.made_cache) == [str(d)]
        (used / "fxgraph").mkdir()
    assert not empty.exists()
    assert (used / "fxgraph").is_dir()
    kept = tmp_path / "kept"
    kept.mkdir(mode=0o700)                      # there before: never removed, even empty
    with Session() as s:
        sandbox.compile_caches({"TORCHINDUCTOR_CACHE_DIR": str(kept)}, s.made_cache)
    assert kept.is_dir()


def test_when_smartlaunch_dies_first_a_made_cache_goes_only_if_nothing_was_compiled_into_it(tmp_path):
    """Torch's default cache is shared by every job of the user: what another compiled into it
    (or the dry run did) is not the guard's to remove."""
    empty, used = tmp_path / "empty", tmp_path / "used"
    code = f"""
import os
from smartlaunch import proc, sandbox
from smartlaunch.profile.session import Session
s = Session()
for d in ({str(empty)!r}, {str(used)!r}):
    sandbox.compile_caches({{"TORCHINDUCTOR_CACHE_DIR": d}}, s.made_cache)
open(os.path.join({str(used)!r}, "graph"), "w").close()
print("guard", proc.guard().proc.pid, flush=True)
os.kill(os.getpid(), 9)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == -9 and "guard" in r.stdout, r.stderr
    from smartlaunch.proc import proc_state
    guard = int(r.stdout.split()[1])
    deadline = time.monotonic() + 30            # the guard sees its pipe close, acts, exits
    while proc_state(guard).alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not proc_state(guard).alive
    assert not empty.exists()
    assert (used / "graph").exists()


def test_the_default_is_torchs_own_for_this_user(tmp_path):
    env = {"TMPDIR": str(tmp_path), "USER": "a/b"}
    assert sandbox._inductor_default(env) == str(tmp_path / "torchinductor_a_b")
    (tmp_path / "torchinductor_a_b").mkdir(mode=0o700)
    assert sandbox.compile_caches(env) == [str(tmp_path / "torchinductor_a_b")]


COMPILED = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = torch.compile(model)
for _ in range(40):
    step(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_isolated_dry_run_fills_the_compile_cache_making_it_when_absent(clean_env):
    """What the dry run compiled is in the user's inductor cache afterwards (the launch then
    finds it), whether the cache was there before or not."""
    script = clean_env / "compiled.py"
    script.write_text(COMPILED)
    cache = clean_env / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    policy = Policy(dryrun=DryRunPolicy(warmup_steps=2, measure_steps=5, measure_seconds=0.0))
    assert not cache.exists()
    prof = run_dry_run(Request(script=str(script)), policy, gpu=None, environ=env)
    assert prof.status == ProfileStatus.OK, prof.note
    assert any((cache / "fxgraph").rglob("*")), sorted(p.name for p in cache.iterdir())
