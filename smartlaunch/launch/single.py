"""One process on one GPU (or the CPU), with torchrun's worker environment contract; its exit
code is smartlaunch's (128+N when signal N killed it)."""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time

from smartlaunch import proc
from smartlaunch.launch.api import LaunchContext, LaunchResult, RunState
from smartlaunch.worker_env import narrow_visible, single_rank_env
from smartlaunch.launch.signals import TERMINATING, exit_code_for, killed_line
from smartlaunch.topology import sharing
from smartlaunch.launch.summary import single_summary, write_summary
from smartlaunch.launch.worker import RUN_DIR_VAR, stack_path, worker_command, worker_env


def job_env(plan, topology, environ, gpu: int | None, rank_env: dict[str, str],
            run_dir: str | None = None) -> dict[str, str]:
    """A one-rank worker's environment: torchrun's (rank_env), the hook's (its step counter
    only where run_dir is given), its GPU's NUMA binding and CUDA_VISIBLE_DEVICES."""
    binding = plan.binding(gpu)
    env = {**environ, **plan.env_dict(), **rank_env, **worker_env(
        "", rank_env["TORCHELASTIC_RUN_ID"], [binding] if binding else [])}
    env.pop(RUN_DIR_VAR, None)
    if run_dir:
        env[RUN_DIR_VAR] = run_dir
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = narrow_visible([gpu], environ, topology)
    return env


class SingleLauncher:
    """The Launcher (launch/api.py) of one process."""

    def __init__(self, plan, ctx: LaunchContext):
        self.plan, self.ctx = plan, ctx
        self.child: proc.Child | None = None
        self.run_dir: str | None = None
        self.counted = False                   # the worker hook counts its steps
        self._started = 0.0
        self._stop_deadline: float | None = None
        self._signal: int | None = None
        self._result: LaunchResult | None = None
        self._readings = None                  # its GPU's processes, while it runs
        self._looked = float("-inf")
        self.shared: str | None = None         # others first seen on its GPU

    def start(self) -> None:
        plan, ctx = self.plan, self.ctx
        if plan.device == "cuda" and plan.gpus:
            lease = ctx.hold(plan, 1)          # may be one of the plan's fallback GPUs
            if lease.gpus != plan.gpus[:1]:
                self.plan = plan = dataclasses.replace(plan, gpus=lease.gpus)
            # steps are counted for a GPU launch of Python only: counting imports torch
            self.counted = plan.command[:1] != ("--no-python",)
            if self.counted:
                from smartlaunch.topology import live_readings
                self._readings = live_readings(ctx.environ)
        ctx.begin(plan)
        self.run_dir = ctx.new_run_dir()
        gpu = plan.gpus[0] if plan.device == "cuda" and plan.gpus else None
        env = job_env(plan, ctx.topology, ctx.environ, gpu,
                      single_rank_env(os.path.join(self.run_dir, "error.json")),
                      run_dir=self.run_dir if self.counted else None)
        self._started = time.monotonic()
        self.child = proc.spawn(worker_command(plan.command, sys.executable), env=env, stdin=None)
        if self._signal is not None:       # it arrived between begin() and the spawn
            self.child.send(self._signal)

    def forward(self, signum: int) -> None:
        if self.child and self.child.returncode is None:
            self.child.send(signum)
        if signum in TERMINATING and self._stop_deadline is None:
            self._signal = signum
            self._stop_deadline = time.monotonic() + self.ctx.signal_grace_s

    def poll(self) -> LaunchResult | None:
        if self._result is not None or self.child is None:
            return self._result
        rc = self.child.returncode
        if rc is None:
            if self._stop_deadline is not None and time.monotonic() > self._stop_deadline:
                self.child.send(signal.SIGKILL)
            self._look()
            return None
        self.child.reap()           # leftovers of the script's group (grandchildren)
        self._look(last=True)
        code = exit_code_for(rc)
        state = RunState.SUCCEEDED if code == 0 else (
            RunState.INTERRUPTED if self._signal else RunState.FAILED)
        said = "" if self._signal else killed_line(
            rc, stack_path(self.run_dir, 0) if self.run_dir else None)
        self._result = LaunchResult(state, code, said)
        profile = self.plan.profile
        write_summary(self.run_dir, single_summary(
            state.value, code, time.monotonic() - self._started, self.run_dir,
            batch=profile.batch_size if profile is not None else None))
        if self.counted:
            self.ctx.record(self.plan, self.run_dir, self.shared)
        return self._result

    def _look(self, last: bool = False) -> None:
        """Every launch.gpu_sample_s and once at the end: processes on the job's GPU that it
        did not start (its rate is then not kept; launch/measured.py)."""
        now = time.monotonic()
        if self._readings is None or (not last and now - self._looked < self.ctx.policy.launch.gpu_sample_s):
            return
        self._looked = now
        self.shared = self.shared or sharing(self.ctx.topology, self.plan.gpus[:1],
                                             self.ctx.environ, self._readings)
        if last:
            self._readings.close()
            self._readings = None

    def close(self, sig: int = signal.SIGTERM) -> None:
        if self.child is not None and self._result is None:
            self._signal = self._signal or sig
            self.child.stop(sig, self.ctx.signal_grace_s)
            self.poll()
        if self._readings is not None:
            self._readings.close()
            self._readings = None
