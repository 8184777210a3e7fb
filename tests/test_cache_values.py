"""Cached values are checked before use, and a cache that cannot be written costs nothing.

Every record read back from the user's cache (profile, all-reduce curve, trial, rates of
earlier launches, node calibration) goes through its type's from_dict: a bad one is said in
one line, discarded and measured again. A cache directory that is full, read-only or not the
user's to write is said in one line, and the launch measures without it.

End to end on the CPU with the fake NV18 pair: the bad records are planted at the paths the
code computes for the job (its own key functions), then a real `smartlaunch` decides.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_common import fixture_path, own_lines
from smartlaunch import cli
from smartlaunch.policy.enforce import apply_request
from smartlaunch.policy.load import load_policy
from smartlaunch.profile import baseline, cache, feedback
from smartlaunch.profile.api import (
    TRIAL_FLOOR, TRIAL_RANGE, CommCurve, ModelProfile, ProfileStatus, TrialRecord,
)
from smartlaunch.profile.comm import backend_for, device_for
from smartlaunch.store import BadRecord
from smartlaunch.topology import discover
from smartlaunch.vocab import Strategy

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).parent / "scripts" / "feedback_train.py"
PAIR = fixture_path("h200-nv18-pair")
ARGS = ["feedback_train.py", "--steps", "40"]
# A wide band: every cold decision measures DDP×2 by a trial, each trial short.
POLICY = "decision: {uncertainty_band: 2.0, trial_seconds: 0.2, trial_steps: 5}\n"
NOBODY = 65534

# What each bad value makes of a record: a number planted in the field a decision divides by,
# or the whole record of the wrong JSON type, or a record without its fields.
BAD = {"Infinity": math.inf, "1e9": 1e9, "NaN": math.nan, "-1": -1,
       "a list": [1, 2], "a string": "fast", "missing fields": None}


def good_records(topology) -> dict:
    """A sound record of each kind, as the code writes them (a few figures for this job)."""
    now = time.time()
    curve = CommCurve.from_points(2, "gloo", [(65536, 2e-4), (1 << 20, 4e-4)], gpus=(0, 1))
    rate = feedback.measured_rate("ddp", (0, 1), 41, 1.0, {"batch_size": 8}, now=now)
    profile = ModelProfile(ProfileStatus.OK, step_time_s=0.02, step_time_p90_s=0.021,
                           steps_measured=24, window_s=0.48, batch_size=8, dry_run_s=3.0,
                           grad_bytes=272, num_grad_tensors=2, total_params=68,
                           trainable_params=68)
    return {
        "profile": profile.to_dict(),
        "trial": {"samples_per_s": 700.0, "measured_at": now},
        "all-reduce curve": {"measured_at": now, "curve": curve.to_dict()},
        "launch rates": {"runs": {"ddp:0,1": rate.to_dict()}},
        "node calibration": {"constants": {"contention_s_per_byte": 1e-11, "ddp_overhead_s": 4e-4,
                                           "per_tensor_s": 0.0},
                             "fingerprint": topology.fingerprint(), "measured_at": now},
    }


# Where a planted number goes (a field a decision divides by or multiplies with), and which
# field a record "missing fields" lacks.
NUMBER_AT = {"profile": ("step_time_s",), "trial": ("samples_per_s",),
             "all-reduce curve": ("curve", "points", 0, 1),
             "launch rates": ("runs", "ddp:0,1", "rank_steps_per_s"),
             "node calibration": ("constants", "contention_s_per_byte")}
MISSING = {"profile": ("status",), "trial": ("samples_per_s",), "all-reduce curve": ("curve",),
           "launch rates": ("runs", "ddp:0,1", "seconds"), "node calibration": ("fingerprint",)}
# How the line for each kind ends: what the launch does instead.
THEN = {"node calibration": "; using the shipped constants; `smartlaunch-node calibrate` "
                            "measures them again",
        "launch rates": "; predicting instead; the next launch measures it again"}


def spoil(kind: str, data: dict, bad: str):
    """`data` (a good record of `kind`) with the bad value `bad` in it."""
    value = BAD[bad]
    if isinstance(value, (list, str)):
        return value
    field = NUMBER_AT[kind] if value is not None else MISSING[kind]
    inner = data
    for k in field[:-1]:
        inner = inner[k]
    if value is None:
        del inner[field[-1]]
    else:
        inner[field[-1]] = value
    return data


def job_paths(argv, cwd: Path, env: dict):
    """(where the launch of `argv` in `cwd` reads each kind of record: the code's own keys,
    the topology it sees)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        request, _ = cli.parse(argv, env)
        policy = apply_request(load_policy(request.policy_path, environ=env), request)
        topo = discover(env)
        backend = backend_for(device_for(topo))
        return {
            "profile": cache.profile_path(request, policy, topo.gpu(0).name, env),
            "trial": cache.trial_path(request, policy, topo, env, Strategy.DDP, (0, 1)),
            "all-reduce curve": cache.comm_path(policy, cache.comm_key(topo, (0, 1), backend, env),
                                                env),
            "launch rates": feedback.rates_path(policy, feedback.job_key(request, policy, topo,
                                                                         env), env, create=True),
            "node calibration": baseline.constants_path(policy, baseline.baseline_key(topo, env),
                                                        env, create=True),
        }, topo
    finally:
        os.chdir(old)


def smartlaunch(args, cwd, env, wrap=lambda argv: argv) -> subprocess.CompletedProcess:
    return subprocess.run(wrap([sys.executable, "-m", "smartlaunch.cli", *args]), cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=240)


def ours(stderr: str) -> list[str]:
    return [line for line in own_lines(stderr) if line.startswith("smartlaunch:")]


@pytest.fixture
def job(clean_env):
    """The job's working directory, with the script and a policy that asks for trials, and
    the environment its launches run in."""
    shutil.copy(SCRIPT, clean_env / "feedback_train.py")
    (clean_env / "smartlaunch.yaml").write_text(POLICY)
    env = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": PAIR, "SLEEP_MS": "10"}
    return clean_env, env


# --- end to end: a bad record of every kind, planted in the user's own cache -----------------

# One case runs by default; the other kinds of damage, which the in-process test below covers
# for every reader, end to end with -m slow (CI runs them).
END_TO_END = [b if b == "Infinity" else pytest.param(b, marks=pytest.mark.slow) for b in BAD]


@pytest.mark.parametrize("bad", END_TO_END)
def test_a_bad_cached_value_is_said_once_and_measured_again(job, bad):
    cwd, env = job
    paths, topo = job_paths(["--explain=json", *ARGS], cwd, env)
    for kind, data in good_records(topo).items():
        paths[kind].write_text(json.dumps(spoil(kind, data, bad)))
    r = smartlaunch(["--explain=json", *ARGS], cwd, env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = ours(r.stderr)
    for kind, path in paths.items():
        said = [ln for ln in lines if ln.startswith(f"smartlaunch: ignoring the cached {kind} "
                                                    f"at {path} (")]
        assert len(said) == 1, (kind, lines)
        assert said[0].endswith(THEN.get(kind, "; measuring again")), said
    # Measured again: the dry run, the all-reduce and the DDP×2 trial ran in this launch.
    for step in ("profiling feedback_train.py", "measuring all-reduce over GPUs 0,1",
                 "DDP×2 on GPUs 0,1 (measured steps"):
        assert any(step in ln for ln in lines), (step, lines)
    plan = json.loads(r.stdout)
    ddp = next(c for c in plan["candidates"] if c["strategy"] == "ddp")
    assert ddp["measured"] and 0 < ddp["speedup"] <= TRIAL_RANGE * 2, ddp
    assert all(math.isfinite(c["speedup"]) and c["speedup"] > 0 for c in plan["candidates"])
    text = json.dumps(plan, ensure_ascii=False)
    assert "∞" not in text and "−" not in text and "measured by earlier launches" not in text
    assert plan["profile"]["step_time_s"] > 0
    if bad == "Infinity":     # what was measured again is kept, and read back without a word
        again = smartlaunch(["--explain=json", *ARGS], cwd, env)
        assert again.returncode == 0, again.stderr[-2000:]
        lines = ours(again.stderr)
        assert not [ln for ln in lines if "ignoring" in ln and not
                    any(str(paths[k]) in ln for k in THEN)], lines     # --explain keeps neither
        assert not [ln for ln in lines if "profiling" in ln or "trial" in ln], lines


# --- a cache that cannot be written ------------------------------------------------------------

def _mount_why_not() -> str | None:
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"mount -t tmpfs fails here: {probe.stderr.strip()}"


_WHY_NOT_MOUNT = _mount_why_not()
needs_mount = pytest.mark.skipif(_WHY_NOT_MOUNT is not None, reason=_WHY_NOT_MOUNT or "")

# $1: the mount point; then the command, run in a private mount namespace where $1 is a 64 KiB
# tmpfs, filled up ("full") or read-only ("ro"): nothing outside the namespace sees it.
_TINY_FS = r"""set -e
d=$1; how=$2; shift 2
mount -t tmpfs -o size=64k tmpfs "$d"
if [ "$how" = full ]; then head -c 1M /dev/zero > "$d/fill" 2>/dev/null || true; fi
if [ "$how" = ro ]; then mount -o remount,ro "$d"; fi
exec "$@"
"""


def on_tiny_fs(mount: Path, how: str):
    return lambda argv: ["unshare", "--mount", "--propagation", "private", "sh", "-c", _TINY_FS,
                         "sh", str(mount), how, *argv]


@pytest.mark.slow
@needs_mount
def test_a_full_cache_launches_without_caching(job):
    cwd, env = job
    mount = cwd / "full"
    mount.mkdir()
    env = {**env, "SMARTLAUNCH_CACHE_DIR": str(mount / "cache")}
    r = smartlaunch(ARGS, cwd, env, on_tiny_fs(mount, "full"))       # a cold cache, a launch
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = ours(r.stderr)
    full = [ln for ln in lines if "is not writable" in ln and "cache directory" in ln]
    assert full == [f"smartlaunch: cache directory {mount / 'cache'} is not writable (No space "
                    f"left on device): measuring without caching"], lines
    assert any("summary (succeeded)" in ln for ln in lines), lines       # the job ran
    assert any(" — measured " in ln for ln in lines), lines              # decided by its trial


@needs_mount
def test_a_full_log_dir_is_named_before_anything_is_measured(job):
    # The launch's run directory (step counters the ranks map) cannot live on a full file
    # system: with the built-in paths it is the cache's, ~/.cache/smartlaunch/logs.
    cwd, env = job
    mount = cwd / "full"
    mount.mkdir()
    env = {**env, "SMARTLAUNCH_LOG_DIR": str(mount / "logs")}
    r = smartlaunch(ARGS, cwd, env, on_tiny_fs(mount, "full"))
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert ours(r.stderr) == [
        f"smartlaunch: error: launch.log_dir={mount / 'logs'} (env:SMARTLAUNCH_LOG_DIR): the file "
        f"system of {mount} is full (0 KiB free; the ranks' step counters there would fail); "
        f"free space on it, or set SMARTLAUNCH_LOG_DIR (launch.log_dir) to a directory on "
        f"another file system"], r.stderr[-2000:]


@pytest.mark.slow
@needs_mount
def test_explain_reprofile_on_a_read_only_cache_prints_the_plan(job):
    cwd, env = job
    mount = cwd / "ro"
    mount.mkdir()
    env = {**env, "SMARTLAUNCH_CACHE_DIR": str(mount)}
    r = smartlaunch(["--explain", "--reprofile", *ARGS], cwd, env, on_tiny_fs(mount, "ro"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    said = [ln for ln in ours(r.stderr) if "is not writable" in ln]
    assert said == [f"smartlaunch: cache directory {mount} is not writable (Read-only file "
                    f"system): measuring without caching"], r.stderr[-2000:]
    assert "cached afterwards" not in r.stderr and "profiling " in r.stderr, r.stderr[-2000:]
    assert "candidate" in r.stdout and "script output: not kept" in r.stdout, r.stdout


def _nobody_why_not() -> str | None:
    if os.geteuid() != 0:
        return "running a command as another uid needs root"
    probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import smartlaunch"],
                           capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    return None if probe.returncode == 0 else f"setpriv cannot run python as uid {NOBODY} " \
        f"here: {probe.stderr.strip()[-200:]}"


# Reading root's python needs dac_read_search (as tests/test_leases_security.py); writing is
# still checked against the uid.
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
_WHY_NOT_NOBODY = _nobody_why_not()
needs_nobody = pytest.mark.skipif(_WHY_NOT_NOBODY is not None, reason=_WHY_NOT_NOBODY or "")


@needs_nobody
def test_explain_reprofile_on_a_cache_dir_the_user_cannot_write(tmp_path_factory):
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="smartlaunch-test-"))       # uid 65534 can reach it
    try:
        d.chmod(0o755)
        for sub in ("home", "work", "leases", "cache"):
            (d / sub).mkdir()
            os.chown(d / sub, NOBODY, NOBODY)
        shutil.copy(SCRIPT, d / "work" / "feedback_train.py")
        # The sandbox needs the paths it protects to be the user's own: d is root's.
        (d / "work" / "smartlaunch.yaml").write_text(POLICY + "dryrun: {isolation: \"off\"}\n")
        (d / "cache").chmod(0o500)                   # its owner's, and read-only to it
        env = {**os.environ, "HOME": str(d / "home"), "SMARTLAUNCH_LEASE_DIR": str(d / "leases"),
               "SMARTLAUNCH_CACHE_DIR": str(d / "cache"), "SMARTLAUNCH_FAKE_TOPOLOGY": PAIR,
               "SLEEP_MS": "10"}
        env.pop("XDG_CACHE_HOME", None)
        r = smartlaunch(["--explain", "--reprofile", *ARGS], d / "work", env,
                        lambda argv: [*AS_NOBODY, *argv])
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
        said = [ln for ln in ours(r.stderr) if "is not writable" in ln]
        assert said == [f"smartlaunch: cache directory {d / 'cache'} is not writable "
                        f"(Permission denied): measuring without caching"], r.stderr[-2000:]
        assert "cached afterwards" not in r.stderr and "profiling " in r.stderr, r.stderr[-2000:]
        assert "candidate" in r.stdout and "DDP×2" in r.stdout, r.stdout
        assert os.listdir(d / "cache") == []
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_an_unsafe_cache_dir_is_still_an_error(job):
    cwd, env = job
    (cwd / "elsewhere").mkdir()
    (cwd / "link").symlink_to(cwd / "elsewhere")
    r = smartlaunch(["--explain", *ARGS], cwd, {**env, "SMARTLAUNCH_CACHE_DIR": str(cwd / "link")})
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert ours(r.stderr)[-1].startswith(f"smartlaunch: error: refusing cache directory "
                                         f"{cwd / 'link'}: it is a symbolic link")


# --- the checks themselves, in-process ---------------------------------------------------------

def test_each_from_dict_names_the_bad_field(clean_env):
    topo = discover({"SMARTLAUNCH_FAKE_TOPOLOGY": PAIR})
    good = good_records(topo)
    assert ModelProfile.from_dict(good["profile"]).step_time_s == 0.02
    cases = [
        (ModelProfile.from_dict, dict(good["profile"], steps_measured=-1), "steps_measured"),
        (ModelProfile.from_dict, dict(good["profile"], batch_size=True), "batch_size"),
        (ModelProfile.from_dict, dict(good["profile"], status="fast"), "status"),
        (ModelProfile.from_dict, dict(good["profile"], window_s=60.0), "window_s"),
        (ModelProfile.from_dict, dict(good["profile"], param_dtypes=[]), "param_dtypes"),
        (CommCurve.from_dict, dict(good["all-reduce curve"]["curve"],
                                   points=[[2, 1e-4], [1, 2e-4]]), "points[1][0]"),
        (CommCurve.from_dict, dict(good["all-reduce curve"]["curve"], gpus=list(range(5000))),
         "gpus"),
        (feedback.MeasuredRate.from_dict, dict(good["launch rates"]["runs"]["ddp:0,1"], steps=1e9),
         "steps"),
        (feedback.MeasuredRate.from_dict, dict(good["launch rates"]["runs"]["ddp:0,1"],
                                               gpus=[0]), "gpus"),
        (feedback.rates_from_dict, {"runs": {"ddp:0,2": good["launch rates"]["runs"]["ddp:0,1"]}},
         "runs.ddp:0,2"),
        (baseline.calibration_from_dict, dict(good["node calibration"], constants={
            "per_tensor_s": 5.0}), "constants.per_tensor_s"),
    ]
    for parse, data, field in cases:
        with pytest.raises(BadRecord) as got:
            parse(json.loads(json.dumps(data)))
        assert got.value.field == field, (field, str(got.value))


@pytest.mark.parametrize("bad", list(BAD))
def test_every_reader_discards_every_bad_value_and_says_it(job, bad, capsys):
    cwd, env = job
    paths, topo = job_paths(ARGS, cwd, env)
    for kind, data in good_records(topo).items():
        paths[kind].write_text(json.dumps(spoil(kind, data, bad)))
    old = os.getcwd()
    os.chdir(cwd)
    try:
        request, _ = cli.parse(ARGS, env)
        policy = apply_request(load_policy(request.policy_path, environ=env), request)
        key = feedback.job_key(request, policy, topo, env)
        got = {
            "profile": cache.cached_profile(request, policy, gpu_model=topo.gpu(0).name,
                                            environ=env),
            "trial": cache.cached_trial(request, policy, topology=topo, environ=env,
                                        strategy=Strategy.DDP, gpus=(0, 1), one_gpu=400.0),
            "all-reduce curve": cache.cached_comm(policy, topo, (0, 1), "gloo", env,
                                                  need_bytes=0),
            "launch rates": feedback.load_rates(policy, key, env) or None,
            "node calibration": baseline.load_constants(policy, topo, env),
        }
    finally:
        os.chdir(old)
    assert got == dict.fromkeys(paths), got
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(paths), err
    for kind, path in paths.items():
        assert sum(line.startswith(f"smartlaunch: ignoring the cached {kind} at {path} (")
                   for line in err) == 1, (kind, err)


def test_a_trial_is_kept_within_its_range_of_the_dry_runs_one_gpu_rate():
    d = {"measured_at": 1.0}
    one = 100.0
    assert TrialRecord.from_dict({**d, "samples_per_s": 2 * 2 * one}, nproc=2,
                                 one_gpu=one).samples_per_s == 400.0
    with pytest.raises(BadRecord, match=r"more than 2 × 2 × the dry run's 100"):
        TrialRecord.from_dict({**d, "samples_per_s": 401.0}, nproc=2, one_gpu=one)
    with pytest.raises(BadRecord, match="less than 1/10"):
        TrialRecord.from_dict({**d, "samples_per_s": one / TRIAL_FLOOR / 2}, nproc=1, one_gpu=one)
    # Without the dry run's rate only the number itself is checked.
    assert TrialRecord.from_dict({**d, "samples_per_s": 1e9}, nproc=2).samples_per_s == 1e9


def test_a_bad_record_read_twice_is_said_once(clean_env, capsys):
    from smartlaunch.policy.api import Policy
    from smartlaunch.request import Request
    (clean_env / "train.py").write_text("")
    topo = discover({"SMARTLAUNCH_FAKE_TOPOLOGY": PAIR})
    request, env = Request(script="train.py"), dict(os.environ)
    path = cache.trial_path(request, Policy(), topo, env, Strategy.DDP, (0, 1))
    path.write_text('{"samples_per_s": "fast", "measured_at": 1}')
    runs = []
    run = cache.cached_trials(lambda s, g: runs.append(g) or 180.0, request, Policy(),
                              topology=topo, environ=env, one_gpu=100.0)
    for _ in range(2):
        assert cache.cached_trial(request, Policy(), topology=topo, environ=env,
                                  strategy=Strategy.DDP, gpus=(0, 1)) is None
    assert run(Strategy.DDP, (0, 1)) == 180.0 and runs == [(0, 1)]      # measured again
    assert run(Strategy.DDP, (0, 1)) == 180.0 and runs == [(0, 1)]      # and kept
    err = capsys.readouterr().err.splitlines()
    assert err == [f"smartlaunch: ignoring the cached trial at {path} (samples_per_s: the "
                   f"string 'fast', not a number); measuring again"], err
