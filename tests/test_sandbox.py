"""smartlaunch.sandbox's pure parts on literal input, and `require` without isolation."""
from __future__ import annotations

import os

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
