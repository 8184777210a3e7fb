"""run_loop.run drives any Launcher (launch/api.py): real signals to this process, real leases
held by another process, a launcher that records what the loop asked of it."""
from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest

import helpers_jobs as H
from smartlaunch.decide.plan import Plan, Strategy
from smartlaunch.launch.api import LaunchContext, LaunchResult, RunState
from smartlaunch.launch.leases import LeaseManager
from smartlaunch.launch.run_loop import run, run_result
from smartlaunch.launch.single import SingleLauncher


class Recording:
    """A launcher whose workers are imaginary: poll() runs `steps` (callables) one per call."""

    def __init__(self, steps=(), code: int = 0):
        self.steps, self.code, self.calls = list(steps), code, []

    def start(self):
        self.calls.append("start")

    def poll(self):
        self.calls.append("poll")
        if self.steps:
            self.steps.pop(0)()
            return None
        return LaunchResult(RunState.SUCCEEDED, self.code, "smartlaunch: done")

    def forward(self, signum):
        self.calls.append(signal.Signals(signum).name)

    def close(self, sig):
        self.calls.append(f"close {signal.Signals(sig).name}")


def _ctx(tmp, topo=None) -> LaunchContext:
    return LaunchContext(H.policy(tmp), topo or H.fake_topology(2), environ=dict(os.environ))


def test_every_signal_reaches_the_launcher_and_only_terminating_ones_are_kept(clean_env, capsys):
    me = os.getpid()
    launcher = Recording([lambda: os.kill(me, signal.SIGUSR1), lambda: os.kill(me, signal.SIGTERM)],
                         code=3)
    ctx = _ctx(clean_env)
    before = signal.getsignal(signal.SIGTERM)
    assert run(launcher, ctx) == 3
    assert launcher.calls[:2] == ["start", "poll"] and "SIGUSR1" in launcher.calls
    assert launcher.calls.index("SIGTERM") > launcher.calls.index("SIGUSR1")
    assert launcher.calls[-1] == "close SIGTERM"           # the no-op close after the end
    assert ctx.signals == [signal.SIGTERM]
    assert capsys.readouterr().err == "smartlaunch: done\n"
    assert signal.getsignal(signal.SIGTERM) == before        # handlers put back


def test_an_exception_closes_the_launcher_and_passes_through(clean_env):
    def boom():
        raise RuntimeError("launcher bug")
    launcher = Recording([boom])
    with pytest.raises(RuntimeError, match="launcher bug"):
        run_result(launcher, _ctx(clean_env))
    assert launcher.calls == ["start", "poll", "close SIGTERM"]


@pytest.mark.timeout(60)
def test_a_signal_while_waiting_for_gpus_exits_128_plus_n_and_starts_nothing(clean_env, capsys):
    topo = H.fake_topology(2)
    holder = H.write_script(clean_env, "holder.py", H.LEASE_HOLDER)
    ready = clean_env / "ready"
    p = subprocess.Popen([H.PY, holder, H.write_topology(clean_env / "t.json", topo), str(ready), "0,1"],
                         env=H.python_env())
    marker = clean_env / "ran"
    script = H.write_script(clean_env, "job.py", f"open({str(marker)!r}, 'w').close()\n")
    plan = Plan(Strategy.SINGLE, "cuda", (0,), 1, 2, fallback_gpus=(1,), command=(script,))
    ctx = _ctx(clean_env, topo)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    try:
        H.wait_for(ready)
        timer.start()
        rc = run(SingleLauncher(plan, ctx), ctx)
    finally:
        timer.cancel()
        p.kill()
        p.wait()
    err = capsys.readouterr().err
    assert rc == 128 + signal.SIGINT, err
    assert "waiting for 1 free GPU(s) of 0,1" in err and "got SIGINT while waiting for GPUs" in err
    assert not marker.exists()
    assert LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]).taken(topo) == set()


class Holding:
    """A launcher that leases GPU 0 through the context, then does what `then` says."""

    def __init__(self, ctx, then):
        self.ctx, self.then, self.calls = ctx, then, []
        self.plan = Plan(Strategy.SINGLE, "cuda", (0,), 1, 2)

    def start(self):
        self.ctx.hold(self.plan, 1)
        self.then()
        self.ctx.begin(self.plan)
        self.calls.append("begun")

    def poll(self):
        raise RuntimeError("launcher bug")

    def forward(self, signum):
        pass

    def close(self, sig):
        self.calls.append("close")


def test_the_lease_is_given_back_once_on_an_exception_and_on_a_signal_before_start(clean_env, capsys):
    topo = H.fake_topology(2)
    taken = lambda: LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]).taken(topo)  # noqa: E731
    ctx = _ctx(clean_env, topo)
    held = []
    launcher = Holding(ctx, lambda: held.append(taken()))
    with pytest.raises(RuntimeError, match="launcher bug"):
        run_result(launcher, ctx)
    assert held == [{0}] and launcher.calls == ["begun", "close"] and taken() == set()

    # a signal after the GPU was leased, before the workers start: nothing starts, 128+N
    ctx = _ctx(clean_env, topo)
    announced = []
    ctx.announce = announced.append
    launcher = Holding(ctx, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert run(launcher, ctx) == 128 + signal.SIGTERM
    assert launcher.calls == ["close"] and announced == [] and taken() == set()
    assert capsys.readouterr().err == ("smartlaunch: got SIGTERM while waiting for GPUs; nothing "
                                       "was started (exit 143)\n")
