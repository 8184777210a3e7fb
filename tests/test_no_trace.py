"""Issue 14 with real processes on the fake 2-GPU topology: the dry run and trials leave no
trace and never outlive smartlaunch; a world-size-fixed script launches; what the script sees
(__file__, argv[0], path[0], cwd, environment) equals torchrun's."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_common import fixture_path
from smartlaunch.proc import GUARD_VAR, proc_state, process_tagged

pytestmark = pytest.mark.timeout(300)
SCRIPTS = Path(__file__).resolve().parent / "scripts"
FAKE = {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}


def smartlaunch(args, cwd, env_extra=None, timeout=200):
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", *map(str, args)], cwd=cwd,
                          env={**os.environ, **FAKE, **(env_extra or {})},
                          capture_output=True, text=True, timeout=timeout)


def torchrun(args, cwd, env_extra=None):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *map(str, args)],
                          cwd=cwd, env={**os.environ, **(env_extra or {})},
                          capture_output=True, text=True, timeout=200)


def tree(root: Path, skip=()) -> dict[str, bytes | None]:
    """Every path under root -> its bytes (None for directories)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        out[rel] = None if p.is_dir() else p.read_bytes()
    return out


def names(root: Path) -> set[str]:
    return set(tree(root))


# ---- 1. no trace --------------------------------------------------------------------------
@pytest.mark.slow
def test_explain_and_launch_leave_exactly_what_torchrun_leaves(clean_env):
    home = Path(os.environ["HOME"])
    a, b = clean_env / "a", clean_env / "b"
    for d in (a, b):
        d.mkdir()
        shutil.copy(SCRIPTS / "resume_every_step.py", d / "train.py")
    before, home_before = tree(b), tree(home)
    r = smartlaunch(["--explain=json", "--nproc-per-node", "2", "train.py", "60"], b)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["profile"]["status"] == "ok", plan["profile"]   # the script really ran
    assert tree(b) == before, "the dry run changed the job directory"
    mine = {".cache"}                         # the parent of smartlaunch's own cache dir
    assert {k: v for k, v in tree(home, skip=(".cache/smartlaunch",)).items() if k not in mine} \
        == home_before, "the dry run changed $HOME"
    assert not (home / ".cache" / "somelib").exists()

    n = plan["nproc_per_node"]
    t = torchrun(["--nproc-per-node", n, "train.py", "60"], a)
    assert t.returncode == 0, t.stderr
    r = smartlaunch(["--nproc-per-node", "2", "train.py", "60"], b)
    assert r.returncode == 0, r.stderr
    assert names(b) == names(a)
    assert (b / "runs.txt").read_text() == (a / "runs.txt").read_text() == "start 0\n"
    assert sorted(p.name for p in (b / "lightning_logs").iterdir()) == ["version_0"]


@pytest.mark.slow
def test_isolation_off_is_what_the_issue_saw(clean_env):
    # the contrast that shows the test above can fail: without isolation the dry run leaves
    # the Lightning-style log dir and a checkpoint the real run would resume from
    (clean_env / "smartlaunch.yaml").write_text("dryrun:\n  isolation: 'off'\n")
    shutil.copy(SCRIPTS / "resume_every_step.py", clean_env / "train.py")
    r = smartlaunch(["--explain", "--nproc-per-node", "2", "train.py", "60"], clean_env)
    assert r.returncode == 0, r.stderr
    assert (clean_env / "lightning_logs" / "version_0").is_dir()
    assert (clean_env / "ckpt" / "state.pt").exists()


# ---- 2. nothing outlives smartlaunch --------------------------------------------------------
def _alive(pid: int) -> bool:
    return proc_state(pid).alive


def _tagged_left(owner: int) -> list[int]:
    """Processes carrying the guard tag of smartlaunch process `owner` (tags begin with its
    pid), so that other smartlaunch runs on the machine (a parallel test run) do not count."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and process_tagged(int(p.name), f"{GUARD_VAR}={owner}-".encode()) \
                and _alive(int(p.name)):
            out.append(int(p.name))
    return out


SLOW = pytest.mark.slow


@pytest.mark.parametrize("mode,sig", [
    pytest.param("dry", signal.SIGTERM, marks=SLOW), ("dry", signal.SIGINT),
    pytest.param("dry", signal.SIGKILL, marks=SLOW),
    *(pytest.param("trial", s, marks=SLOW) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)),
    ("single", signal.SIGKILL), ("independent", signal.SIGKILL),
])
def test_a_signal_to_smartlaunch_leaves_no_process_and_no_temp_file(clean_env, shared_dir,
                                                                    mode, sig):
    phase = mode if mode in ("dry", "trial") else "run"
    tmp = clean_env / "tmp"
    tmp.mkdir()
    # trials whenever DDP×2 is predicted at 20-120% efficiency: any tiny model
    (clean_env / "smartlaunch.yaml").write_text("decision:\n  uncertainty_band: 0.5\n")
    args = {"single": ["--strategy", "single"], "independent": ["--each", "", "--each", ""]}.get(
        mode, ["--explain", "--nproc-per-node", "2", "--reprofile"])
    env = {**os.environ, **FAKE, "TMPDIR": str(tmp), "SLOW_PID_DIR": str(shared_dir),
           "SLOW_PHASE": phase}
    p = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", *args,
                          str(SCRIPTS / "slow_loader.py")], cwd=clean_env, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    deadline = time.monotonic() + 150
    # the main process and its 2 DataLoader workers (a trial: of rank 0 at least)
    while len(list(shared_dir.glob(f"{phase}-*"))) < 3:
        assert p.poll() is None, p.stderr.read().decode()
        assert time.monotonic() < deadline, "the phase never started"
        time.sleep(0.1)
    time.sleep(0.3)
    pids = [int(f.name.split("-")[1]) for f in shared_dir.iterdir()]
    os.kill(p.pid, sig)
    try:    # communicate drains stderr: a full pipe must not stall smartlaunch's exit
        _, err_raw = p.communicate(timeout=30)
    except subprocess.TimeoutExpired as e:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"smartlaunch still running 30 s after {sig.name}; its stderr so far: "
                    f"{(e.stderr or b'').decode(errors='replace')[-3000:]}")
    err = err_raw.decode(errors="replace")
    gone_by = time.monotonic() + 10.0     # a loaded machine reaps late

    def temp_left():
        # a real job's own temp files (DataLoader's pymp-*) are the job's, as under torchrun
        return list(tmp.iterdir()) if phase != "run" else list(tmp.glob("smartlaunch-*"))
    while time.monotonic() < gone_by and ([q for q in pids if _alive(q)] or _tagged_left(p.pid)
                                          or temp_left()):
        time.sleep(0.05)
    assert not [q for q in pids if _alive(q)], f"left running after {sig.name}"
    assert not _tagged_left(p.pid)
    assert not temp_left(), f"temp files left: {temp_left()}"
    if sig != signal.SIGKILL:
        assert p.returncode == 128 + sig, err[-2000:]
    if sig != signal.SIGKILL and phase != "run":
        # smartlaunch's interruption, not the script's failure: no child traceback, one line
        assert "Traceback" not in err, err[-3000:]
        stage = "the dry run" if phase == "dry" else "a trial"
        assert f"smartlaunch: interrupted ({sig.name}) during {stage}; nothing was launched" \
            in err.splitlines(), err[-2000:]


# The benchmark's ranks are smartlaunch's own module; a sitecustomize on the job's PYTHONPATH
# (the ranks run in the job's environment) holds each one as it starts, cold (`python -m`) or
# handed to a warm process (runpy), so the signal surely lands while the benchmark runs.
HOLD_COMM = """import os, runpy, sys, time
WORKER = "smartlaunch.profile.comm_worker"

def hold():
    if os.environ.get("HOLD_PID_DIR"):
        open(os.path.join(os.environ["HOLD_PID_DIR"], f"rank-{os.getpid()}"), "w").close()
        time.sleep(300)

if WORKER in sys.orig_argv:
    hold()
_run_module = runpy.run_module

def run_module(name, *args, **kw):
    if name == WORKER:
        hold()
    return _run_module(name, *args, **kw)
runpy.run_module = run_module
"""
# The early sweep (driver.Driver._start_early) starts only with cores to spare; this machine may have 2.
AS_IF_16_CORES = """import os, sys
os.sched_getaffinity = lambda pid: set(range(16))
from smartlaunch.cli import console_main
sys.argv[0] = "smartlaunch"
console_main()
"""


@pytest.mark.parametrize("mode,sig", [("cold", signal.SIGINT), ("cold", signal.SIGTERM),
                                      pytest.param("early", signal.SIGINT, marks=SLOW)])
def test_a_signal_during_the_allreduce_benchmark_says_so_and_leaves_nothing(clean_env,
                                                                          shared_dir, mode, sig):
    tmp, inject = clean_env / "tmp", clean_env / "inject"
    tmp.mkdir(), inject.mkdir()
    (inject / "sitecustomize.py").write_text(HOLD_COMM)
    shutil.copy(SCRIPTS / "tiny_train.py", clean_env / "train.py")
    path = os.pathsep.join(x for x in (str(inject), os.environ.get("PYTHONPATH")) if x)
    env = {**os.environ, **FAKE, "TMPDIR": str(tmp), "PYTHONPATH": path}
    args = ["--explain", "--nproc-per-node", "2", "train.py", "--epochs", "2"]
    if mode == "cold":      # cold ranks: no warm pool, which a many-core machine would start
        (clean_env / "smartlaunch.yaml").write_text("decision:\n  prestart: false\n")
        cmd = [sys.executable, "-m", "smartlaunch.cli", *args]
    else:                   # a cached profile: the decision waits for the early sweep
        r = smartlaunch(args, clean_env, {"PYTHONPATH": path})
        assert r.returncode == 0, r.stderr
        shutil.rmtree(clean_env / "home" / ".cache" / "smartlaunch" / "comm")   # its curve
        (inject / "as16.py").write_text(AS_IF_16_CORES)     # not beside train.py: its key
        cmd = [sys.executable, str(inject / "as16.py"), *args]
    p = subprocess.Popen(cmd, cwd=clean_env, env={**env, "HOLD_PID_DIR": str(shared_dir)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    deadline = time.monotonic() + 150
    while len(list(shared_dir.glob("rank-*"))) < 2:
        assert p.poll() is None, p.stderr.read().decode()
        assert time.monotonic() < deadline, "the benchmark never started"
        time.sleep(0.1)
    pids = [int(f.name.split("-")[1]) for f in shared_dir.iterdir()]
    time.sleep(0.3)
    os.kill(p.pid, sig)
    try:    # communicate drains stderr: a full pipe must not stall smartlaunch's exit
        _, err_raw = p.communicate(timeout=30)
    except subprocess.TimeoutExpired as e:
        # its held ranks (asleep for 300 s) must not outlive this test into the next ones
        os.killpg(p.pid, signal.SIGKILL)
        for q in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(q, signal.SIGKILL)
        p.wait()
        pytest.fail(f"smartlaunch still running 30 s after {sig.name}; its stderr so far: "
                    f"{(e.stderr or b'').decode(errors='replace')[-3000:]}")
    err = err_raw.decode(errors="replace")
    gone_by = time.monotonic() + 10.0     # a loaded machine reaps late
    while time.monotonic() < gone_by and ([q for q in pids if _alive(q)] or _tagged_left(p.pid)
                                          or list(tmp.iterdir())):
        time.sleep(0.05)
    assert not [q for q in pids if _alive(q)], f"benchmark ranks left running after {sig.name}"
    assert not _tagged_left(p.pid) and not list(tmp.iterdir())
    assert p.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    if mode == "early":
        assert "(started with the dry run; cached afterwards)" in err, err[-2000:]
    assert f"smartlaunch: interrupted ({sig.name}) during the all-reduce benchmark; nothing " \
           "was launched" in err.splitlines(), err[-2000:]


# ---- 3. a script that fixes its world size ----------------------------------------------------
def test_world_size_fixed_script_launches_as_torchrun_would(clean_env):
    out = clean_env / "out"
    out.mkdir()
    script = SCRIPTS / "fixed_world.py"
    r = smartlaunch(["--explain=json", "--nproc-per-node", "2", script, out], clean_env)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert (plan["strategy"], plan["nproc_per_node"]) == ("ddp", 2)
    assert plan["profile"]["status"] == "unmeasurable"
    assert any("could not measure" in x["text"] and "world size (1)" in x["text"]
               for x in plan["reasons"]), plan["reasons"]
    r = smartlaunch(["--nproc-per-node", "2", script, out], clean_env)
    assert r.returncode == 0, r.stderr
    assert sorted(p.read_text() for p in out.iterdir()) == ["0 of 2\n", "1 of 2\n"]


def test_a_world_size_fixed_script_is_known_from_the_cache_next_time(clean_env):
    # The second decision reads the unmeasurable profile from the cache (no dry run, no new
    # dry-run log) and --explain says where it came from and how to measure again.
    script = SCRIPTS / "fixed_world.py"
    args = ["--explain", "--nproc-per-node", "2", script, clean_env]
    logs = clean_env / "home" / ".cache" / "smartlaunch" / "logs"
    cold = smartlaunch(args, clean_env)
    assert cold.returncode == 0, cold.stderr
    dry_runs = sorted(logs.glob("dryrun-*.log"))
    assert len(dry_runs) == 1
    assert "profile: unmeasurable: the dry run (WORLD_SIZE=1) failed" in cold.stdout, cold.stdout
    warm = smartlaunch(args, clean_env)
    assert warm.returncode == 0, warm.stderr
    assert sorted(logs.glob("dryrun-*.log")) == dry_runs
    assert "profile: unmeasurable (cached; --reprofile measures again): the dry run " \
           "(WORLD_SIZE=1) failed" in warm.stdout, warm.stdout
    assert "→ DDP×2 on GPUs 0,1, as torchrun --nproc-per-node 2 would launch it" in warm.stdout


def test_a_crash_the_real_run_would_hit_too_still_exits_7(clean_env):
    r = smartlaunch(["--nproc-per-node", "2", SCRIPTS / "crash.py"], clean_env)
    assert r.returncode == 7, r.stderr


# ---- 4. what the script sees ------------------------------------------------------------------
SHOW = """import json, os, sys
with open(os.path.join(sys.argv[1], os.environ.get("RANK", "0") + ".json"), "w") as f:
    json.dump({"file": __file__, "argv0": sys.argv[0], "path0": sys.path[0],
               "cwd": os.getcwd(), "env": dict(os.environ)}, f)
"""
# Values that differ between any two runs, smartlaunch's own variables, the GPUs it chose,
# and the agent's own settings (no agent runs a single job; TORCHELASTIC_USE_AGENT_STORE=False
# lets its init_process_group make a store, launch/env.py).
PER_RUN = {"_", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
           "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_SIGNALS_TO_HANDLE"}


def _seen(d: Path, rank="0") -> dict:
    return json.loads((d / f"{rank}.json").read_text())


def _assert_same(want: dict, got: dict, allowed=frozenset()) -> None:
    assert {k: got[k] for k in ("file", "argv0", "path0", "cwd")} == \
        {k: want[k] for k in ("file", "argv0", "path0", "cwd")}
    w, g = want["env"], got["env"]
    diff = {k for k in set(w) | set(g) if w.get(k) != g.get(k)}
    diff = {k for k in diff if k not in PER_RUN and k not in allowed
            and not k.startswith("SMARTLAUNCH_")}
    assert not diff, {k: (w.get(k), g.get(k)) for k in diff}


@pytest.mark.parametrize("mode", [pytest.param("single", marks=SLOW), "ddp",
                                  pytest.param("independent", marks=SLOW),
                                  pytest.param("dry run", marks=SLOW)])
def test_script_sees_what_torchrun_gives_it(clean_env, shared_dir, mode):
    (clean_env / "sub").mkdir()
    (clean_env / "sub" / "show.py").write_text(SHOW)
    (clean_env / "link.py").symlink_to("sub/show.py")
    # the dry run's own view (the script takes no step: trials would run next and overwrite it)
    (clean_env / "smartlaunch.yaml").write_text("decision:\n  trials: false\n")
    for script in ("sub/show.py", "link.py"):
        want, got = shared_dir / f"want-{script[:3]}", shared_dir / f"got-{script[:3]}"
        want.mkdir(), got.mkdir()
        n = 2 if mode == "ddp" else 1
        t = torchrun(["--nproc-per-node", n, script, want], clean_env)
        assert t.returncode == 0, t.stderr
        args = {"single": ["--strategy", "single"], "ddp": ["--strategy", "ddp", "--nproc-per-node", "2"],
                "independent": ["--each", ""], "dry run": ["--explain", "--nproc-per-node", "2"]}[mode]
        r = smartlaunch([*args, script, got], clean_env)
        assert r.returncode == 0, r.stderr
        allowed = set()
        if mode == "dry run":
            from smartlaunch.sandbox import DRYRUN_ENV
            allowed = set(DRYRUN_ENV)
        if mode in ("single", "independent", "dry run"):
            allowed.add("TORCHELASTIC_USE_AGENT_STORE")
        if mode == "ddp":   # Flight Recorder dumps into the run's log dir (issue 18), unless set
            from smartlaunch.launch.flightrec import recorder_env
            allowed |= set(recorder_env({}, str(clean_env))[0])
        for rank in range(n):
            _assert_same(_seen(want, str(rank)), _seen(got, str(rank)), allowed)


RECORDED_FAILURE = ("from torch.distributed.elastic.multiprocessing.errors import record\n"
                    "@record\ndef main():\n    raise ValueError('deliberate')\nmain()\n")


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_recorded_failure_writes_its_error_file_in_our_own_directory_not_tmp(clean_env, dry_run):
    # torch's @record writes TORCHELASTIC_ERROR_FILE with open(path, "w"), following links: it
    # was a name in the shared temp directory, a fixed one for the dry run. Now the run's own
    # directory (a launch) or the dry run's private one: nothing lands in TMPDIR.
    tmp = clean_env / "tmp"
    tmp.mkdir()
    script = clean_env / "rec.py"
    script.write_text(RECORDED_FAILURE)
    env = {"TMPDIR": str(tmp), "SMARTLAUNCH_LOG_DIR": str(clean_env / "runs")}
    # auto: the failure is the dry run's (exit 7), out of the sandbox (which would take the
    # write: where it cannot run, the dry run runs without it); single: the launch's (exit 1)
    (clean_env / "smartlaunch.yaml").write_text("dryrun:\n  isolation: 'off'\n")
    r = smartlaunch([*([] if dry_run else ["--strategy", "single"]), script], clean_env, env)
    assert r.returncode == (7 if dry_run else 1), r.stderr[-2000:]
    assert "ValueError: deliberate" in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in tmp.iterdir()) == [], sorted(tmp.iterdir())
    if not dry_run:
        (run,) = (clean_env / "runs").iterdir()
        assert "ValueError: deliberate" in (run / "error.json").read_text()
