"""The dry run's measurement window: device time, closed by a sync however the script ends.

A fake device clock (injected into the Recorder) completes each step's work later than the
host reaches the step's end, the way a CPU runs ahead of the GPU it enqueues kernels for:
host intervals of 1 ms, device steps of 4 ms (issue 15's wide MLP read 1.83 ms against 4.0 ms).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers_profile import SCRIPTS
from smartlaunch.profile.api import ModelProfile, ProfileStatus
from smartlaunch.profile.dryrun import Recorder
from smartlaunch.profile.runner import dryrun_env

pytestmark = pytest.mark.timeout(120)

HOST_STEP, DEVICE_STEP = 0.001, 0.004


class FakeDevice:
    """Marks complete when the work queued before them is done; reading a mark that has not
    completed (no sync yet) fails the test."""
    name = "fake device"

    def __init__(self, host_step=HOST_STEP, device_step=DEVICE_STEP):
        self.host_step, self.device_step = host_step, device_step
        self.host_t = 0.0
        self.busy_until = 0.0
        self.syncs = 0

    def now(self) -> float:
        return self.host_t

    def step(self) -> None:
        # the host enqueues the step's work as it goes: the device starts it at once
        self.busy_until = max(self.busy_until, self.host_t) + self.device_step
        self.host_t += self.host_step

    def mark(self):
        return max(self.busy_until, self.host_t)

    def sync(self) -> None:
        self.syncs += 1
        self.host_t = max(self.host_t, self.busy_until)

    def done(self, mark) -> bool:
        return mark <= self.host_t

    def seconds(self, a, b) -> float:
        assert self.done(a) and self.done(b), "a mark was read before the device finished it"
        return b - a


def run_steps(rec, dev, n):
    for _ in range(n):
        dev.step()
        rec.on_step()


def test_window_complete_is_device_time(tmp_path):
    dev = FakeDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=2, measure=20, clock=dev)
    run_steps(rec, dev, 2 + 1 + 19)
    with pytest.raises(SystemExit):
        run_steps(rec, dev, 1)
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["reason"] == "measured" and data["steps_measured"] == 20
    assert data["step_time_s"] == pytest.approx(DEVICE_STEP)
    assert data["window_cut_short"] is False and data["timing"] == "fake device"


@pytest.mark.parametrize("host_ms, device_ms, slack_ms", [
    (1.0, 4.0, 3.0 * 10.5),     # device-bound: the host is 3 ms further ahead at each step end
    (4.0, 1.0, 0.0),            # launch-bound: the device waits on the host
])
def test_window_reports_how_far_the_host_runs_ahead_of_the_device(tmp_path, host_ms, device_ms,
                                                                  slack_ms):
    dev = FakeDevice(host_ms / 1e3, device_ms / 1e3)
    rec = Recorder(str(tmp_path / "p.json"), warmup=2, measure=20, clock=dev)
    run_steps(rec, dev, 2 + 1 + 19)
    with pytest.raises(SystemExit):
        run_steps(rec, dev, 1)
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["step_time_s"] == pytest.approx(max(host_ms, device_ms) / 1e3)
    # the median of 3, 6, ... 60 ms ahead over the window's 20 step ends
    assert data["host_slack_s"] == pytest.approx(slack_ms / 1e3)
    assert ModelProfile.from_dict({"status": "ok", **{k: v for k, v in data.items()
                                   if k in ("step_time_s", "host_slack_s")}}).host_slack_s \
        == pytest.approx(slack_ms / 1e3)


def test_split_from_warm_up_marks_scaled_to_the_window(tmp_path):
    # Forward 1 ms, backward 2 ms, optimizer 1 ms of each 4 ms device step, marked in the
    # warm-up; the window itself runs with no hook but the step's.
    dev = FakeDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=3, measure=5, clock=dev)
    run_steps(rec, dev, 1)
    for _ in range(3):
        assert rec.splitting()
        dev.step()
        t = dev.mark() - DEVICE_STEP
        rec.cur += [("forward", t, t + 0.001), ("backward", t + 0.001, t + 0.003)]
        rec.on_step()
    assert not rec.splitting() and rec.handles == []
    run_steps(rec, dev, 4)
    with pytest.raises(SystemExit):
        run_steps(rec, dev, 1)
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["forward_s"] == pytest.approx(0.001)
    assert data["backward_s"] == pytest.approx(0.002)
    assert data["optimizer_s"] == pytest.approx(0.001)


@pytest.mark.parametrize("measured", [1, 6])
def test_script_ending_early_still_reports_device_time(tmp_path, measured):
    dev = FakeDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=2, measure=20, clock=dev)
    run_steps(rec, dev, 2 + 1 + measured)
    syncs = dev.syncs
    rec.write()            # what atexit / the runner's finally do when the script returns
    assert dev.syncs == syncs + 1, "the window was not closed by a device sync"
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["steps_measured"] == measured
    assert data["step_time_s"] == pytest.approx(DEVICE_STEP)   # not the 1 ms host interval
    assert data["step_time_p90_s"] == pytest.approx(DEVICE_STEP)
    assert data["window_cut_short"] is True
    prof = ModelProfile(ProfileStatus.OK, **{k: data[k] for k in
                                              ("step_time_s", "steps_measured", "window_cut_short")})
    assert prof.low_confidence


def test_time_limit_reads_only_finished_marks_without_waiting(tmp_path):
    dev = FakeDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=1, measure=50, clock=dev)
    run_steps(rec, dev, 1 + 1 + 8)
    syncs = dev.syncs
    rec.write(reason="signal")   # SIGTERM: the GPU may be what hangs, so no sync
    assert dev.syncs == syncs
    data = json.loads((tmp_path / "p.json").read_text())
    assert 0 < data["steps_measured"] < 8
    assert data["step_time_s"] == pytest.approx(DEVICE_STEP)
    assert data["window_cut_short"] is True


def test_no_window_no_step_time(tmp_path):
    dev = FakeDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=5, measure=20, clock=dev)
    run_steps(rec, dev, 3)       # the script ended inside the warm-up
    rec.write()
    data = json.loads((tmp_path / "p.json").read_text())
    assert "step_time_s" not in data and data["steps_measured"] == 0
    assert data["window_cut_short"] is False


@pytest.mark.parametrize("end", ["return", "exit", "raise"])
def test_real_script_ending_inside_the_window(clean_env, end):
    out = clean_env / "profile.json"
    cmd = [sys.executable, "-m", "smartlaunch.profile.dryrun", "--out", str(out),
           "--warmup", "1", "--measure", "50", str(SCRIPTS / "batch_shapes.py"),
           "--steps", "6", "--end", end]
    proc = subprocess.run(cmd, env=dryrun_env(os.environ, None, str(clean_env)),
                          capture_output=True,
                          text=True, timeout=100)
    assert proc.returncode == (1 if end == "raise" else 0), proc.stderr
    data = json.loads(out.read_text())
    assert data["reason"] == "exit"
    assert data["steps_measured"] == 6 - 2       # step 1 warm-up, step 2 opens the window
    assert data["window_cut_short"] is True and data["timing"] == "host clock"
    assert data["step_time_s"] > 0 and data["forward_s"] > 0 and data["backward_s"] > 0
    if end == "raise":
        assert "the script failed after its steps" in proc.stderr


def test_a_window_with_one_stall_reports_its_median_and_longest_step_beside_the_mean():
    from smartlaunch.profile.clock import read_window

    class HostClock:
        name = "host"

        @staticmethod
        def seconds(a, b):
            return b - a
    # three 10 ms steps and one 200 ms stall (a lazy connection set up mid-window)
    out = read_window(HostClock, [0.0, 0.01, 0.02, 0.03, 0.23], [], [])
    assert out["step_time_s"] == pytest.approx(0.0575)
    assert out["step_time_median_s"] == pytest.approx(0.01)
    assert out["step_time_max_s"] == pytest.approx(0.2)


@pytest.mark.parametrize("script", ["compiled_graphs.py", "compiled_in_place.py"])
def test_a_compiled_model_is_traced_once_and_its_batch_found(clean_env, script):
    """The discovery hooks are global module hooks, which torch.compile guards on: removing them
    after the first step would retrace every graph in the dry run (and in every trial). A model
    compiled in place is called only inside what torch.compile runs: still found."""
    out = clean_env / "profile.json"
    cmd = [sys.executable, "-m", "smartlaunch.profile.dryrun", "--out", str(out),
           "--warmup", "1", "--measure", "50", str(SCRIPTS / script)]
    proc = subprocess.run(cmd, env=dryrun_env(os.environ, None, str(clean_env)),
                          capture_output=True,
                          text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr
    if script == "compiled_graphs.py":
        assert "graphs=1" in proc.stdout, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["batch_size"] == 8 and data["steps_measured"] == 12 - 2
    assert data["forward_s"] > 0 and data["backward_s"] > 0
