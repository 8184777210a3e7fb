"""One process on one GPU (or the CPU), with torchrun's worker environment contract.

The script's exit code is smartlaunch's (128+N when a signal killed it). Signals reach the
script; after a terminating one, the script gets the policy's grace period before SIGKILL.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from smartlaunch import proc
from smartlaunch.launch.api import LaunchResult, RunState
from smartlaunch.worker_env import narrow_visible, single_rank_env
from smartlaunch.launch.signals import TERMINATING, exit_code_for, forward_signals
from smartlaunch.launch.worker import RUN_DIR_VAR, worker_command, worker_env


def worker_argv(request, python: str = sys.executable) -> list[str]:
    """The wrapped entrypoint (worker hook: dies with smartlaunch, NUMA binding) + script args."""
    return worker_command(request, python) + list(request.script_args)


def single_env(plan, topology, environ=os.environ, extra: dict[str, str] | None = None,
               run_dir: str | None = None) -> dict[str, str]:
    env = dict(environ)
    env.update(plan.env_dict())
    rank_env = single_rank_env()
    env.update(rank_env)
    gpu = plan.gpus[0] if plan.device == "cuda" and plan.gpus else None
    binding = next((b for b in plan.numa if b.gpu == gpu), None)
    env.update(worker_env("", rank_env["TORCHELASTIC_RUN_ID"], [binding] if binding else []))
    # One process has no peer to hang on: no watchdog. A run dir only for a GPU launch, whose
    # step counter gives the measured rate the next plan of this job prefers (measured.py).
    env.pop(RUN_DIR_VAR, None)
    if run_dir:
        env[RUN_DIR_VAR] = run_dir
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = narrow_visible([gpu], environ, topology)
    env.update(extra or {})
    return env


class SingleLauncher:
    def __init__(self, argv: list[str], env: dict[str, str], grace_s: float):
        self.argv, self.env, self.grace_s = argv, env, grace_s
        self.child: proc.Child | None = None
        self._stop_deadline: float | None = None
        self._signal: int | None = None

    def start(self) -> None:
        # Own session: a terminal's Ctrl-C reaches the script once (from us), and close()
        # can end the whole group, DataLoader workers included; the guard ends it when we
        # are SIGKILLed (its DataLoader workers lived on 5-10 s with PDEATHSIG alone).
        self.child = proc.spawn(self.argv, env=self.env, stdin=None)

    def on_signal(self, signum: int) -> None:
        if self.child and self.child.returncode is None:
            self.child.send(signum)
        if signum in TERMINATING and self._stop_deadline is None:
            self._signal = signum
            self._stop_deadline = time.monotonic() + self.grace_s

    def poll(self) -> LaunchResult | None:
        assert self.child is not None
        rc = self.child.returncode
        if rc is None:
            if self._stop_deadline is not None and time.monotonic() > self._stop_deadline:
                self.close(signal.SIGKILL)
            return None
        self.child.reap()           # leftovers of the script's group (grandchildren)
        code = exit_code_for(rc)
        state = RunState.SUCCEEDED if code == 0 else (
            RunState.INTERRUPTED if self._signal else RunState.FAILED)
        return LaunchResult(state, code)

    def close(self, sig: int | None = signal.SIGTERM) -> None:
        if self.child is not None:
            self.child.send(sig or signal.SIGTERM)


def run_single(plan, request, policy, topology) -> int:
    run_dir = None
    if plan.device == "cuda" and not request.no_python:
        run_dir = os.path.join(os.path.expanduser(policy.launch.log_dir),
                               f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        os.makedirs(run_dir, exist_ok=True)
    launcher = SingleLauncher(worker_argv(request), single_env(plan, topology, run_dir=run_dir),
                              policy.launch.signal_grace_s)
    with forward_signals(launcher.on_signal):
        launcher.start()
        while (result := launcher.poll()) is None:
            time.sleep(0.05)
    if run_dir:
        from smartlaunch.launch.measured import record_launch
        record_launch(plan, request, policy, topology, run_dir)
    return result.exit_code
