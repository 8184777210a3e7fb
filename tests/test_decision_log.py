"""The decision log (launch/decision_log.py): one whole JSON line per real launch, from any number
of writers at once, and a log that cannot be written costs the launch one line, not its run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers_common import EXAMPLES, REPO, fixture_path, own_lines
from helpers_decide import FakeComm, FakeTrial, TEST_MODEL, dual_socket, policy, profile, request
from helpers_nobody import AS_NOBODY, needs_nobody, shared_tmp
from helpers_policy import needs_admin_install
from helpers_decide import decide
from smartlaunch.launch.decision_log import (
    LOCK_WAIT_S, MAX_LINE, LogBusy, append_line, encode, measurement_gpu_seconds, mispredicted,
    read_log, record, torchrun_gpu_seconds,
)
from smartlaunch.strategies import REGISTRY


def env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def smartlaunch(args, cwd, timeout=180, **extra):
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", *args], cwd=cwd,
                          env=env(**extra), capture_output=True, text=True, timeout=timeout)


def lines_of(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# --- many writers ---------------------------------------------------------------------------

WRITER = textwrap.dedent("""\
    import json, sys
    from pathlib import Path
    from smartlaunch.launch.decision_log import append_line
    path, who, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    sys.stdin.readline()                 # all writers start together
    for i in range(n):
        pad = chr(ord("a") + who) * (600 + 97 * ((who + i) % 30))   # 600 to 3,400 bytes
        append_line(path, (json.dumps({"who": who, "i": i, "pad": pad}) + "\\n").encode())
    """)


def test_eight_writers_at_once_leave_every_line_whole(tmp_path):
    log = tmp_path / "decisions.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(log), str(w), "50"],
                              env=env(), stdin=subprocess.PIPE, text=True) for w in range(8)]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.close()
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    got = lines_of(log)          # every line parses: none torn, none interleaved
    assert len(got) == 400
    assert sorted((r["who"], r["i"]) for r in got) == [(w, i) for w in range(8) for i in range(50)]
    assert all(set(r["pad"]) == {chr(ord("a") + r["who"])} for r in got)
    # Each writer's own lines stay in its order.
    for w in range(8):
        assert [r["i"] for r in got if r["who"] == w] == list(range(50))


def test_a_line_too_long_or_with_a_newline_is_refused(tmp_path):
    with pytest.raises(ValueError):
        append_line(tmp_path / "l", b"x" * MAX_LINE + b"\n")
    with pytest.raises(ValueError):
        append_line(tmp_path / "l", b"a\nb\n")


def test_a_record_is_kept_under_the_line_limit():
    rec = {"command": "x" * 5000, "checked": [["DDP×2", 1.0, 1.0]] * 8, "format": 1}
    line = encode(rec)
    assert len(line) <= MAX_LINE and line.endswith(b"\n") and json.loads(line)["command"]


# --- what a line says -----------------------------------------------------------------------

def _plan(ddp_rate: float):
    return decide(request(max_gpus=2), dual_socket(), policy(), profile(), units=REGISTRY,
                  model=TEST_MODEL, comm_for=FakeComm(dual_socket()),
                  trial=FakeTrial({("single", 1): 10.0, ("ddp", 2): ddp_rate}))


def test_torchrun_gpu_seconds_come_from_measured_rates_only():
    # DDP×2 measured at 1.2× one GPU (60% < 70%): one GPU is chosen; torchrun would have run
    # DDP×2, doing 100 s of one GPU's work in 100 / 1.2 s on two GPUs.
    plan = _plan(12.0)
    assert plan.strategy == "single"
    got, basis = torchrun_gpu_seconds(plan, REGISTRY, run_s=100.0, gpu_s=100.0)
    assert basis == "measured" and got == pytest.approx(2 * 100 / 1.2)
    # DDP×2 chosen (1.7×, 85%): the same plan torchrun runs, the same GPU-seconds.
    plan = _plan(17.0)
    assert plan.strategy == "ddp"
    assert torchrun_gpu_seconds(plan, REGISTRY, run_s=100.0, gpu_s=200.0) == (200.0, "the same plan")


def test_no_measured_rate_means_null_not_a_guess():
    # No trial: the prediction decided; nothing measured torchrun's DDP×2.
    plan = decide(request(max_gpus=2), dual_socket(), policy(trials=False), profile(),
                  units=REGISTRY, model=TEST_MODEL, comm_for=FakeComm(dual_socket()))
    if plan.strategy == "ddp":
        pytest.skip("the model chose torchrun's own plan here")
    got, basis = torchrun_gpu_seconds(plan, REGISTRY, run_s=100.0, gpu_s=100.0)
    assert got is None and "not measured" in basis


def test_the_line_has_what_was_asked_decided_measured_and_how_it_ended(clean_env):
    plan = _plan(12.0)
    rec = record(plan, request(max_gpus=2, script_args=("--lr", "3")), REGISTRY,
                 environ={"SLURM_JOB_ID": "77", "CUDA_VISIBLE_DEVICES": "0,1"}, started=0.0,
                 wall_s=110.0, run_s=100.0, exit_code=0, ran=plan)
    assert rec["job"] == "77" and rec["command"] == "train.py --lr 3"
    assert rec["asked"] == {"strategy": "auto", "nproc": 2, "gpus_allowed": 2,
                            "visible": "0,1", "variants": 0}
    assert rec["decided"]["strategy"] == "single" and rec["decided"]["gpus"] == [0]
    assert rec["decided"]["world_size"] == 1
    assert rec["gpu_s"] == 100.0 and rec["exit_code"] == 0 and rec["wall_s"] == 110.0
    assert rec["torchrun"]["gpu_s"] == pytest.approx(166.667, abs=1e-3)
    assert rec["torchrun"]["gpus"] == 2
    # The DDP×2 trial's measured 1.2× against the model's prediction, and the band used.
    (name, predicted, measured), = rec["checked"]
    assert name == "DDP×2" and measured == pytest.approx(1.2) and predicted > 0
    assert rec["band"] == plan.uncertainty_band > 0
    assert json.loads(encode(rec)) == rec
    # A launch that never got its GPUs held none.
    never = record(plan, request(max_gpus=2), REGISTRY, environ={}, started=0.0, wall_s=5.0,
                   run_s=5.0, exit_code=6, ran=None)
    assert never["gpu_s"] == 0.0 and never["run_s"] == 0.0 and never["exit_code"] == 6


def test_gpu_seconds_count_the_measurements_before_the_job():
    # Was: GPUs held x run_s only, so the ~20 s of measuring on the GPUs before a launch was
    # missing and "saved" overstated. By hand, as the GPUs are occupied: the dry run 2 s on
    # GPU0; the sweep beside it 3 s on GPUs 0,1, less the 2 s GPU0 ran both (4); of the 1.5 s
    # the decision then spent on all-reduce, 1 s waited for that sweep and 0.5 s swept again
    # on the pair (1); trials 6 s over the single and DDP×2 candidates measured, 1.5 GPUs on
    # average (9): 2 + 4 + 1 + 9 = 16.
    import dataclasses
    timings = {"profile": 2.0, "allreduce": 1.5, "allreduce_early": 3.0, "trials": 6.0,
               "trials_start": 3.0, "decide": 0.02, "total": 12.6}
    plan = dataclasses.replace(_plan(12.0), timings=timings)
    assert [len(c.gpus) for c in plan.candidates if c.measured] == [1, 2]
    assert plan.comm.gpus == (0, 1) and not plan.profile.cached
    assert measurement_gpu_seconds(plan) == pytest.approx(16.0)
    rec = record(plan, request(max_gpus=2), REGISTRY, environ={}, started=0.0, wall_s=130.0,
                 run_s=100.0, exit_code=0, ran=plan)
    assert rec["measure_gpu_s"] == 16.0 and rec["gpu_s"] == 116.0
    assert rec["torchrun"]["gpu_s"] == pytest.approx(166.667, abs=1e-3)   # torchrun measures nothing
    # A launch that never got its GPUs still measured.
    never = record(plan, request(max_gpus=2), REGISTRY, environ={}, started=0.0, wall_s=15.0,
                   run_s=15.0, exit_code=6, ran=None)
    assert never["gpu_s"] == 16.0
    # A cached profile ran no dry run: the sweep alone on the pair (6), no wait past it, the
    # trials (9). The CPU and plans across nodes count none here.
    cached = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, cached=True))
    assert measurement_gpu_seconds(cached) == pytest.approx(15.0)
    assert measurement_gpu_seconds(dataclasses.replace(plan, device="cpu")) == 0.0
    assert measurement_gpu_seconds(dataclasses.replace(plan, nnodes="2")) == 0.0


def test_a_misprediction_is_outside_the_band_in_log_space():
    assert mispredicted({"band": 0.25, "checked": [["DDP×2", 1.8, 1.0]]})[1] == ["DDP×2", 1.8, 1.0]
    assert mispredicted({"band": 0.25, "checked": [["DDP×2", 1.0, 1.2]]}) is None   # 20% < 25%
    assert mispredicted({"band": 0.25, "checked": [["DDP×2", 1.0, 0.79]]}) is not None
    assert mispredicted({"band": None, "checked": [["DDP×2", 1.8, 1.0]]}) is None


# --- real launches --------------------------------------------------------------------------

@pytest.mark.slow
def test_real_launches_append_exactly_one_line_each(clean_env):
    log = clean_env / "home" / ".cache" / "smartlaunch" / "decisions.jsonl"
    train = str(EXAMPLES / "train.py")
    r = smartlaunch([train, "--steps", "5"], clean_env)
    assert r.returncode == 0, r.stderr[-2000:]
    (one,) = lines_of(log)
    assert one["command"] == f"{train} --steps 5" and one["exit_code"] == 0
    assert one["decided"]["strategy"] == "single" and one["decided"]["device"] == "cpu"
    assert one["gpu_s"] == 0.0 and one["run_s"] > 0 and one["torchrun"]["gpu_s"] is None
    assert one["user"] and one["host"] and one["uid"] == os.getuid()

    r = smartlaunch(["--explain", train, "--steps", "5"], clean_env)
    assert r.returncode == 0 and len(lines_of(log)) == 1          # --explain launches nothing

    (clean_env / "fail.py").write_text("import sys\nsys.exit(3)\n")
    r = smartlaunch(["--strategy", "single", "fail.py"], clean_env)
    assert r.returncode == 3
    assert lines_of(log)[-1]["exit_code"] == 3 and len(lines_of(log)) == 2

    (clean_env / "v.py").write_text("print('variant')\n")
    r = smartlaunch(["--each", "--a 1", "--each", "--a 2", "v.py"], clean_env)
    assert r.returncode == 0, r.stderr[-2000:]
    last = lines_of(log)[-1]
    assert len(lines_of(log)) == 3 and last["decided"]["strategy"] == "independent"
    assert last["asked"]["variants"] == 2

    r = smartlaunch(["--strategy", "ddp", "--nproc-per-node", "2", train, "--steps", "3",
                     "--warmup", "1"], clean_env)
    assert r.returncode == 0, r.stderr[-2000:]
    last = lines_of(log)[-1]
    assert len(lines_of(log)) == 4 and last["decided"]["strategy"] == "ddp"
    assert last["decided"]["world_size"] == 2 and last["asked"]["nproc"] == 2


def test_a_launch_that_never_gets_its_gpus_is_logged(clean_env):
    # Every GPU leased by another launch: planned for a wait, which times out (exit 6).
    topo = fixture_path("pcie-phb-4070ti-pair")
    lease = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""\
            import os, sys
            from smartlaunch.launch.leases import LeaseManager
            from smartlaunch.policy.load import load_policy
            from smartlaunch.topology import discover
            topo = discover(os.environ)
            with LeaseManager.from_policy(load_policy(None, environ=os.environ)) as m:
                lease = m.try_acquire(topo, (0, 1), 2)
                print("held", flush=True)
                sys.stdin.readline()
            """)], env=env(SMARTLAUNCH_FAKE_TOPOLOGY=topo), cwd=clean_env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert lease.stdout.readline().strip() == "held"
        (clean_env / "t.py").write_text("print('ran')\n")
        (clean_env / "wait.yaml").write_text("jobs:\n  wait_timeout_s: 1.0\n")
        r = smartlaunch(["--policy", "wait.yaml", "--strategy", "single", "t.py"], clean_env,
                        SMARTLAUNCH_FAKE_TOPOLOGY=topo)
    finally:
        lease.stdin.close()
        lease.wait(timeout=60)
    assert r.returncode == 6, r.stderr
    log = clean_env / "home" / ".cache" / "smartlaunch" / "decisions.jsonl"
    (one,) = lines_of(log)
    assert one["exit_code"] == 6 and one["gpu_s"] == 0.0 and one["decided"]["gpus"] == [0]


def _policy_file(directory, log_path) -> str:
    p = directory / "p.yaml"
    p.write_text(f"paths:\n  decision_log: {json.dumps(str(log_path))}\n")
    return str(p)


def test_an_unwritable_log_is_said_once_and_the_launch_goes_on(clean_env):
    (clean_env / "afile").write_text("x")
    target = clean_env / "afile" / "decisions.jsonl"        # under a file: ENOTDIR
    (clean_env / "t.py").write_text("print('ran')\n")
    r = smartlaunch(["--policy", _policy_file(clean_env, target), "--strategy", "single", "t.py"],
                    clean_env)
    assert r.returncode == 0 and "ran" in r.stdout, r.stderr
    said = [x for x in own_lines(r.stderr) if "decision log" in x]
    assert said == [f"smartlaunch: decision log {target} not written (Not a directory); "
                    f"the launch goes on"]


def test_a_cache_that_cannot_take_the_fallback_log_names_both_places(clean_env):
    # The built-in node path is not the user's and the cache directory cannot be made (a
    # read-only HOME): the line named the node path and gave the cache's reason alone.
    node_path = "/var/log/smartlaunch/decisions.jsonl"
    if os.path.lexists(os.path.dirname(node_path)):
        pytest.skip("this machine has the node's decision log directory")
    (clean_env / "afile").write_text("x")
    (clean_env / "t.py").write_text("print('ran')\n")
    r = smartlaunch(["--strategy", "single", "t.py"], clean_env,
                    SMARTLAUNCH_CACHE_DIR=str(clean_env / "afile" / "cache"))
    assert r.returncode == 0 and "ran" in r.stdout, r.stderr
    said = [x for x in own_lines(r.stderr) if "decision log" in x]
    assert len(said) == 1 and said[0].startswith(
        f"smartlaunch: decision log {node_path} not written (not writable by you, nor its "
        f"fallback in the cache directory: cannot create cache directory "
        f"{clean_env}/afile/cache: Not a directory; "), said


@needs_admin_install              # root and unshare --mount, for a private full tmpfs
def test_a_full_disk_is_said_once_and_the_launch_goes_on(clean_env):
    full = clean_env / "full"
    full.mkdir()
    target = full / "decisions.jsonl"
    (clean_env / "t.py").write_text("print('ran')\n")
    fill = (f"mount -t tmpfs -o size=64k tmpfs {full} && "
            f"(dd if=/dev/zero of={full}/filler bs=4k 2>/dev/null; true) && exec \"$@\"")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", fill, "sh",
                        sys.executable, "-m", "smartlaunch.cli", "--policy",
                        _policy_file(clean_env, target), "--strategy", "single", "t.py"],
                       cwd=clean_env, env=env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "ran" in r.stdout, r.stderr
    said = [x for x in own_lines(r.stderr) if "decision log" in x]
    assert said == [f"smartlaunch: decision log {target} not written (No space left on device); "
                    f"the launch goes on"]


GOOD = {"format": 1, "time": "2026-11-20T12:00:00+00:00", "user": "u", "host": "h",
        "job": None, "command": "t.py", "decided": {"strategy": "single"}, "exit_code": 0,
        "wall_s": 2.0, "run_s": 1.0, "gpu_s": 1.0, "band": 0.25, "checked": [],
        "torchrun": {"gpus": 1, "gpu_s": 1.0, "basis": "the same plan"}}


def test_read_log_counts_lines_that_are_not_records(tmp_path):
    # A bare {"format": 1} was a record before records were checked: now it lacks the fields
    # the report adds up, and is skipped like the rest.
    log = tmp_path / "l.jsonl"
    log.write_text(json.dumps(GOOD) + '\nnot json\n[1]\n{"format": 99}\n{"format": 1}\n\n')
    records, bad = read_log(log)
    assert records == [GOOD] and bad == 4


# --- a log other users can reach --------------------------------------------------------------
# The log is shared by design (every user of a node appends to it), so whoever may open it
# may also lock it, or put something else at its path.

HOLD = textwrap.dedent("""\
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR if sys.argv[2] == "ex" else os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX if sys.argv[2] == "ex" else fcntl.LOCK_SH)
    print("held", flush=True)
    sys.stdin.readline()
    """)


@pytest.fixture
def shared():
    import shutil
    d = shared_tmp()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_nobody
@pytest.mark.parametrize("how", ["ex", "sh"])
def test_another_users_lock_on_the_log_costs_the_launch_one_line(clean_env, shared, how):
    # flock -x through a write open, or -s through a read-only one: either made a finished
    # job's smartlaunch wait for ever.
    log = shared / "decisions.jsonl"
    log.write_text("")
    log.chmod(0o666)
    holder = subprocess.Popen([*AS_NOBODY, sys.executable, "-c", HOLD, str(log), how],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (clean_env / "t.py").write_text("print('ran')\n")
        r = smartlaunch(["--policy", _policy_file(clean_env, log), "--strategy", "single",
                         "t.py"], clean_env, timeout=60)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert r.returncode == 0 and "ran" in r.stdout, r.stderr
    said = [x for x in own_lines(r.stderr) if "decision log" in x]
    assert said == [f"smartlaunch: decision log {log} not written (locked by pid {holder.pid} "
                    f"(user nobody) for over {LOCK_WAIT_S:g} s); the launch goes on"]
    assert log.read_text() == ""


def test_append_line_gives_up_on_a_held_lock_within_the_bound(tmp_path):
    import fcntl
    import time
    log = tmp_path / "l.jsonl"
    log.write_text("")
    fd = os.open(log, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        t = time.monotonic()
        with pytest.raises(LogBusy, match=rf"locked by pid {os.getpid()} "):
            append_line(log, encode(GOOD))
        assert LOCK_WAIT_S <= time.monotonic() - t < LOCK_WAIT_S + 5
    finally:
        os.close(fd)
    assert log.read_text() == ""


def test_a_fifo_at_the_log_path_costs_the_launch_one_line(clean_env):
    log = clean_env / "decisions.jsonl"
    os.mkfifo(log)
    (clean_env / "t.py").write_text("print('ran')\n")
    r = smartlaunch(["--policy", _policy_file(clean_env, log), "--strategy", "single", "t.py"],
                    clean_env, timeout=60)
    assert r.returncode == 0 and "ran" in r.stdout, r.stderr
    said = [x for x in own_lines(r.stderr) if "decision log" in x]
    assert said == [f"smartlaunch: decision log {log} not written (a FIFO, not a regular file); "
                    f"the launch goes on"]


def test_a_link_at_the_log_path_is_not_followed(clean_env):
    victim = clean_env / "victim"
    victim.write_text("precious\n")
    log = clean_env / "decisions.jsonl"
    log.symlink_to(victim)
    with pytest.raises(OSError):
        append_line(log, encode(GOOD))
    assert victim.read_text() == "precious\n"


def test_a_log_without_a_final_newline_keeps_the_next_record_whole(tmp_path):
    log = tmp_path / "l.jsonl"
    log.write_bytes(b'{"format": 1, "time": "2026-11-2')          # a writer cut off mid-line
    append_line(log, encode(GOOD))
    append_line(log, encode(GOOD))
    assert read_log(log) == ([GOOD, GOOD], 1)
    assert log.read_bytes().endswith(b"\n") and b"\n\n" not in log.read_bytes()


@needs_nobody
def test_a_writer_that_may_not_read_the_log_starts_its_line_with_a_newline(shared):
    # 0622: every user appends, only root reads. The writer cannot see the last byte, so its
    # line always starts a new one; the reader skips the blank lines that leaves.
    log = shared / "decisions.jsonl"
    log.write_bytes(b'{"torn')
    log.chmod(0o622)
    write = ("import sys; from pathlib import Path; "
             "from smartlaunch.launch.decision_log import append_line; "
             "append_line(Path(sys.argv[1]), sys.argv[2].encode())")
    for _ in range(2):
        r = subprocess.run([*AS_NOBODY, sys.executable, "-c", write, str(log),
                            json.dumps(GOOD) + "\n"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    assert os.stat(log).st_uid == 0 and log.read_bytes().count(b"\n") == 4
    assert read_log(log) == ([GOOD, GOOD], 1)
