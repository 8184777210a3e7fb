"""run_independent with real job processes on a fake 2-GPU topology."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import helpers_jobs as H
from helpers_common import wait_until
from smartlaunch.decide.plan import NumaBinding
from smartlaunch.errors import NoFreeGPUError
from helpers_launch import run_independent
from smartlaunch.launch.leases import LeaseManager


def _records(out):
    return {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in out.glob("job-*.json")}


def _setup(tmp):
    out = tmp / "out"
    out.mkdir()
    return out, H.write_script(tmp, "job.py", H.JOB_SCRIPT)


def _summary(tmp) -> dict:
    (path,) = (tmp / "logs").glob("*/summary.json")
    return json.loads(path.read_text())


def test_five_variants_on_two_gpus_queue_and_report_each_exit_code(clean_env, capsys):
    out, script = _setup(clean_env)
    topo = H.fake_topology(2)
    variants = [["--exit", "0"], ["--exit", "0"], ["--exit", "3", "--rate", "7.5"], ["--exit", "0"], ["--exit", "0"]]
    rc = run_independent(H.plan(variants), H.request(script, "--out", str(out)), H.policy(clean_env), topo)
    assert rc == 1
    recs = _records(out)
    assert sorted(recs) == [0, 1, 2, 3, 4]
    uuids = {g.uuid: g.index for g in topo.gpus}
    spans = [(r["start"], r["end"], uuids[r["CUDA_VISIBLE_DEVICES"]]) for r in recs.values()]
    for t in (s for s, _, _ in spans):           # at most 2 at a time, never two on one GPU
        running = [g for s, e, g in spans if s <= t < e]
        assert len(running) <= 2 and len(set(running)) == len(running)
    for i, r in recs.items():
        assert (r["SMARTLAUNCH_JOB_INDEX"], r["SMARTLAUNCH_NUM_JOBS"]) == (str(i), "5")
        assert (r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"]) == ("0", "0", "1")
        assert r["argv"] == ["--out", str(out)] + variants[i]
    assert len({r["MASTER_PORT"] for r in recs.values()}) == 5
    summary = _summary(clean_env)
    assert [j["exit_code"] for j in summary["jobs"]] == [0, 0, 3, 0, 0]
    assert summary["jobs"][2]["samples_per_s"] == 7.5 and summary["jobs"][0]["samples_per_s"] == 100.0
    log = open(summary["jobs"][2]["log"]).read()
    assert "throughput: samples/s=7.5" in log and "some stderr" in log
    err = capsys.readouterr().err
    assert "4 of 5 succeeded" in err and "exit code 3" in err
    assert "job 2 (--exit 3 --rate 7.5) failed: exit code 3" in err
    assert LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]).taken(topo) == set()   # all given back


def test_the_context_lists_only_the_leases_still_held(clean_env):
    # The queue takes GPU 1 as a second lease and absorbs it, then gives GPUs back one by one
    # as the queue drains: the context's list follows, with no emptied lease left in it.
    from smartlaunch.launch.api import context
    from smartlaunch.launch.independent import IndependentLauncher
    from helpers_launch import with_command
    out, script = _setup(clean_env)
    topo = H.fake_topology(2)
    req = H.request(script, "--out", str(out))
    ctx = context(req, H.policy(clean_env), topo)
    launcher = IndependentLauncher(with_command(H.plan([["--sleep", "0.5"], ["--sleep", "2"]]), req), ctx)
    try:
        launcher.start()
        assert [lease.gpus for lease in ctx.held] == [(0, 1)]
        while launcher.poll() is None and ctx.held[0].gpus != (1,):
            time.sleep(0.05)
        assert [lease.gpus for lease in ctx.held] == [(1,)]       # job 0 done, GPU 0 given back
        while launcher.poll() is None:
            time.sleep(0.05)
        assert ctx.held == ()
    finally:
        launcher.close()
        ctx.close()
    assert LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]).taken(topo) == set()


def test_gpu_leased_by_another_launch_is_not_used(clean_env):
    out, script = _setup(clean_env)
    topo = H.fake_topology(2)
    holder = H.write_script(clean_env, "holder.py", H.LEASE_HOLDER)
    ready = clean_env / "ready"
    p = subprocess.Popen([H.PY, holder, H.write_topology(clean_env / "t.json", topo), str(ready), "1"],
                         env=H.python_env())
    try:
        H.wait_for(ready)
        rc = run_independent(H.plan([["--sleep", "0.1"]] * 3), H.request(script, "--out", str(out)),
                             H.policy(clean_env), topo)
    finally:
        p.kill()
        p.wait()
    assert rc == 0
    recs = _records(out).values()
    assert {r["CUDA_VISIBLE_DEVICES"] for r in recs} == {topo.gpu(0).uuid}
    spans = sorted((r["start"], r["end"]) for r in recs)
    assert H.overlapping(spans) == []


def test_no_wait_fails_at_once_when_every_gpu_is_leased(clean_env):
    out, script = _setup(clean_env)
    topo = H.fake_topology(2, busy=(1,))
    with LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]).acquire(topo, [0], 1, wait=False, timeout_s=0):
        with pytest.raises(NoFreeGPUError, match="GPU 0 is leased by .*GPU 1 is in use by pid 4242"):
            run_independent(H.plan([[]], wait=False), H.request(script, "--out", str(out), no_wait=True),
                            H.policy(clean_env), topo)
    assert not list(out.iterdir())


def test_fail_fast_stops_the_others(clean_env):
    out, script = _setup(clean_env)
    variants = [["--exit", "5", "--sleep", "0.2"], ["--sleep", "30"], ["--sleep", "30"], ["--sleep", "30"]]
    t0 = time.monotonic()
    rc = run_independent(H.plan(variants), H.request(script, "--out", str(out)),
                         H.policy(clean_env, fail_fast=True), H.fake_topology(2))
    assert rc == 1 and time.monotonic() - t0 < 15
    states = [j["state"] for j in _summary(clean_env)["jobs"]]
    assert states == ["failed", "interrupted", "skipped", "skipped"]


def test_cpu_only_runs_nproc_jobs_at_a_time(clean_env):
    out, script = _setup(clean_env)
    rc = run_independent(H.plan([["--sleep", "0.3"]] * 4, gpus=(), device="cpu", nproc=2),
                         H.request(script, "--out", str(out)), H.policy(clean_env), H.fake_topology(0))
    assert rc == 0
    recs = _records(out).values()
    assert all(r["CUDA_VISIBLE_DEVICES"] is None for r in recs)
    for t in (r["start"] for r in recs):
        assert sum(r["start"] <= t < r["end"] for r in recs) <= 2


def test_two_jobs_per_gpu_run_side_by_side_only_when_the_plan_says_so(clean_env):
    # decide chooses jobs per GPU (test_decide_choice: only when two profiled peaks fit).
    out, script = _setup(clean_env)
    topo = H.fake_topology(1, free_mib=10000)
    two = H.plan([["--sleep", "0.6"]] * 2, gpus=(0,), jobs_per_gpu=2)
    assert run_independent(two, H.request(script, "--out", str(out)), H.policy(clean_env), topo) == 0
    a, b = _records(out).values()
    assert a["start"] < b["end"] and b["start"] < a["end"]          # ran side by side
    out2 = clean_env / "out2"
    out2.mkdir()
    # The policy still says 2: the launcher follows the plan, not the policy.
    one = H.plan([["--sleep", "0.3"]] * 2, gpus=(0,), jobs_per_gpu=1)
    assert run_independent(one, H.request(script, "--out", str(out2)),
                           H.policy(clean_env, jobs_per_gpu=2), topo) == 0
    assert H.overlapping(sorted((r["start"], r["end"]) for r in _records(out2).values())) == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell bindings apart")
def test_each_job_is_bound_to_its_gpus_numa_node(clean_env):
    out, script = _setup(clean_env)
    cpus = sorted(os.sched_getaffinity(0))
    bindings = (NumaBinding(0, 0, 0, (cpus[0],), "node", "sched_setaffinity"),
                NumaBinding(1, 1, 1, (cpus[1],), "node", "sched_setaffinity"))
    plan = H.plan([["--sleep", "0.1"]] * 2)
    import dataclasses
    plan = dataclasses.replace(plan, numa=bindings)
    topo = H.fake_topology(2)
    assert run_independent(plan, H.request(script, "--out", str(out)), H.policy(clean_env), topo) == 0
    gpu_of = {g.uuid: g.index for g in topo.gpus}
    for r in _records(out).values():
        assert r["affinity"] == [cpus[gpu_of[r["CUDA_VISIBLE_DEVICES"]]]]


DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    import helpers_jobs as H
    from helpers_launch import run_independent
    tmp, script = Path(sys.argv[2]), sys.argv[3]
    variants = [["--sleep", "60"]] * 3
    sys.exit(run_independent(H.plan(variants), H.request(script, "--out", str(tmp / "out")),
                             H.policy(tmp), H.fake_topology(2)))
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_every_job_and_exits_128_plus_signal(clean_env, sig):
    out, script = _setup(clean_env)
    driver = H.write_script(clean_env, "driver.py", DRIVER)
    p = subprocess.Popen([sys.executable, driver, str(H.REPO / "tests"), str(clean_env), script],
                         env=H.python_env(), stderr=subprocess.PIPE, text=True)
    H.wait_for(out / "started-0")
    H.wait_for(out / "started-1")
    pids = [int((out / f"started-{i}").read_text()) for i in (0, 1)]
    p.send_signal(sig)
    _, err = p.communicate(timeout=20)
    assert p.returncode == 128 + sig, err
    assert not (out / "started-2").exists()          # the queued job never started
    wait_until(lambda: not [pid for pid in pids if psutil.pid_exists(pid) and
                            psutil.Process(pid).status() != psutil.STATUS_ZOMBIE],
               what="the jobs to end")
    assert f"got {signal.Signals(sig).name}" in err and "0 of 3 succeeded" in err


def test_sigkilled_smartlaunch_leaves_no_job_behind(clean_env):
    out, script = _setup(clean_env)
    driver = H.write_script(clean_env, "driver.py", DRIVER)
    p = subprocess.Popen([sys.executable, driver, str(H.REPO / "tests"), str(clean_env), script],
                         env=H.python_env(), stderr=subprocess.DEVNULL)
    H.wait_for(out / "started-0")
    H.wait_for(out / "started-1")
    pids = [int((out / f"started-{i}").read_text()) for i in (0, 1)]
    p.kill()
    p.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(x) for x in pids):
        time.sleep(0.05)
    assert not [x for x in pids if psutil.pid_exists(x)]
    mgr = LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"])
    assert mgr.taken(H.fake_topology(2)) == set()
