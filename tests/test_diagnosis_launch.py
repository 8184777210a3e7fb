"""Runtime diagnosis with real processes (issue 18): 2 gloo ranks under the DDP launcher.

Under synchronous steps both ranks make the same number of steps, so only the work timer can
name the slow one; the control run with equal ranks must stay silent."""
from __future__ import annotations

import json
import os
import re
import signal
import sys

import pytest

from smartlaunch.launch.api import RunState
from helpers_launch import launch_ddp
from smartlaunch.topology.api import cpu_only
from helpers_ddp import alive, cpu_plan, make_policy, make_request, marker_pids

pytestmark = pytest.mark.timeout(180)
WINDOW = {"straggler_window_s": 3.0, "hang_timeout_s": 60.0}


@pytest.fixture
def out(clean_env, monkeypatch):
    d = clean_env / "out"
    d.mkdir()
    monkeypatch.setenv("SLT_OUT", str(d))
    monkeypatch.setenv("SLT_DDP", "1")
    yield d
    for pid in alive(marker_pids(d)):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("slow", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_slow_rank_is_named_with_its_slowdown(out, monkeypatch, slow):
    monkeypatch.setenv("SLT_STEPS", "150")
    if slow:
        monkeypatch.setenv("SLT_SLOW_RANK", "1")     # +50 ms before each forward (issue 18's case)
    result = launch_ddp(cpu_plan(2), make_request(2), make_policy(out.parent / "logs", **WINDOW), cpu_only("test"))
    assert result.state == RunState.SUCCEEDED, result.message
    summary = result.details["summary"]
    # synchronous DDP: the ranks step together, so one rate is given for both
    assert re.match(r"smartlaunch: summary \(succeeded\): 150 steps; [\d.]+ steps/s on each of "
                    r"2 ranks\n", summary), summary
    assert (summary + "\n") == open(os.path.join(result.details["run_dir"], "summary.txt")).read()
    if not slow:
        assert result.details["straggler"] is None and "warnings: 0" in summary, summary
        # a clean run ends with the summary's first line and where the rest is, nothing more
        assert result.message == f"{summary.splitlines()[0]} (all of it: " \
            f"{os.path.join(result.details['run_dir'], 'summary.txt')})", result.message
        return
    assert summary in result.message
    warning = result.details["straggler"]
    assert warning.startswith("smartlaunch: warning: rank 1 computes "), warning
    # rank 1 works 20 + 50 ms per step, rank 0 20 ms (plus a few ms of compute each).
    assert "(host clock, last 3 s)" in warning and "no NVML reading" in warning
    ms = warning.split("slower than the others: ")[1]
    slow_ms, others_ms = float(ms.split(" ms")[0]), float(ms.split("against ")[1].split(" ms")[0])
    assert 45 <= slow_ms - others_ms <= 80, warning
    assert "throughput lost to the straggler" in summary and "warnings: 1" in summary


@pytest.mark.parametrize("asked", [False, True], ids=["default", "flight_recorder"])
def test_flight_recorder_variables_reach_ranks_only_when_asked(out, monkeypatch, tmp_path, asked):
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys\n"
                      "json.dump({k: v for k, v in os.environ.items() if k.startswith('TORCH_')},"
                      " open(os.path.join(os.environ['SLT_OUT'], 'env-' + os.environ['RANK']), 'w'))\n")
    monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "/somewhere/mine_")
    result = launch_ddp(cpu_plan(2), make_request(2, str(script)),
                        make_policy(out.parent / "logs", flight_recorder=asked), cpu_only("t"))
    assert result.state == RunState.SUCCEEDED, result.message
    env = json.loads((out / "env-1").read_text())
    run_dir = result.details["run_dir"]
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/somewhere/mine_"     # the user's, kept
    if not asked:       # as under torchrun: the recorder stays off
        assert not any(k.startswith("TORCH_FR_") for k in env), env
        return
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == os.path.join(run_dir, "flight-recorder", "rank")
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert f"run files (progress, stacks, Flight Recorder, GPU samples): {run_dir}" in result.details["summary"]


def test_hang_report_names_the_collective_a_rank_did_not_enter(clean_env, tmp_path):
    """The watchdog's hang path with real rank processes and the Flight Recorder's protocol
    (FIFO in, pickle out) served by the ranks themselves: no NCCL on a CPU machine."""
    import subprocess
    import time

    from smartlaunch.launch import flightrec
    from smartlaunch.launch.watchdog import Watchdog
    from smartlaunch.launch.worker import worker_env
    from smartlaunch.policy.api import LaunchPolicy
    from helpers_ddp import REPO

    run_dir = str(tmp_path / "run")
    add, fr = flightrec.recorder_env({}, run_dir)
    procs = []
    for r in (0, 1):
        env = {**os.environ, **add, **worker_env(run_dir, "t"), "RANK": str(r), "LOCAL_RANK": str(r),
               "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen([sys.executable, "-m", "smartlaunch.launch.worker",
                                       str(REPO / "tests" / "scripts_ddp" / "fake_fr_rank.py")],
                                      env=env, start_new_session=True))
    policy = LaunchPolicy(hang_timeout_s=1.0, hang_step_multiple=5.0, startup_grace_s=60.0, signal_grace_s=1.0)
    wd = Watchdog(run_dir, 2, policy, "host", flight_recorder=fr)
    try:
        deadline = time.monotonic() + 60
        while wd.hang is None and time.monotonic() < deadline:
            wd.tick()
            time.sleep(0.1)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert wd.hang is not None
    assert wd.hang.rank == 1 and "did not enter a collective" in wd.hang.why, wd.hang
    assert wd.hang.collectives == ("rank 1 did not enter collective #600 (nccl:all_reduce, process group 0); "
                                   "its last was #599, the other ranks entered #600",)
    assert sorted(wd.hang.dump_files) == [os.path.join(run_dir, "flight-recorder", f"rank{r}") for r in (0, 1)]
