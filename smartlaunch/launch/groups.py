"""--each packed into DDP groups (decide/pack.py): one DDP job per variant, side by side.

Each group runs as its own child process (`python -m smartlaunch.launch.group_run`: torch's
agent needs its process's main thread and os.environ) that drives the group's launcher through
run_loop as a single DDP launch. The queue is independent.py's, a job being a group with its
own lease; logs: <run dir>/group-<i>.log and the group's own run directory inside the run dir.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import shlex
import subprocess
import time
from collections.abc import Callable

from smartlaunch import proc
from smartlaunch.launch.api import LaunchContext
from smartlaunch.launch.independent import IndependentLauncher, Job, JobState
from smartlaunch.store import open_private

CHILD_MODULE = "smartlaunch.launch.group_run"
RESULT_SUFFIX = ".result.json"


class GroupsLauncher(IndependentLauncher):
    """IndependentLauncher's queue, where a job is a variant's group: a child process that
    runs `make(group_plan, ctx)` (the group's strategy unit's launcher) on its GPUs."""

    NOUN, GPU_COLUMN, HEAD = "group", "GPUs", "groups"

    def __init__(self, plan, ctx: LaunchContext, make: Callable):
        super().__init__(plan, ctx)
        self.make = make                           # pickled by reference into each spec
        self.gpu_mode = False                      # GPUs come by group, not one at a time
        self.plans = {g.variant: plan.group_plan(i) for i, g in enumerate(plan.groups)}
        self.leases: dict[int, object] = {}        # job index -> its group's Lease

    def _acquire_more(self, *, force: bool = False) -> None:
        if not self._due(force):
            return
        for job in self._in(JobState.PENDING):
            if job.index not in self.leases:
                gpus = self.plans[job.index].gpus
                lease = self.ctx.try_hold(gpus, len(gpus))
                if lease is not None:
                    self.leases[job.index] = lease

    def _release_idle_gpus(self) -> None:
        for job in self.jobs:
            if job.state not in (JobState.PENDING, JobState.RUNNING) and job.index in self.leases:
                self.leases.pop(job.index).release()

    def _start_ready(self) -> None:
        for job in self._in(JobState.PENDING):
            if self._stopping:
                return
            if job.index in self.leases:
                self._start(job, None)

    def _hold_first(self) -> None:
        self._acquire_more(force=True)
        if not self.leases and self.jobs:
            index = self.jobs[0].index
            plan = self.plans[index]
            self.leases[index] = self.ctx.hold(plan, len(plan.gpus))

    def poll(self):
        if self._result is None and not self._stopping:
            self._acquire_more()
        return super().poll()

    def _start(self, job: Job, gpu: int | None) -> None:
        ctx, plan = self.ctx, self.plans[job.index]
        spec = os.path.join(self.log_dir, f"group-{job.index}.spec")
        job.log_path = os.path.join(self.log_dir, f"group-{job.index}.log")
        environ = {**ctx.environ, **self._job_vars(job)}
        write_spec(spec, plan, ctx, self.make, job.args, environ, self.log_dir)
        with open_private(job.log_path, "ab") as out:
            job.child = proc.spawn([*proc.python_m(CHILD_MODULE), spec],
                                   env=environ, stdout=out, stderr=subprocess.STDOUT)
        job.state, job.gpu, job.started = JobState.RUNNING, plan.gpus[0], time.monotonic()
        self.log(f"group {job.index} started: {len(plan.gpus)} ranks on GPUs "
                 f"{','.join(map(str, plan.gpus))} (pid {job.child.pid}): "
                 f"{shlex.join(job.args) or '(no variant args)'}; log {job.log_path}")

    def _final(self):
        for job in self.jobs:            # the group's own one-line result, beside its exit code
            result = _read_result(os.path.join(self.log_dir, f"group-{job.index}.spec"))
            if result and job.state != JobState.SUCCEEDED and not job.note:
                job.note = result
        return super()._final()

    def _where(self, j: Job) -> str:
        return ",".join(map(str, self.plans[j.index].gpus))

    def summary(self) -> list[str]:
        return super().summary() + [f"  group {j.index}: {j.note}" for j in self.jobs
                                    if j.note and j.state != JobState.SUCCEEDED]


def write_spec(path: str, plan, ctx: LaunchContext, make: Callable, variant: tuple[str, ...],
               environ: dict[str, str], run_dir: str) -> None:
    """What the group's process needs (group_run.py reads it, then removes it), 0o600: the
    environment may hold secrets. Its own rendezvous: torchrun --standalone's."""
    args = argparse.Namespace(**vars(ctx.torchrun_args)) if ctx.torchrun_args is not None \
        else None
    if args is not None:
        args.training_script_args = [*args.training_script_args, *variant]
        args.standalone = True
    policy = ctx.policy
    policy = dataclasses.replace(policy, launch=dataclasses.replace(policy.launch,
                                                                    log_dir=run_dir))
    spec = {"plan": plan, "policy": policy, "topology": ctx.topology, "environ": environ,
            "torchrun_args": args, "make": make, "result": path + RESULT_SUFFIX}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(spec, f)


def _read_result(spec_path: str) -> str:
    try:
        with open(spec_path + RESULT_SUFFIX) as f:
            return str(json.load(f).get("message", ""))
    except (OSError, ValueError):
        return ""
