"""A dry run as long as its figures need (issue 38, item 2): with `dryrun.precision` the window
ends once its mean step is known to that relative 95% half-width (at least 8 steps and
`measure_seconds`), the warm-up ends once two steps in a row take the same time, and goes on
past a recompile. Only complete marks are read, never with a wait.

A fake device with a step time per step (the host enqueues 1 ms of work per step, the device
runs it for the step's time) drives the Recorder the way a script's optimizer steps do.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_profile import SCRIPTS
from smartlaunch.policy import load_policy
from smartlaunch.profile.api import ModelProfile, ProfileStatus
from smartlaunch.profile.clock import relative_half_width
from smartlaunch.profile.dryrun import PRECISE_STEPS, Recorder
from smartlaunch.profile.runner import _profile, dryrun_env

pytestmark = pytest.mark.timeout(120)


class StepDevice:
    """Each step's work takes its own device time; marks complete once the device is done."""
    name = "fake device"

    def __init__(self, host_step: float = 0.001, lag: bool = False):
        self.host_t, self.busy_until, self.host_step, self.lag = 0.0, 0.0, host_step, lag
        self.reads_before_done = 0

    def now(self) -> float:
        return self.host_t

    def step(self, device_s: float) -> None:
        self.busy_until = max(self.busy_until, self.host_t) + device_s
        self.host_t += self.host_step
        if not self.lag:                 # launch-bound: the host waits for the device
            self.host_t = max(self.host_t, self.busy_until)

    def mark(self):
        return max(self.busy_until, self.host_t)

    def sync(self) -> None:
        self.host_t = max(self.host_t, self.busy_until)

    def done(self, mark) -> bool:
        return mark <= self.host_t

    def seconds(self, a, b) -> float:
        if not (self.done(a) and self.done(b)):
            self.reads_before_done += 1
        return b - a


def drive(rec, dev, times) -> int:
    """Steps with these device times until the Recorder ends the script; steps it ran."""
    for i, t in enumerate(times, 1):
        dev.step(t)
        try:
            rec.on_step()
        except SystemExit:
            return i
    return len(times)


def steady(n: int, step: float = 0.4, wobble: float = 0.005) -> list[float]:
    return [step * (1 + wobble * (-1) ** i) for i in range(n)]


def result(tmp_path) -> dict:
    return json.loads((tmp_path / "p.json").read_text())


def test_a_steady_slow_step_is_known_after_eight_steps_and_two_of_warm_up(tmp_path):
    dev = StepDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=5, measure=20, min_seconds=0.5,
                   clock=dev, precision=0.02)
    ran = drive(rec, dev, [3.0] + steady(60))
    data = result(tmp_path)
    # step 1 (set-up), steps 2 and 3 agree: the window opens at step 3, 8 steps measured
    assert ran == 3 + PRECISE_STEPS
    assert data["reason"] == "measured" and data["precise"] is True
    assert data["steps_measured"] == PRECISE_STEPS
    assert data["step_time_s"] == pytest.approx(0.4, rel=0.01)
    assert data["step_time_ci"] <= 0.02
    assert dev.reads_before_done == 0
    # the runner counts it complete (OK, not INCOMPLETE)
    prof = _profile(None, data, 0, False, 60.0, [], "log", 5.0,
                    echoed=False)
    assert prof.status == ProfileStatus.OK and not prof.low_confidence
    # and it stands for the one-GPU trial of 20 steps: its mean is known as well
    assert prof.trial_rate(20, 0.5, 0.02) == pytest.approx(1 / 0.4, rel=0.01)
    assert prof.trial_rate(20, 0.5, 0.0) is None


def test_without_a_precision_goal_the_counts_are_the_policys(tmp_path):
    dev = StepDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=5, measure=20, min_seconds=0.5, clock=dev)
    ran = drive(rec, dev, [3.0] + steady(60))
    data = result(tmp_path)
    assert ran == 1 + 5 + 20 and data["steps_measured"] == 20 and data["precise"] is False


def test_a_step_that_varies_keeps_measuring_to_measure_steps(tmp_path):
    dev = StepDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=5, measure=20, min_seconds=0.5,
                   clock=dev, precision=0.02)
    wild = [0.4 if i % 3 else 0.9 for i in range(60)]      # a data stall every third step
    drive(rec, dev, [3.0] + wild)
    data = result(tmp_path)
    assert data["steps_measured"] == 20 and data["precise"] is False
    assert data["step_time_ci"] > 0.02


def test_a_short_step_still_measures_the_windows_seconds(tmp_path):
    # 10 ms steps agree to 0.5%: precise after 8, but the window is 0.5 s at least (50 steps)
    dev = StepDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=5, measure=20, min_seconds=0.5,
                   clock=dev, precision=0.02)
    drive(rec, dev, [1.0] + steady(200, 0.01))
    data = result(tmp_path)
    assert 50 <= data["steps_measured"] <= 51 and data["window_s"] >= 0.5


def test_a_recompile_in_the_warm_up_is_left_out_of_the_window(tmp_path):
    # step 1 compiles (5 s), step 2 recompiles (4 s), step 5 recompiles once more (2 s):
    # steps 3 and 4 differ by 25%, so the warm-up runs its 5 steps; at step 6 the last step
    # is steady again and the window opens after it: it holds steady steps only
    dev = StepDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=5, measure=20, min_seconds=0.5,
                   clock=dev, precision=0.02)
    times = [5.0, 4.0, 0.2, 0.25, 2.0, 0.2, 0.2] + steady(60, 0.2)
    ran = drive(rec, dev, times)
    data = result(tmp_path)
    assert ran == 6 + PRECISE_STEPS
    assert data["step_time_s"] == pytest.approx(0.2, rel=0.01)
    assert data["step_time_p90_s"] < 0.21


def test_a_recompile_where_the_warm_up_would_end_extends_it(tmp_path):
    # warm-up of 2; steps vary by 10% (never "the same"), step 3 recompiles: one more step
    dev = StepDevice()
    rec = Recorder(str(tmp_path / "p.json"), warmup=2, measure=10, clock=dev, precision=0.5)
    times = [5.0, 0.2, 1.5] + [0.2 * (1 + 0.1 * (-1) ** i) for i in range(40)]
    drive(rec, dev, times)
    assert rec.t_window is not None
    assert len(rec.warm) == 4             # steps 1-4 warmed; the window opened at step 4


def test_a_device_far_behind_the_host_is_never_read_early(tmp_path):
    # GPU-bound: the host enqueues 1 ms a step, the device takes 0.4 s; no mark completes
    # until a sync, so neither early rule applies: the policy's counts decide
    dev = StepDevice(lag=True)
    rec = Recorder(str(tmp_path / "p.json"), warmup=5, measure=20, min_seconds=0.0,
                   clock=dev, precision=0.02)
    drive(rec, dev, [3.0] + steady(60))
    data = result(tmp_path)
    assert data["steps_measured"] == 20
    assert dev.reads_before_done == 0


def test_relative_half_width():
    assert relative_half_width([1.0]) is None
    assert relative_half_width([1.0, 1.0, 1.0]) == 0.0
    # 8 values, mean 1, sd 0.1: t(7) 2.365 x 0.1 / sqrt(8)
    xs = [0.9, 1.1] * 4
    sd = (sum((x - 1) ** 2 for x in xs) / 7) ** 0.5
    assert relative_half_width(xs) == pytest.approx(2.365 * sd / 8 ** 0.5)


def test_a_real_script_with_a_slow_step_ends_its_dry_run_early(clean_env):
    """python -m smartlaunch.profile.dryrun as the runner starts it, on a script whose step
    is a 60 ms sleep: the window closes at 8 steps, not the 20 asked."""
    out = clean_env / "profile.json"
    pol = load_policy(None, environ={})
    cmd = [sys.executable, "-m", "smartlaunch.profile.dryrun", "--out", str(out),
           "--warmup", str(pol.dryrun.warmup_steps), "--measure", "20", "--min-seconds", "0.3",
           "--precision", "0.1", str(SCRIPTS / "feedback_train.py"), "--steps", "200"]
    env = {**dryrun_env(os.environ, None, str(clean_env)), "SLEEP_MS": "60", "WORLD_SIZE": "1",
           "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _free_port()}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100,
                          cwd=clean_env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["reason"] == "measured" and data["precise"] is True, data
    assert PRECISE_STEPS <= data["steps_measured"] < 20
    assert data["step_time_s"] >= 0.06 and data["step_time_ci"] <= 0.1
    assert data["steps_seen"] < 1 + pol.dryrun.warmup_steps + 20
    prof = ModelProfile.from_dict({**{k: v for k, v in data.items()}, "status": "ok"})
    assert prof.step_time_ci == data["step_time_ci"]


def _free_port() -> str:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])
