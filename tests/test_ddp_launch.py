"""DDP launch behaviour with real processes: gloo on CPU, 2 ranks, one misbehaving.

Each test asserts the exit code, a time bound measured from the misbehaviour (the script
leaves a `fault-<pid>` marker just before it), and that no process it started is left.
Policy timeouts are short (helpers_ddp.FAST) so the area stays within the CI limit.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_launch import launch_ddp
from smartlaunch.launch.api import RunState
from smartlaunch.topology.api import cpu_only
from helpers_ddp import (FAST, SCRIPT, alive, cpu_plan, launcher_argv, make_policy,
                               make_request, marker_pids, wait_for, wait_gone)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def out(clean_env, monkeypatch):
    d = clean_env / "out"
    d.mkdir()
    monkeypatch.setenv("SLT_OUT", str(d))
    yield d
    # Whatever happened, leave nothing behind for the next test.
    for pid in alive(marker_pids(d)):
        os.kill(pid, signal.SIGKILL)


def launch(tmp: Path, nproc: int = 2):
    t0 = time.monotonic()
    result = launch_ddp(cpu_plan(nproc), make_request(nproc), make_policy(tmp / "logs"), cpu_only("test"))
    return result, time.monotonic(), t0


def fault_time(out: Path) -> float:
    """The fault marker's mtime, on the monotonic clock."""
    marker = next(out.glob("fault-*"))
    return time.monotonic() - (time.time() - marker.stat().st_mtime)


def test_rank_sigkill_stops_the_others_in_time(out, monkeypatch):
    monkeypatch.setenv("SLT_FAULT", "kill")
    monkeypatch.setenv("SLT_WORKERS", "2")          # DataLoader workers must go too
    result, done, _ = launch(out.parent)
    assert result.exit_code == 1 and result.state == RunState.FAILED
    root = result.failures[0]
    assert (root.rank, root.signal) == (1, "SIGKILL")
    assert "rank 1" in result.message and "SIGKILL" in result.message
    assert done - fault_time(out) < FAST["rank_failure_timeout_s"]
    assert len(marker_pids(out, "loader")) >= 2
    assert wait_gone(marker_pids(out), 1.0) == []


def test_exception_in_rank1_exits_like_torchrun(out, monkeypatch):
    monkeypatch.setenv("SLT_FAULT", "raise")
    env = {**os.environ, "SLT_OUT": str(out / "torchrun")}
    (out / "torchrun").mkdir()
    torchrun = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                 SCRIPT], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result, done, _ = launch(out.parent)
        assert result.exit_code == 1
        assert result.failures[0].rank == 1 and result.failures[0].exit_code == 1
        assert "injected failure in rank 1" in result.failures[0].log_tail
        assert done - fault_time(out) < FAST["rank_failure_timeout_s"]
        assert wait_gone(marker_pids(out), 1.0) == []
        assert torchrun.wait(timeout=90) == result.exit_code
    finally:
        torchrun.kill()
        torchrun.wait()
        for pid in alive(marker_pids(out / "torchrun")):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("fault, why", [("stop", "stopped"), ("loop", "own code")])
def test_hang_dumps_stacks_names_the_rank_and_exits_8(out, monkeypatch, fault, why):
    monkeypatch.setenv("SLT_FAULT", fault)
    result, done, _ = launch(out.parent)
    assert result.exit_code == 8 and result.state == RunState.HUNG, result.message
    hang = result.details["hang"]
    assert hang.local_rank == 1 and why in hang.why
    assert "train_gloo.py" in (hang.where or "") and "misbehave" in hang.where
    for f in hang.stack_files:
        assert "most recent call first" in Path(f).read_text()
    bound = FAST["hang_timeout_s"] + FAST["signal_grace_s"] + 4.0   # + stack dump and poll
    assert done - fault_time(out) < bound
    assert wait_gone(marker_pids(out), 1.0) == []


def _start_launcher(out: Path, workers: int):
    env = {**os.environ, "SLT_WORKERS": str(workers)}
    p = subprocess.Popen(launcher_argv(out.parent / "logs"), env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(marker_pids(out, "rank")) == 2 and len(marker_pids(out, "loader")) >= 2 * workers,
             60, "both ranks (and their DataLoader workers) running")
    time.sleep(0.5)                                    # a few training steps in
    return p


@pytest.mark.slow
def test_sigkill_of_launcher_leaves_no_rank_or_dataloader_worker(out):
    p = _start_launcher(out, workers=2)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert wait_gone(marker_pids(out), 5.0) == []


@pytest.mark.slow
def test_sigterm_of_launcher_is_forwarded_and_exits_143(out):
    p = _start_launcher(out, workers=0)
    t = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM, p.stderr.read()
    assert time.monotonic() - t < FAST["signal_grace_s"] + 3.0
    assert "SIGTERM" in p.stderr.read()
    assert wait_gone(marker_pids(out), 1.0) == []
