"""Runtime diagnosis with real processes (issue 18): 2 gloo ranks under the DDP launcher.

Under synchronous steps both ranks make the same number of steps, so only the work timer can
name the slow one; the control run with equal ranks must stay silent."""
from __future__ import annotations

import json
import os
import signal

import pytest

from smartlaunch.launch.api import RunState
from smartlaunch.launch.ddp import launch_ddp
from smartlaunch.topology.api import cpu_only
from tests.helpers_ddp import alive, cpu_plan, make_policy, make_request, marker_pids

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


@pytest.mark.parametrize("slow", [True, False])
def test_slow_rank_is_named_with_its_slowdown(out, monkeypatch, slow):
    monkeypatch.setenv("SLT_STEPS", "150")
    if slow:
        monkeypatch.setenv("SLT_SLOW_RANK", "1")     # +50 ms before each forward (issue 18's case)
    result = launch_ddp(cpu_plan(2), make_request(2), make_policy(out.parent / "logs", **WINDOW), cpu_only("test"))
    assert result.state == RunState.SUCCEEDED, result.message
    summary = result.details["summary"]
    assert summary.startswith("smartlaunch: summary (succeeded): 150 steps; rank 0: ")
    if not slow:
        assert result.details["straggler"] is None and "warnings: 0" in summary, summary
        return
    warning = result.details["straggler"]
    assert warning.startswith("smartlaunch: warning: rank 1 computes "), warning
    # rank 1 works 20 + 50 ms per step, rank 0 20 ms (plus a few ms of compute each).
    assert "(host clock, last 3 s)" in warning and "no NVML reading" in warning
    ms = warning.split("slower than the others: ")[1]
    slow_ms, others_ms = float(ms.split(" ms")[0]), float(ms.split("against ")[1].split(" ms")[0])
    assert 45 <= slow_ms - others_ms <= 80, warning
    assert "throughput lost to the straggler" in summary and "warnings: 1" in summary


def test_flight_recorder_variables_reach_ranks_and_user_values_stay(out, monkeypatch, tmp_path):
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys\n"
                      "json.dump({k: v for k, v in os.environ.items() if k.startswith('TORCH_')},"
                      " open(os.path.join(os.environ['SLT_OUT'], 'env-' + os.environ['RANK']), 'w'))\n")
    monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "/somewhere/mine_")
    result = launch_ddp(cpu_plan(2), make_request(2, str(script)), make_policy(out.parent / "logs"), cpu_only("t"))
    assert result.state == RunState.SUCCEEDED, result.message
    env = json.loads((out / "env-1").read_text())
    run_dir = result.details["run_dir"]
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/somewhere/mine_"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == os.path.join(run_dir, "flight-recorder", "rank")
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert f"run files (progress, stacks, Flight Recorder, GPU samples): {run_dir}" in result.details["summary"]
