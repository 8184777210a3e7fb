"""Files smartlaunch writes: run directories with unpredictable names in a log directory that
must be ours or root's (sticky if shared), and nothing written through a planted link."""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from helpers_common import REPO, own_lines
from helpers_nobody import NOBODY, needs_root, shared_tmp
from smartlaunch.store import mapped_record

TINY = str(REPO / "tests" / "scripts" / "tiny_train.py")
RUN_DIR_NAME = re.compile(r"\d{8}-\d{6}-[a-z0-9_]{8}")     # <time>-<mkdtemp's random part>


@pytest.fixture
def shared(clean_env):
    d = shared_tmp()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _launch(cwd, log_dir, script="job.py", *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--strategy", "single",
                           script, *args], cwd=cwd,
                          env={**os.environ, "SMARTLAUNCH_LOG_DIR": str(log_dir)},
                          capture_output=True, text=True, timeout=180)


def _job(d):
    (d / "job.py").write_text("print('job ran')\n")


# ---- the log directory and the run directories in it ---------------------------------------

def test_run_dirs_in_a_shared_log_dir_are_private_and_unpredictable(clean_env, shared):
    _job(clean_env)
    for _ in range(2):
        r = _launch(clean_env, shared)
        assert r.returncode == 0 and "job ran" in r.stdout, r.stderr
    runs = sorted(os.listdir(shared))
    assert len(runs) == 2 and all(RUN_DIR_NAME.fullmatch(n) for n in runs), runs
    for name in runs:
        st = os.lstat(shared / name)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert st.st_uid == os.geteuid()


def test_a_missing_log_dir_is_created_private(clean_env):
    _job(clean_env)
    logs = clean_env / "new" / "logs"
    r = _launch(clean_env, logs)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.lstat(logs).st_mode) == 0o700 and len(os.listdir(logs)) == 1


@needs_root
def test_a_log_dir_of_another_user_is_refused_in_one_line(clean_env, shared):
    _job(clean_env)
    theirs = shared / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    r = _launch(clean_env, theirs)
    assert r.returncode == 3 and "job ran" not in r.stdout
    assert own_lines(r.stderr) == [
        f"smartlaunch: error: launch.log_dir={theirs} (env:SMARTLAUNCH_LOG_DIR): {theirs} is "
        f"owned by uid {NOBODY} (nobody), not by you or root: another user could read or replace "
        f"what the launch writes there; refusing it. Fix: set launch.log_dir to a directory you "
        f"own"]
    assert os.listdir(theirs) == []


def test_a_log_dir_others_may_write_without_the_sticky_bit_is_refused(clean_env):
    _job(clean_env)
    loose = clean_env / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    r = _launch(clean_env, loose)
    assert r.returncode == 3 and own_lines(r.stderr) == [
        f"smartlaunch: error: launch.log_dir={loose} (env:SMARTLAUNCH_LOG_DIR): {loose} is "
        f"group/world-writable (mode 0777) without the sticky bit: another user could read or "
        f"replace what the launch writes there; refusing it. Fix: set launch.log_dir to a "
        f"directory you own"]
    loose.chmod(0o1777)
    assert _launch(clean_env, loose).returncode == 0


def test_a_log_dir_that_is_a_link_is_refused(clean_env):
    _job(clean_env)
    (clean_env / "real").mkdir(mode=0o700)
    link = clean_env / "link"
    link.symlink_to(clean_env / "real")
    r = _launch(clean_env, link)
    assert r.returncode == 3 and own_lines(r.stderr) == [
        f"smartlaunch: error: launch.log_dir={link} (env:SMARTLAUNCH_LOG_DIR): {link} is a "
        f"symbolic link: smartlaunch follows no link to a directory it writes in, as another "
        f"user could swap it; refusing it. Fix: set launch.log_dir to the directory it points "
        f"to ({clean_env / 'real'})"]
    assert os.listdir(clean_env / "real") == []


# ---- files made by name: never through a link ----------------------------------------------

def _plant_links(run_dir, victim) -> list:
    """As the old predictable `<time>-<pid>` run directory allowed: another user's directory
    with links, owned by that user, where the worker hook writes its files."""
    names = ["progress/local0.bin", "progress/work0.bin", "stacks/local0.txt",
             "logs/0/stdout.log"]
    for name in names:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).symlink_to(victim)
        os.lchown(run_dir / name, NOBODY, NOBODY)
    for d in {run_dir, *((run_dir / n).parent for n in names), run_dir / "logs"}:
        os.chown(d, NOBODY, NOBODY)
    return names


@needs_root
def test_planted_links_where_the_worker_hook_writes_are_not_followed(clean_env):
    victim = clean_env / "victim"
    victim.write_text("precious\n")
    before = os.stat(victim)
    run_dir = clean_env / "run"
    run_dir.mkdir()
    _plant_links(run_dir, victim)
    env = {**os.environ, "SMARTLAUNCH_RUN_DIR": str(run_dir), "LOCAL_RANK": "0", "RANK": "0",
           "LOCAL_WORLD_SIZE": "2", "SMARTLAUNCH_TEE_DIR": str(run_dir / "logs")}
    r = subprocess.run([sys.executable, "-m", "smartlaunch.launch.worker", TINY, "--epochs", "1"],
                       cwd=clean_env, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "finished" in r.stdout, r.stderr
    after = os.stat(victim)
    assert victim.read_text() == "precious\n"
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    # The step records are the hook's own new files (the links removed, not followed); the
    # append-only files behind a link are not kept, each said once, and the job ran.
    for name in ("progress/local0.bin", "progress/work0.bin"):
        st = os.lstat(run_dir / name)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid(), name
    said = [line for line in own_lines(r.stderr) if line.startswith("smartlaunch:")]
    assert said == [
        f"smartlaunch: stdout of this rank not kept in {run_dir}/logs/0/stdout.log (Too many "
        f"levels of symbolic links); the job goes on",
        f"smartlaunch: no stack dumps for this rank: cannot open {run_dir}/stacks/local0.txt "
        f"(Too many levels of symbolic links); the job goes on"]


def test_mapped_record_replaces_what_is_at_its_name_and_never_truncates_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * 100)
    path = tmp_path / "rec" / "local0.bin"
    path.parent.mkdir()
    path.symlink_to(victim)
    mm = mapped_record(path, 16)
    mm[:4] = b"SLP1"
    mm.close()
    assert victim.read_bytes() == b"x" * 100
    assert not path.is_symlink() and path.read_bytes()[:4] == b"SLP1"
    hard = tmp_path / "rec" / "work0.bin"
    os.link(victim, hard)                    # a hard link: unlinked too, the victim kept
    mapped_record(hard, 8).close()
    assert victim.read_bytes() == b"x" * 100 and os.stat(hard).st_size == 8


@pytest.mark.parametrize("local_world, timed", [("1", False), ("2", True)])
def test_the_work_timer_runs_only_where_the_node_has_ranks_to_compare(clean_env, local_world,
                                                                       timed):
    # Its one reader, the straggler warning, compares the node's ranks: a one-rank job (every
    # single-GPU launch) runs no gradient or timing hook it cannot use. The step counter stays:
    # the summary's rate and the measured launch read it.
    run_dir = clean_env / "run"
    env = {**os.environ, "SMARTLAUNCH_RUN_DIR": str(run_dir), "LOCAL_RANK": "0", "RANK": "0",
           "LOCAL_WORLD_SIZE": local_world}
    r = subprocess.run([sys.executable, "-m", "smartlaunch.launch.worker", TINY, "--epochs", "1"],
                       cwd=clean_env, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "finished" in r.stdout, r.stderr
    assert (run_dir / "progress" / "local0.bin").is_file()
    assert (run_dir / "progress" / "work0.bin").is_file() == timed


CHATTY = """\
import sys
for i in range(8000):
    print(f"line {i} " + "x" * 120)
print("all printed", file=sys.stderr)
"""


def test_a_log_that_fills_its_disk_costs_the_log_not_the_job(clean_env):
    # A quota or a full disk under the run directory: torchrun (no --tee) runs such a job to
    # its end. The rank's output copier died on the failed write; the rank's next print then
    # raised BrokenPipeError and the job failed. RLIMIT_FSIZE makes the copier's log write
    # fail (EFBIG) as a full disk would (ENOSPC), without a mount.
    import resource
    script = clean_env / "chatty.py"
    script.write_text(CHATTY)
    run_dir = clean_env / "run"
    env = {**os.environ, "SMARTLAUNCH_RUN_DIR": str(run_dir), "LOCAL_RANK": "0", "RANK": "0",
           "SMARTLAUNCH_TEE_DIR": str(run_dir / "logs")}
    limit = 256 * 1024
    r = subprocess.run([sys.executable, "-m", "smartlaunch.launch.worker", str(script)],
                       cwd=clean_env, env=env, capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                             (limit, limit)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"line {i} " + "x" * 120 for i in range(8000)]
    log = run_dir / "logs" / "0" / "stdout.log"
    said = [line for line in own_lines(r.stderr) if line.startswith("smartlaunch:")]
    assert said == [f"smartlaunch: stdout of this rank no longer kept in {log} (File too "
                    f"large); the job goes on"]
    assert "all printed" in r.stderr and 0 < log.stat().st_size <= limit
    assert (run_dir / "logs" / "0" / "stderr.log").read_text().endswith("all printed\n")


def test_a_mapped_record_has_its_blocks_before_it_is_mapped(tmp_path):
    # A sparse record (ftruncate) gets its block at the first store into the mapping: on a full
    # disk or over a quota that store is SIGBUS, the rank killed. Written, it fails at creation
    # (OSError, which the worker hook says and goes on from).
    control = tmp_path / "control"
    control.write_bytes(bytes(64))
    if os.stat(control).st_blocks == 0:
        pytest.skip("this file system keeps small files without blocks")
    mapped_record(tmp_path / "local0.bin", 64).close()
    assert os.stat(tmp_path / "local0.bin").st_blocks > 0


def test_a_step_record_that_cannot_be_made_costs_the_count_not_the_job(clean_env):
    run_dir = clean_env / "run"
    run_dir.mkdir()
    (run_dir / "progress").write_text("not a directory")
    env = {**os.environ, "SMARTLAUNCH_RUN_DIR": str(run_dir), "LOCAL_RANK": "0", "RANK": "0",
           "LOCAL_WORLD_SIZE": "2"}
    r = subprocess.run([sys.executable, "-m", "smartlaunch.launch.worker", TINY, "--epochs", "1"],
                       cwd=clean_env, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "finished" in r.stdout, r.stderr
    said = [line for line in own_lines(r.stderr) if line.startswith("smartlaunch:")]
    assert said == [f"smartlaunch: steps of this rank not counted: cannot make "
                    f"{run_dir}/progress/local0.bin (File exists); the job goes on"]
